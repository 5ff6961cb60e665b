"""Profile artifacts into the warehouse: the `profiles` table and `v_profile_waste`, idempotent ingest,
quarantine of bad artifacts, and the chart command over the view."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner
from warehouse_fixtures import PROFILE_TRACE, profile_meta, real_profile_breakdown

from tasks.profile.window import write_profile_artifact
from warehouse.db import reader
from warehouse.ingest import ingest_raw

TRACE = PROFILE_TRACE
CAMPAIGN = "demo-0000abcd"
meta_for = functools.partial(profile_meta, CAMPAIGN)


@pytest.fixture(scope="module")
def breakdown():
    return real_profile_breakdown()


def test_ingest_view_and_idempotence(tmp_path: Path, breakdown) -> None:
    raw = tmp_path / "raw"
    profiles = raw / CAMPAIGN / "profiles"
    write_profile_artifact(
        profiles / "draft-k3.code.c2.A", meta_for("draft-k3.code.c2.A"), breakdown, trace_path=TRACE
    )
    later = meta_for("draft-k3.code.c2.B", started="2026-11-30T18:00:00.000Z")
    write_profile_artifact(profiles / "draft-k3.code.c2.B", later, breakdown)
    write_profile_artifact(
        profiles / "draft-k3.code.c2.F", meta_for("draft-k3.code.c2.F", status="failed"), None
    )
    db = tmp_path / "w.duckdb"
    report = ingest_raw(raw, db)
    assert report.counts()["profile"] == {"inserted": 3}
    with reader(db) as con:
        view = con.execute(
            "SELECT profile_id, window_rank, wasted_share, wasted_share_of_added, acceptance_rate, cross_check_ok "
            "FROM v_profile_waste ORDER BY profile_id"
        ).fetchall()
        failed = con.execute(
            "SELECT status, error, wasted_share FROM profiles WHERE profile_id LIKE '%F'"
        ).fetchone()
        trace = con.execute(
            "SELECT trace_file, trace_sha256 FROM profiles WHERE profile_id LIKE '%A'"
        ).fetchone()
    shares = breakdown.shares
    assert [(r[0], r[1]) for r in view] == [
        ("draft-k3.code.c2.A", 2),
        ("draft-k3.code.c2.B", 1),
    ]  # failed: not
    assert view[0][2] == pytest.approx(shares["wasted_share"])
    assert view[0][3] == pytest.approx(shares["wasted_share_of_added"])
    assert view[0][4] == pytest.approx(breakdown.counters.accepted_tokens / breakdown.counters.draft_tokens)
    assert view[0][5] is True
    assert failed == ("failed", "POST /start_profile: HTTP 404", None)
    assert trace[0] == f"trace/{TRACE.name}" and len(trace[1]) == 64
    again = ingest_raw(raw, db)
    assert again.counts()["profile"] == {"skipped": 3}


def test_bad_artifacts_are_quarantined(tmp_path: Path, breakdown) -> None:
    raw = tmp_path / "raw"
    profiles = raw / CAMPAIGN / "profiles"
    write_profile_artifact(profiles / "no-breakdown", meta_for("no-breakdown"), None)  # ok without breakdown
    write_profile_artifact(profiles / "renamed", meta_for("something-else"), breakdown)
    bad = profiles / "bad-share"
    write_profile_artifact(bad, meta_for("bad-share"), breakdown)
    doc = json.loads((bad / "breakdown.json").read_text())
    doc["shares"]["wasted_share"] = 1.7
    (bad / "breakdown.json").write_text(json.dumps(doc))
    report = ingest_raw(raw, tmp_path / "w.duckdb")
    reasons = {o.key.split("/")[-1]: o.message for o in report.outcomes if o.kind == "profile"}
    assert report.counts()["profile"] == {"quarantined": 3}
    assert "breakdown.json" in reasons["no-breakdown"] and "missing" in reasons["no-breakdown"]
    assert "profile_id" in reasons["renamed"] and "something-else" in reasons["renamed"]
    assert "wasted_share" in reasons["bad-share"]


def test_chart_command(tmp_path: Path, breakdown, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.app import app
    from specgauge.settings import get_settings

    home = tmp_path / "home"
    monkeypatch.setenv("SPECGAUGE_HOME", str(home))
    get_settings.cache_clear()
    try:
        profiles = home / "raw" / CAMPAIGN / "profiles"
        write_profile_artifact(profiles / "draft-k3.code.c2.A", meta_for("draft-k3.code.c2.A"), breakdown)
        ingest_raw(home / "raw")
        out = CliRunner().invoke(app, ["profile", "chart", "--out", str(tmp_path / "chart" / "waste")])
        assert out.exit_code == 0, out.output
        assert (tmp_path / "chart" / "waste.html").stat().st_size > 0
        assert (tmp_path / "chart" / "waste.png").read_bytes()[:4] == b"\x89PNG"
        none = CliRunner().invoke(
            app, ["profile", "chart", "--out", str(tmp_path / "x"), "--campaign", "nope"]
        )
        assert none.exit_code == 2 and "no profiled windows" in none.output
    finally:
        get_settings.cache_clear()
