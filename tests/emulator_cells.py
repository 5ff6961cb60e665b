"""Cells against the test emulator (tests/emulator_fixture.py): its deployment as the endpoint launcher
records one, numbered prompts of one stratum `w`, and one closed-loop cell of them through `run_cell` (the
load tests, the GPU telemetry hook)."""

from __future__ import annotations

from pathlib import Path

from emulator_fixture import MODEL

from emulator import EmulatorProcess
from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, Sampling, Variant
from tasks.cell import CellOutcome, run_cell
from tasks.launch.base import Deployment
from workloads.schema import Prompt, load_corpus


def emulator_deployment(
    url: str,
    directory: Path,
    deployment_id: str,
    *,
    launcher: str = "endpoint",
    variant: Variant | None = None,
    metrics_url: str | None = None,
) -> Deployment:
    """The emulator serving at `url` (already running: nothing is launched) as a deployment of `variant`
    (plain unless given), said to be `launcher`'s, its /metrics at `metrics_url` (the server's own unless given)."""
    return Deployment(
        id=deployment_id,
        launcher=launcher,
        variant=variant or Variant(name="plain"),
        served_model_name=MODEL,
        base_url=url,
        metrics_url=metrics_url or f"{url}/metrics",
        directory=directory,
    )


def prompts(n: int = 5, tokens: int = 8) -> list[Prompt]:
    """`n` one-line prompts p0.. of stratum `w`, each asking for `tokens` tokens."""
    return [
        Prompt(id=f"p{i}", workload="w", max_tokens=tokens, messages=[{"role": "user", "content": f"q {i}"}])
        for i in range(n)
    ]


def emulator_cell(
    emulator: EmulatorProcess,
    tmp_path: Path,
    load: LoadSpec,
    *,
    deployment_id: str,
    campaign_id: str,
    prompt_count: int = 5,
    tokens: int = 8,
    launcher: str = "endpoint",
) -> CellOutcome:
    """The closed-loop cell plain.r0.w.c<C> (C: the load's one concurrency) of `prompt_count` prompts of
    `tokens` tokens, run by `run_cell` (its scrapes, gauges and artifact) against the emulator. The deployment
    lives in tmp_path/dep, the workload file is tmp_path/w.jsonl, the cell is written under tmp_path/cells."""
    (concurrency,) = load.concurrencies
    deployment = emulator_deployment(emulator.url, tmp_path / "dep", deployment_id, launcher=launcher)
    tmp_path.mkdir(parents=True, exist_ok=True)
    work = tmp_path / "w.jsonl"
    work.write_text("".join(p.model_dump_json() + "\n" for p in prompts(prompt_count, tokens)))
    return run_cell(
        deployment,
        CellPlan(f"plain.r0.w.c{concurrency}", "w", "closed", concurrency, None, "w.jsonl"),
        campaign_id=campaign_id,
        repeat=0,
        corpus=load_corpus(work),
        sampling=Sampling(max_tokens=tokens),
        load=load,
        slo=SLO(),
        cells_dir=tmp_path / "cells",
    )
