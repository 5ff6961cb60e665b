"""A launch's engine warm-up (tasks/relaunch.warm_launch): before its first measured cell the engine has served
C requests at once at every closed-loop concurrency C of the launch's cells, through the cells' own client;
`load.engine_warmup: false` turns it off, and an engine that is gone does not stop the slot."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from emulator_cells import emulator_deployment, prompts
from emulator_fixture import MODEL

from emulator import EmulatorProcess
from experiments.plan import CellPlan, plan_campaign
from experiments.spec import load_spec
from tasks.cell import CellOutcome
from tasks.launch.base import Deployment
from tasks.launch.endpoint import EndpointLauncher
from tasks.relaunch import SlotRun, SlotSteps, measure_cell, run_slot
from workloads.schema import load_corpus

LOADS = [1, 4, 8]


def slot_run(tmp_path: Path, url: str, **load: Any) -> SlotRun:
    """One plain slot whose cells are closed-loop at 8, 1 and 4 (in that order) on stratum `w`."""
    work = tmp_path / "w.jsonl"
    work.write_text("".join(p.model_dump_json() + "\n" for p in prompts(5, 8)))
    data = {
        "name": "warm",
        "target": {"model": MODEL, "served_model_name": MODEL},
        "variants": [{"name": "plain"}],
        "workloads": [{"file": str(work)}],
        "load": {"concurrencies": [8, 1, 4], "requests": 2, "warmup": 0, "allow_short_cells": True, **load},
        "sampling": {"max_tokens": 8},
        "capture": {"enabled": False},
        "validity": {"aa_control": False},
        "launcher": {"kind": "endpoint", "base_url": url},
    }
    path = tmp_path / "warm.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(path)
    (slot,) = plan_campaign(spec).deployments
    launcher = EndpointLauncher(spec.launcher)  # type: ignore[arg-type]
    return SlotRun(spec, "warm", slot, {str(work): load_corpus(work)}, tmp_path / "raw", launcher)


def run_with_trace(
    run: SlotRun, deployment: Deployment, server: EmulatorProcess
) -> tuple[list[dict[str, Any]], list[CellOutcome]]:
    """Run the slot; return what the emulator served before its first measured cell, and the cells' outcomes."""
    before_first: list[dict[str, Any]] = []
    outcomes: list[CellOutcome] = []

    def cell(dep: Deployment, plan: CellPlan) -> CellOutcome:
        if not outcomes:
            before_first.extend(server.trace())
        outcomes.append(measure_cell(run, dep, plan, on_record=lambda record: None))
        return outcomes[-1]

    deployment.ready_s = 0.0  # launched and ready: the endpoint is already serving
    steps = SlotSteps(
        launch=lambda: deployment,
        cell=cell,
        capture=lambda dep, capture_id: Path(),
        capacity=lambda dep: Path(),
        teardown=lambda dep: None,
    )
    run_slot(run, steps, logging.getLogger("test.warmup"))
    return before_first, outcomes


def in_flight_peaks(trace: list[dict[str, Any]], sizes: list[int]) -> list[int]:
    """The most requests the emulator held at once in each burst, the bursts taken in arrival order."""
    served = sorted(trace, key=lambda r: r["received"])
    peaks, start = [], 0
    for size in sizes:
        burst = served[start : start + size]
        start += size
        edges = sorted([(r["received"], 1) for r in burst] + [(r["last"], -1) for r in burst])
        level = peak = 0
        for _, step in edges:
            level += step
            peak = max(peak, level)
        peaks.append(peak)
    return peaks


def test_the_engine_serves_c_at_once_at_every_load_before_the_first_measured_cell(
    emulator: EmulatorProcess, tmp_path: Path, caplog
) -> None:
    run = slot_run(tmp_path, emulator.url)
    deployment = emulator_deployment(emulator.url, tmp_path / "dep", "warm.plain.r0.l1")
    with caplog.at_level(logging.INFO, logger="test.warmup"):
        before_first, outcomes = run_with_trace(run, deployment, emulator)
    assert len(before_first) == sum(LOADS)  # C requests at each load, nothing else
    assert in_flight_peaks(before_first, LOADS) == LOADS  # each burst held its load
    assert [o.status for o in outcomes] == ["ok"] * 3
    for outcome in outcomes:  # the warm-up is no cell: each cell has its own two measured requests only
        assert outcome.summary.requests is not None and outcome.summary.requests.total == 2
    (line,) = [r.getMessage() for r in caplog.records if "warmed up" in r.getMessage()]
    assert "C=1: 1/1 ok, C=4: 4/4 ok, C=8: 8/8 ok" in line, line


def test_engine_warmup_false_sends_nothing_before_the_first_cell(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    run = slot_run(tmp_path, emulator.url, engine_warmup=False)
    deployment = emulator_deployment(emulator.url, tmp_path / "dep", "warm.plain.r0.l1")
    before_first, outcomes = run_with_trace(run, deployment, emulator)
    assert before_first == [] and len(outcomes) == 3


def test_a_gone_engine_fails_the_first_cell_not_the_warmup(
    emulator: EmulatorProcess, tmp_path: Path, caplog
) -> None:
    run = slot_run(tmp_path, emulator.url, request_timeout_s=5)
    gone = emulator_deployment("http://127.0.0.1:9", tmp_path / "dep", "warm.plain.r0.l1")  # nothing listens
    with caplog.at_level(logging.INFO, logger="test.warmup"):
        _, outcomes = run_with_trace(run, gone, emulator)
    assert outcomes and outcomes[0].status == "failed"  # the cell found out, and was recorded
    (line,) = [r for r in caplog.records if "warmed up" in r.getMessage()]
    assert line.levelno == logging.WARNING and "C=1: 0/1 ok" in line.getMessage()
