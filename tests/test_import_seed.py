"""`specgauge import seed`: the reference study's cell artifacts (tests/fixtures/seed, taken from
github.com/swiss-ai/apertus-speculative-decoding; README there) imported as a campaign and ingested."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flows.import_reference import import_seed

FIXTURE = Path(__file__).parent / "fixtures" / "seed" / "results"
CONFIRM = FIXTURE / "8b" / "eagle" / "confirm"
EAGLE_CELL = CONFIRM / "apertus15-8b-eagle31-k3-confirm-c1-20260926T125727Z" / "cells" / "code" / "c1"
BASELINE_CELL = CONFIRM / "apertus15-8b-baseline-confirm-c1-20260926T131028Z" / "cells" / "code" / "c1"
DAMAGED = CONFIRM / "damaged-truncated-summary" / "cells" / "code" / "c1" / "summary.json"
GATE = FIXTURE / "70b" / "correctness" / "smoke-20260913-debug" / "gate-baseline-vs-ngram-repeat1.json"
REPO = Path(__file__).resolve().parents[1]


def _counters(path: Path) -> dict[str, float]:
    """The speculation counters of a /metrics text, read by hand (samples by name, `position` kept)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            if sample.name.startswith("vllm:spec_decode") and sample.name.endswith("_total"):
                key = sample.name + (f"@{sample.labels['position']}" if "position" in sample.labels else "")
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _query(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture
def imported(home: Path):
    raw, db = home / "raw", home / "warehouse.duckdb"
    return import_seed(FIXTURE, raw, db, "fixture"), raw, db


def test_imported_cells_appear_in_the_views_with_acceptance_from_the_snapshots(imported) -> None:
    result, _, db = imported
    assert result.campaign_id == "seed-fixture"
    assert sorted(result.written) == [
        "apertus15-8b-baseline.r0.code.c1.a1",
        "apertus15-8b-eagle31-k3.r0.code.c1.a1",
    ]
    before, after = (
        _counters(EAGLE_CELL / "metrics_before.prom"),
        _counters(EAGLE_CELL / "metrics_after.prom"),
    )
    delta = {name: after[name] - before[name] for name in after}
    drafts = delta["vllm:spec_decode_num_drafts_total"]
    accepted = delta["vllm:spec_decode_num_accepted_tokens_total"]
    expected_rate = accepted / delta["vllm:spec_decode_num_draft_tokens_total"]
    expected_positions = [
        delta[f"vllm:spec_decode_num_accepted_tokens_per_pos_total@{i}"] / drafts for i in range(3)
    ]

    rows = _query(
        db,
        "SELECT cell_id, method, k, acceptance_rate, mean_acceptance_length, acceptance_rate_per_position "
        "FROM v_acceptance WHERE campaign_id = 'seed-fixture'",
    )
    assert len(rows) == 1
    cell_id, method, k, rate, mean_length, positions = rows[0]
    assert (cell_id, method, k) == ("apertus15-8b-eagle31-k3.r0.code.c1", "eagle3", 3)
    assert rate == pytest.approx(expected_rate, rel=1e-12)
    assert mean_length == pytest.approx(1 + accepted / drafts, rel=1e-12)
    assert positions == pytest.approx(expected_positions, rel=1e-12)
    # The reference computed the same figure itself (never read by the importer): both agree.
    reference = json.loads((EAGLE_CELL / "summary.json").read_text())["speculative_decoding"]
    assert rate == pytest.approx(reference["acceptance_rate"], rel=1e-12)

    cells = dict(
        (row[0], row[1:])
        for row in _query(
            db,
            "SELECT variant, method, wall_s, ttft_p50_s, ttft_p90_s FROM v_cells WHERE campaign_id = 'seed-fixture'",
        )
    )
    assert set(cells) == {"apertus15-8b-baseline", "apertus15-8b-eagle31-k3"}
    baseline = json.loads((BASELINE_CELL / "summary.json").read_text())
    method, wall, ttft_p50, ttft_p90 = cells["apertus15-8b-baseline"]
    assert method == "none" and wall == baseline["wall_seconds"]
    # No requests.jsonl in the fixture: latency mapped from summary.json (ms -> s); it has no p90.
    assert ttft_p50 == pytest.approx(baseline["latency_ms"]["ttft"]["p50"] / 1000)
    assert ttft_p90 is None


def test_the_campaign_is_marked_imported(imported) -> None:
    _, _, db = imported
    rows = _query(db, "SELECT campaign_id, status, imported_from FROM campaigns WHERE imported")
    assert [(r[0], r[1]) for r in rows] == [("seed-fixture", "complete")]
    assert json.loads(rows[0][2])["source"] == "github.com/swiss-ai/apertus-speculative-decoding"


def test_damaged_and_unread_files_are_reported_and_skipped(imported) -> None:
    result, raw, _ = imported
    damaged = {s.path: s.reason for s in result.damaged}
    assert set(damaged) == {DAMAGED}
    assert "not valid JSON" in damaged[DAMAGED]
    skipped = {s.path: s for s in result.skipped}
    assert not skipped[GATE].damaged and "gate verdict" in skipped[GATE].reason
    assert result.exit_code == 1  # a damaged file; the good cells still imported
    assert not any("damaged" in p.name for p in (raw / "seed-fixture" / "cells").iterdir())


def test_a_second_import_adds_nothing(imported, home: Path) -> None:
    _, raw, db = imported
    tree = sorted((p.relative_to(raw), p.stat().st_mtime_ns) for p in raw.rglob("*") if p.is_file())
    again = import_seed(FIXTURE, raw, db, "fixture")
    assert again.written == [] and again.deployments == []
    assert sorted(again.already) == [
        "apertus15-8b-baseline.r0.code.c1.a1",
        "apertus15-8b-eagle31-k3.r0.code.c1.a1",
    ]
    assert again.ingest is not None and again.ingest.rows == 0
    assert {o.action for o in again.ingest.outcomes} == {"skipped"}
    assert sorted((p.relative_to(raw), p.stat().st_mtime_ns) for p in raw.rglob("*") if p.is_file()) == tree


def test_latency_comes_from_requests_jsonl_when_a_cell_has_it(home: Path, tmp_path: Path) -> None:
    """A cell with requests.jsonl (the reference client's records): latency through our summary code."""
    results = tmp_path / "study"
    cell = results / "E" / "1" / "code" / "c1" / "repeat-01"
    shutil.copytree(EAGLE_CELL, cell)
    records = [
        {
            "request_index": i,
            "prompt_id": f"p{i}",
            "workload": "code",
            "success": True,
            "status_code": 200,
            "e2e_ms": e2e,
            "ttft_ms": ttft,
            "tpot_ms": (e2e - ttft) / (tokens - 1),
            "stream_event_gaps_ms": gaps,
            "prompt_tokens": 10,
            "completion_tokens": tokens,
            "finish_reason": "stop",
            "output_sha256": None,
            "output": None,
            "error": None,
        }
        for i, (ttft, e2e, tokens, gaps) in enumerate(
            [(30.0, 130.0, 11, [40.0, 60.0]), (50.0, 90.0, 5, [10.0, 30.0]), (20.0, 420.0, 41, [400.0])]
        )
    ]
    (cell / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = import_seed(results, home / "raw", home / "warehouse.duckdb", None)
    assert result.exit_code == 0 and result.campaign_id == "seed-study"
    ((ttft_p50, ttft_p90, gap_mean, tokens_per_chunk, itl),) = _query(
        home / "warehouse.duckdb",
        "SELECT ttft_p50_s, ttft_p90_s, chunk_gap_mean_s, tokens_per_chunk_mean, itl_per_token_mean_s FROM v_cells",
    )
    assert ttft_p50 == pytest.approx(0.030) and ttft_p90 == pytest.approx(
        np.percentile([0.02, 0.03, 0.05], 90)
    )
    assert gap_mean == pytest.approx(np.mean([0.04, 0.06, 0.01, 0.03, 0.4]))
    assert tokens_per_chunk == pytest.approx((11 + 5 + 41) / (3 + 3 + 2))
    assert itl is None  # the reference recorded no tokens per chunk


def test_nothing_importable_exits_2(home: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("no cells here\n")
    result = import_seed(tmp_path / "empty", home / "raw", home / "warehouse.duckdb", None)
    assert result.exit_code == 2 and result.ingest is None
    assert [s.path.name for s in result.skipped] == ["notes.md"]


def test_cli_exits_1_and_names_the_damaged_file(home: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli", "import", "seed", str(FIXTURE), "--campaign", "cli"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={**__import__("os").environ, "COLUMNS": "400"},
    )
    assert done.returncode == 1, done.stderr
    assert str(DAMAGED) in done.stdout
    assert "seed-cli: 2 cell(s) written" in done.stdout
