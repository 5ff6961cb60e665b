"""The regression check on synthetic campaigns with a planted change: a drop beyond the tolerance ends the
flow Failed with an event and an artifact; an unchanged run passes; the first run becomes the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import PlantedBuilder, profile
from warehouse_fixtures import make_spec

from analysis.regression import NOT_JUDGED, compare_campaigns, current_reference, markdown
from warehouse.db import reader

PLAIN_TPOT = 0.020
DRIFT = [1.00, 1.04, 0.97]  # per-repeat launch-to-launch variation, shared by a repeat's variants
VARIANTS = [
    {"name": "plain", "method": "none"},
    {"name": "draft-k3", "method": "draft_model", "k": 3, "draft_model": "models/tiny-draft"},
]


def build(
    root: Path, label: str, tpot_speedup: float, acceptance: float, acceptance_spread: float = 0.01
) -> str:
    """`acceptance_spread`: its per-repeat variation (0: equal in every repeat, a zero-width interval)."""

    def plant(variant: str, repeat: int, workload: str, load: str):
        tpot = PLAIN_TPOT * DRIFT[repeat]
        if variant == "plain":
            return profile(tpot, None)
        return profile(
            tpot / tpot_speedup * (1 + 0.01 * repeat), acceptance * (1 + acceptance_spread * repeat)
        )

    spec = make_spec("nightly", repeats=3, concurrencies=(4,), requests=12, variants=VARIANTS)
    builder = PlantedBuilder(root / "raw", spec=spec, label=label, plant=plant)
    builder.build(root / "warehouse.duckdb", gates=False)
    return builder.campaign_id


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECGAUGE_HOME", str(tmp_path))
    from specgauge.settings import get_settings

    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def test_compare_finds_a_planted_drop_and_not_noise(home: Path) -> None:
    reference = build(home, "ref", tpot_speedup=1.6, acceptance=0.55)
    same = build(home, "same", tpot_speedup=1.6, acceptance=0.55)
    slower = build(home, "slow", tpot_speedup=1.0, acceptance=0.30)
    with reader(home / "warehouse.duckdb") as con:
        unchanged = compare_campaigns(con, same, reference, tolerance=0.10)
        dropped = compare_campaigns(con, slower, reference, tolerance=0.10)
    assert unchanged and not any(c.regressed for c in unchanged)
    by_figure = {c.figure: c for c in dropped}
    assert by_figure["tpot_p50_speedup"].regressed and by_figure["acceptance_rate"].regressed
    assert (
        by_figure["tpot_p50_speedup"].high < 0.9
        and abs(by_figure["acceptance_rate"].ratio - 0.30 / 0.55) < 0.05
    )


def test_the_flow_fails_emits_an_event_and_says_what_moved(
    prefect_harness: None, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import flows.alerts
    import flows.regression as regression_flow

    emitted: list[dict] = []
    monkeypatch.setattr(flows.alerts, "emit_event", lambda **event: emitted.append(event))
    first = build(home, "first", tpot_speedup=1.6, acceptance=0.55)
    state = regression_flow.regression_check(first, "nightly", return_state=True)
    assert state.is_completed() and current_reference(home, "nightly") == first

    slower = build(home, "slow", tpot_speedup=1.0, acceptance=0.30)
    state = regression_flow.regression_check(slower, "nightly", return_state=True)
    assert state.is_failed()
    assert "regressed against " + first in state.message
    assert [e["event"] for e in emitted] == ["specgauge.regression.detected"]
    payload = emitted[0]["payload"]
    assert payload["reference"] == first and payload["campaign_id"] == slower
    assert payload["title"].endswith(f"figure(s) of nightly regressed against {first}")
    assert "tpot_p50_speedup x0." in payload["summary"]  # what moved, and by how much
    assert payload["report"] == "(no report was written)"  # this planted campaign was never analysed
    assert {r["figure"] for r in emitted[0]["payload"]["regressed"]} >= {
        "tpot_p50_speedup",
        "acceptance_rate",
    }
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["regression-nightly"]))
        )
    assert any("**yes**" in str(a.data) and "tpot_p50_speedup" in str(a.data) for a in artifacts)

    again = build(home, "again", tpot_speedup=1.6, acceptance=0.55)
    assert regression_flow.regression_check(again, "nightly", return_state=True).is_completed()


def test_a_zero_width_interval_is_not_enough_repeats_to_judge(home: Path) -> None:
    """Acceptance planted equal in every repeat: a zero-width interval, far below the reference as a point,
    is never a regression (no alert), and the report says why."""
    reference = build(home, "ref", tpot_speedup=1.6, acceptance=0.55, acceptance_spread=0.0)
    flat = build(home, "flat", tpot_speedup=1.6, acceptance=0.30, acceptance_spread=0.0)
    with reader(home / "warehouse.duckdb") as con:
        changes = compare_campaigns(con, flat, reference, tolerance=0.10)
    acceptance = next(c for c in changes if c.figure == "acceptance_rate")
    assert acceptance.ratio < 0.6 and acceptance.low == acceptance.high  # a point far below the tolerance
    assert acceptance.judged is False and acceptance.regressed is False
    assert all(c.judged for c in changes if c.regressed)  # what regressed did so by an interval
    assert NOT_JUDGED in markdown(flat, reference, changes, 0.10)
