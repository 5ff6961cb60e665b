"""What `specgauge campaign plan` says a campaign will cost: its size from the plan, and a time estimate
from the warehouse's past runs (none without them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.estimate import History, estimate_seconds, history_from, plan_size
from experiments.plan import plan_campaign
from experiments.spec import load_spec

REPO = Path(__file__).resolve().parent.parent


def test_the_demo_plans_its_launches_cells_requests_and_captures() -> None:
    spec = load_spec(REPO / "experiments" / "demo.yaml")
    size = plan_size(plan_campaign(spec), spec)
    variants, repeats = len(spec.variants), spec.repeats
    cells_each = 3 * len(spec.load.concurrencies)  # three strata
    assert size.arm_launches == variants * repeats and size.profiled_launches == 1
    assert size.launches == size.arm_launches + size.control_launches + 1
    assert size.cells == variants * repeats * cells_each
    each_load = size.cells // len(spec.load.concurrencies)  # as many cells at every load
    assert size.requests == each_load * sum(spec.load.requests_at(c) for c in spec.load.concurrencies)
    assert size.warmup == each_load * sum(spec.load.warmup_at(c) for c in spec.load.concurrencies)
    assert size.capture_prompts == size.captures * 36  # workloads/capture.jsonl


def test_the_estimate_is_starts_plus_requests_at_the_nearest_past_load() -> None:
    spec = load_spec(REPO / "tests" / "data" / "specs" / "tiny.yaml")  # one plain cell at C=1
    plan = plan_campaign(spec)
    size = plan_size(plan, spec)
    history = History(launcher="local", launches=3, start_s=50.0, cells=2, request_s={1: 2.0, 8: 0.5})
    per_cell = spec.load.requests_at(1) + spec.load.warmup_at(1)
    expected = size.launches * 50.0 + size.cells * per_cell * 2.0 + size.capture_prompts * 2.0
    assert estimate_seconds(plan, spec, history) == pytest.approx(expected)
    # a concurrency never run before is costed at the nearest one (in log scale): 16 -> 8
    far = spec.model_copy(update={"load": spec.load.model_copy(update={"concurrencies": (16,)})})
    far_plan = plan_campaign(far)
    per_cell_16 = far.load.requests_at(16) + far.load.warmup_at(16)
    expected_16 = size.launches * 50.0 + per_cell_16 * 0.5 + size.capture_prompts * 2.0
    assert estimate_seconds(far_plan, far, history) == pytest.approx(expected_16)
    empty = History(launcher="local", launches=0, start_s=None, cells=0, request_s={})
    assert estimate_seconds(plan, spec, empty) is None


def test_history_comes_from_the_warehouse_of_past_campaigns(tmp_path: Path) -> None:
    from warehouse_fixtures import RawBuilder, make_spec

    from warehouse import ingest
    from warehouse.db import reader

    builder = RawBuilder(tmp_path / "raw", spec=make_spec())
    builder.write_all()
    db = tmp_path / "w.duckdb"
    ingest.ingest_raw(builder.raw_dir, db)
    with reader(db) as con:
        history = history_from(con, "local")
        ready = con.execute(
            "SELECT median(ready_s), count(*) FROM deployments WHERE ready_s IS NOT NULL"
        ).fetchone()
        other = history_from(con, "slurm")
    assert (history.start_s, history.launches) == (pytest.approx(ready[0]), ready[1]) and history.launches > 0
    assert set(history.request_s) == set(builder.spec.load.concurrencies) and history.cells > 0
    assert other.launches == 0 and other.request_s == {}  # another launcher's runs say nothing of this one


def test_campaign_plan_prints_the_size_and_says_when_it_cannot_estimate(home: Path) -> None:
    from typer.testing import CliRunner
    from warehouse_fixtures import RawBuilder, make_spec

    from cli.app import app
    from specgauge.settings import get_settings
    from warehouse import ingest

    spec_file = str(REPO / "tests" / "data" / "specs" / "tiny.yaml")
    runner = CliRunner()
    first = runner.invoke(app, ["campaign", "plan", spec_file])
    assert first.exit_code == 0, first.output
    assert "launches: 1 (1 measured, 0 plain controls, 0 profiled)" in first.output  # capture off there
    assert "estimated time: unknown (no warehouse yet" in first.output
    builder = RawBuilder(home / "raw-history", spec=make_spec())
    builder.write_all()
    ingest.ingest_raw(builder.raw_dir, get_settings().warehouse_path)
    second = runner.invoke(app, ["campaign", "plan", spec_file])
    assert second.exit_code == 0, second.output
    assert "estimated time: about" in second.output and "past launches on 'local'" in second.output


def test_campaign_plan_shows_the_settings_of_a_sweep_and_its_capacity_searches() -> None:
    from typer.testing import CliRunner

    from cli.app import app

    runner = CliRunner()
    sweep = runner.invoke(app, ["campaign", "plan", str(REPO / "experiments" / "cluster-sweeps-8b.yaml")])
    assert sweep.exit_code == 0, sweep.output
    assert "settings: 4 sampling(s) x 3 layout(s), each with its own plain baseline" in sweep.output
    assert "variants (49)" in sweep.output and "launches: 98 (98 measured" in sweep.output
    capacity = runner.invoke(app, ["campaign", "plan", str(REPO / "experiments" / "capacity.yaml")])
    assert capacity.exit_code == 0, capacity.output
    assert "capacity searches: 2 on code, up to 7 points of 230 requests each (p99 at 90% confidence" in (
        capacity.output
    )
