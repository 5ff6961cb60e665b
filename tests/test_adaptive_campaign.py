"""Adaptive repeats in the campaign flow (`repeats: {min, max, target_halfwidth}`), on a real Prefect API with
the stand-in engine (tests/reliability_support.py) through the local launcher: after each finished repeat
block the rule (analysis/adaptive_repeats.py) decides whether to launch another. A loose target stops at `min` and
records the blocks it did not launch; an unreachable one runs to `max`; a re-run resumes to the same end.
The rule's statistics are tested in tests/test_adaptive_repeats.py; the embedded engine's adaptive campaign
is experiments/adaptive.yaml (docs/analysis.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from reliability_support import campaign_dir, corpus, emulator_spec, ledger_ids, write_spec

from specgauge import progress

pytest_plugins = ["reliability_support"]
pytestmark = pytest.mark.server


def adaptive_spec(tmp_path: Path, name: str, **repeats: Any) -> Path:
    work = corpus(
        tmp_path / f"{name}.jsonl", [("p-0", "code", "def add(a, b):", 8), ("p-1", "code", "x = 1", 8)]
    )
    spec = emulator_spec(
        name,
        work,
        variants=[{"name": "plain"}, {"name": "ngram-k3", "method": "ngram", "k": 3}],
        repeats=repeats,
        validity={"client_calibration": False},
    )
    return write_spec(tmp_path / f"{name}.yaml", spec)


def run(spec: Path) -> dict[str, Any]:
    from flows.campaign import CampaignRequest, campaign

    with progress.reporting(progress.Reporter()):
        return campaign(CampaignRequest(spec_path=str(spec), gate=False, analyze=False, ingest=False))


def launched_repeats(result: dict[str, Any]) -> list[int]:
    return sorted({int(s["slot"].rsplit(".r", 1)[1]) for s in result["deployments"] if s.get("launches")})


@pytest.mark.timeout(600)
def test_a_loose_target_stops_at_min_and_records_the_blocks_not_launched(
    prefect_api, standin_engine, tmp_path, home
) -> None:
    spec = adaptive_spec(tmp_path, "adaptive-loose", min=3, max=5, target_halfwidth=1.0)
    result = run(spec)

    assert launched_repeats(result) == [0, 1, 2]
    decisions = result["adaptive_repeats"]
    assert [d["repeats_done"] for d in decisions] == [1, 2, 3]
    assert [d["stop"] for d in decisions] == [False, False, True]
    assert decisions[-1]["widest"]["variant"] == "ngram-k3" and decisions[-1]["widest_halfwidth"] <= 1.0
    assert result["failed_cells"] == {}  # a block not launched is not a failure
    statuses = {c: s for slot in result["deployments"] for c, s in slot["cells"].items()}
    skipped = sorted(c for c, s in statuses.items() if s == "skipped (adaptive repeats stopped)")
    assert skipped == ["ngram-k3.r3.code.c1", "ngram-k3.r4.code.c1", "plain.r3.code.c1", "plain.r4.code.c1"]
    assert sorted(p.name for p in (campaign_dir(spec) / "cells").glob("*.a*")) == sorted(
        f"{v}.r{r}.code.c1.a1" for v in ("plain", "ngram-k3") for r in range(3)
    )
    assert ledger_ids() == []

    again = run(spec)  # resume: nothing new is launched, the rule stops at the same point
    assert not any(s.get("launches") for s in again["deployments"])
    assert again["adaptive_repeats"][-1]["stop"] and again["adaptive_repeats"][-1]["repeats_done"] == 3


@pytest.mark.timeout(600)
def test_an_unreachable_target_runs_to_max(prefect_api, standin_engine, tmp_path, home) -> None:
    spec = adaptive_spec(tmp_path, "adaptive-tight", min=3, max=4, target_halfwidth=1e-6)
    result = run(spec)

    assert launched_repeats(result) == [0, 1, 2, 3]
    assert result["failed_cells"] == {}
    # No decision after the last block: there is nothing left to launch.
    assert [(d["repeats_done"], d["stop"]) for d in result["adaptive_repeats"]] == [
        (1, False),
        (2, False),
        (3, False),
    ]
    assert "wider than the target" in result["adaptive_repeats"][-1]["reason"]
