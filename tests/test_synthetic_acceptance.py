"""Synthetic acceptance on the embedded engine (patches/cpu-synthetic-acceptance.patch, mounted by the local
launcher's `patches`): the patched CPU kernels follow vLLM's Triton rule exactly, a spec that needs the
overlay says so before anything launches, and on the real engine the measured mean acceptance length is the
configured one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from experiments.spec import SLO, LoadSpec, LocalLaunchSpec, Sampling, TargetSpec, Variant, parse_spec
from specgauge.errors import SpecError
from tasks.launch.overlay import LOCAL_OVERLAY_SITE, engine_overlay

REPO = Path(__file__).resolve().parent.parent
ENGINE_PYTHON = REPO / ".engine-venv" / "bin" / "python"
needs_engine_venv = pytest.mark.skipif(
    not ENGINE_PYTHON.exists(), reason="needs the engine venv (make engine)"
)

# Three requests of three drafts each, one uniform draw per draft, conditional rates [1.0, 0.5, 0.0]:
# request 0 accepts position 0 (1.0 always), position 1 (0.3 < 0.5), rejects position 2 (rate 0);
# request 1 accepts 0, rejects 1 (0.7 >= 0.5); request 2's second draft is padding (-1): rejected.
PROBE = """
import json, torch
from vllm.utils import cpu_triton_utils as k
drafts = torch.tensor([11, 12, 13, 21, 22, 23, 31, -1, 33])
argmax = torch.tensor([91, 92, 93, 94, 95, 96, 97, 98, 99])
uniform = torch.tensor([0.9, 0.3, 0.1, 0.2, 0.7, 0.1, 0.5, 0.1, 0.1], dtype=torch.float64)
rates = torch.tensor([1.0, 0.5, 0.0])
out = torch.full((3, 4), -1, dtype=torch.int32)
k._rejection_greedy_sample_kernel_impl(out, torch.tensor([3, 6, 9]), drafts, argmax, torch.tensor([[7], [8], [9]]),
    None, 3, uniform_probs=uniform, synthetic_conditional_rates=rates, SYNTHETIC_MODE=True)
mixed = torch.full((3, 4), -1, dtype=torch.int32)
is_greedy = torch.tensor([True, False, True])
k._rejection_greedy_sample_kernel_impl(mixed, torch.tensor([3, 6, 9]), drafts, argmax, torch.tensor([7, 8, 9]),
    is_greedy, 3, uniform_probs=uniform, synthetic_conditional_rates=rates, SYNTHETIC_MODE=True)
k._rejection_random_sample_kernel_impl(mixed, torch.tensor([3, 6, 9]), drafts, None, None, torch.tensor([7, 8, 9]),
    argmax + 100, uniform, is_greedy, 3, 1000, synthetic_conditional_rates=rates, SYNTHETIC_MODE=True)
print(json.dumps({"file": k.__file__, "greedy": out.tolist(), "mixed": mixed.tolist()}))
"""


@needs_engine_venv
def test_the_patched_cpu_kernels_follow_the_synthetic_rule(tmp_path: Path) -> None:
    overlay = engine_overlay(ENGINE_PYTHON, ["cpu-synthetic-acceptance"], tmp_path / "home")
    env = {**os.environ, "PYTHONPATH": str(LOCAL_OVERLAY_SITE), "SPECGAUGE_OVERLAY": overlay.root}
    done = subprocess.run(
        [str(ENGINE_PYTHON), "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(overlay.root)  # the overlay's copy was imported, not the installed one
    assert result["greedy"] == [[11, 12, 93, -1], [21, 95, -1, -1], [31, 98, -1, -1]]
    # request 1 is random: the random kernel takes it, and a rejected position gets the recovered token
    assert result["mixed"] == [[11, 12, 93, -1], [21, 195, -1, -1], [31, 98, -1, -1]]
    # the same overlay is reused, not rebuilt
    assert engine_overlay(ENGINE_PYTHON, ["cpu-synthetic-acceptance"], tmp_path / "home").root == overlay.root


def test_a_synthetic_variant_on_the_embedded_engine_needs_the_overlay() -> None:
    variants = [
        {"name": "plain", "method": "none"},
        {"name": "syn", "method": "ngram", "k": 3, "synthetic_acceptance_length": [1.5, 2.5]},
    ]
    data = {
        "name": "syn",
        "target": {"model": "models/tiny-target"},
        "variants": variants,
        "workloads": [{"file": "workloads/smoke.jsonl"}],
        "load": {"concurrencies": [1]},
        "validity": {"aa_control": False},
    }
    with pytest.raises(SpecError, match=r"launcher.patches: \[cpu-synthetic-acceptance\]"):
        parse_spec(data)
    spec = parse_spec({**data, "launcher": {"kind": "local", "patches": ["cpu-synthetic-acceptance"]}})
    assert [v.name for v in spec.variants] == ["plain", "syn-L1.5", "syn-L2.5"]
    assert spec.variants[2].speculative_config() == {
        "num_speculative_tokens": 3,
        "method": "ngram",
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.5,
    }
    from experiments.plan import plan_campaign

    plan = plan_campaign(spec)  # lossy by design: measured, not captured or gated
    assert plan.gate is not None and plan.gate.treatments == ()
    assert all(not d.captures for d in plan.deployments if d.variant.name.startswith("syn"))
    with pytest.raises(SpecError, match="synthetic_acceptance_length must be between 1 and k\\+1 \\(4\\)"):
        parse_spec({**data, "variants": [variants[0], {**variants[1], "synthetic_acceptance_length": 4.5}]})


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_measured_acceptance_is_the_configured_one_on_the_engine(engine_lock: None, tmp_path: Path) -> None:
    from experiments.plan import CellPlan
    from tasks.cell import run_cell
    from tasks.health import wait_ready
    from tasks.launch.local import LocalLauncher
    from workloads.schema import load_corpus

    length = 2.5  # k=3: every draft's first token accepted, its second half the time, never the third
    target = TargetSpec(
        model=str(REPO / "models" / "tiny-target"), served_model_name="tiny", max_model_len=2048
    )
    variant = Variant(
        name="draft-k3-L2.5",
        method="draft_model",
        k=3,
        draft_model=str(REPO / "models" / "tiny-draft"),
        synthetic_acceptance_length=length,
    )
    # eager: this start's step time is not what the test reads
    launcher = LocalLauncher(LocalLaunchSpec(compilation="eager", patches=("cpu-synthetic-acceptance",)))
    deployment = launcher.launch(target, variant, deployment_id="synthetic.r0", directory=tmp_path / "dep")
    try:
        wait_ready(deployment, launcher, timeout_s=600)
        outcome = run_cell(
            deployment,
            CellPlan("draft-k3-L2.5.r0.code.c4", "code", "closed", 4, None, "workloads/smoke.jsonl"),
            campaign_id="synthetic",
            repeat=0,
            corpus=load_corpus(REPO / "workloads" / "smoke.jsonl"),
            sampling=Sampling(max_tokens=128, ignore_eos=True),
            load=LoadSpec(
                concurrencies=(4,), requests=12, warmup=1, allow_short_cells=True, request_timeout_s=300
            ),
            slo=SLO(),
            cells_dir=tmp_path / "cells",
        )
    finally:
        launcher.teardown(deployment)
    assert outcome.status == "ok", outcome.summary.error
    spec = outcome.summary.speculation
    assert spec is not None and spec.drafts and spec.drafts > 400, spec
    # 1 + Bernoulli(0.5) per draft: standard error 0.5 / sqrt(drafts) < 0.025, so 3% is over 3 of them
    assert spec.mean_acceptance_length == pytest.approx(length, rel=0.03), spec
    rates = spec.acceptance_rate_per_position
    assert rates["0"] == pytest.approx(1.0) and rates["2"] == pytest.approx(0.0), rates
    provenance = deployment.extra["overlays"]
    assert [p["name"] for p in provenance["patches"]] == ["cpu-synthetic-acceptance"]
