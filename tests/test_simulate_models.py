"""The draft-model proposer of the simulator against a straightforward reference, on real greedy outputs.

The simulator computes the draft model's candidates teacher-forced, one forward pass per request
(analysis/simulate/model_worker.py) and replays chains from them. The reference below does what vLLM's
drafter does, the slow way: at every step it lets models/tiny-draft generate k tokens greedily from the
context, one full forward pass per token, compares them with the captured output and moves on. The two
must count the same drafts, draft tokens and accepted tokens per position.

Runs the models in a Python with torch and transformers (the engine's venv here); skipped where there is
none. Fixture: tests/fixtures/simulate/greedy.json (six prompts of workloads/capture.jsonl with
tiny-target's greedy outputs, as vLLM served them)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from analysis.simulate.models import ModelWorkerError, model_python
from analysis.simulate.replay import Request
from analysis.simulate.run import DrafterSettings, simulate_shapes
from analysis.simulate.shapes import parse_shape

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "simulate" / "greedy.json"
K = 3

REFERENCE = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM

job = json.load(sys.stdin)
torch.set_num_threads(1)
model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32).eval()
k = job["k"]
drafts = draft_tokens = accepted = 0
per_position = [0] * k
with torch.no_grad():
    for req in job["requests"]:
        prompt, output = req["prompt"], req["output"]
        t = 1                                     # the prefill emitted output[0]
        while t < len(output):
            context = prompt + output[:t]
            draft = []
            for _ in range(k):                    # greedy, one full forward per draft token
                logits = model(input_ids=torch.tensor([context + draft])).logits[0, -1]
                draft.append(int(torch.argmax(logits)))
            a = 0
            while a < k and t + a < len(output) and draft[a] == output[t + a]:
                a += 1
            drafts, draft_tokens, accepted = drafts + 1, draft_tokens + k, accepted + a
            for i in range(a):
                per_position[i] += 1
            t += a + 1
print(json.dumps({"drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "per_position": per_position}))
"""


def fixture_requests() -> list[Request]:
    rows = json.loads(FIXTURE.read_text())["requests"]
    return [
        Request(r["request_id"], r["stratum"], tuple(r["prompt"]), tuple(r["output"]))
        for r in rows
        if len(r["prompt"]) < 100  # the summarization prompts are long: the slow reference skips them
    ]


@pytest.fixture(scope="module")
def python() -> Path:
    try:
        return model_python()
    except ModelWorkerError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    """An empty SPECGAUGE_HOME: no cached worker answer, so the model worker really runs."""
    from specgauge.settings import get_settings

    monkeypatch.setenv("SPECGAUGE_HOME", str(tmp_path))
    get_settings.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    get_settings.cache_clear()


def test_draft_model_chain_equals_drafting_step_by_step(python, fresh_home, tmp_path):
    requests = fixture_requests()
    assert len(requests) == 4
    job = {
        "model": str(REPO / "models" / "tiny-draft"),
        "k": K,
        "requests": [{"prompt": list(r.prompt), "output": list(r.output)} for r in requests],
    }
    done = subprocess.run(
        [str(python), "-c", REFERENCE], input=json.dumps(job), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reference = json.loads(done.stdout)

    from analysis.simulate.captures import CaptureInput
    from artifacts.documents.captures import Capture

    item = CaptureInput(
        capture=Capture(path=tmp_path, meta={"capture_id": "fixture"}, outputs=()),
        requests=tuple(requests),
        target_dir=REPO / "models" / "tiny-target",
    )
    shape = parse_shape(f"chain:k={K}@draft")[0]
    (result,) = simulate_shapes(item, [shape], DrafterSettings(dtype="float32"))
    got = result.total()
    assert reference["drafts"] > 0 and reference["accepted"] > 0  # the check means something
    assert (got.drafts, got.draft_tokens, got.accepted) == (
        reference["drafts"],
        reference["draft_tokens"],
        reference["accepted"],
    )
    assert got.accepted_per_position + [0] * (K - len(got.accepted_per_position)) == reference["per_position"]
