"""Warehouse ingest: loads every artifact kind, idempotent, quarantines bad artifacts, never half-writes a
cell, rebuilds to identical query results, and its views pair and compute what docs/warehouse.md says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pandera.polars as pa
import polars as pl
import pytest
from warehouse_fixtures import DATA_TABLES, REPO, RawBuilder, VariantProfile, make_spec

from experiments.spec import parse_spec
from specgauge.checkpoints import drafter_digest
from warehouse.db import reader, snapshot_path, writer
from warehouse.ingest import ArtifactKind, ArtifactRef, ingest_artifacts, ingest_raw, rebuild
from warehouse.kinds.base import file_kind
from warehouse.kinds.deployments import engine_settings

VIEWS = ("v_cells", "v_speedup", "v_acceptance", "v_acceptance_positions", "v_capacity")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> RawBuilder:
    """Two repeats x three variants x two loads, plus captures and a control launch, written once."""
    builder = RawBuilder(tmp_path_factory.mktemp("template") / "raw", spec=make_spec(repeats=2))
    builder.write_all()
    return builder


@pytest.fixture
def raw(template: RawBuilder, tmp_path: Path) -> RawBuilder:
    """A private copy of the template tree (tests corrupt and extend it)."""
    shutil.copytree(template.raw_dir, tmp_path / "raw")
    return RawBuilder(tmp_path / "raw", spec=template.spec)


def rows(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    with reader(db) as con:
        return con.execute(sql, params or []).fetchall()


def dump(db: Path, name: str, exclude: tuple[str, ...] = ()) -> list[tuple]:
    """Every row of a table or view, in a stable order."""
    with reader(db) as con:
        columns = [c for c in con.sql(f"SELECT * FROM {name} LIMIT 0").columns if c not in exclude]
        select = ", ".join(f'"{c}"' for c in columns)
        return con.execute(f"SELECT {select} FROM {name} ORDER BY ALL").fetchall()


def summary_of(cell_dir: Path) -> dict:
    return json.loads((cell_dir / "summary.json").read_text())


# ----------------------------------------------------------------------------------------------- loading


def test_ingest_loads_every_kind_with_its_rows(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    report = ingest_raw(raw.raw_dir, db)

    assert report.ok, report.as_dict()
    cells = [c for d in raw.plan.deployments for c in d.cells]
    captures = [c for d in raw.plan.deployments for c in d.captures]
    counts = report.counts()
    assert counts["cell"]["inserted"] == len(cells) == 12
    assert counts["deployment"]["inserted"] == len(raw.plan.deployments)
    assert counts["capture"]["inserted"] == len(captures)
    per_cell = raw.spec.load.requests + raw.spec.load.warmup
    assert rows(db, "SELECT count(*) FROM requests") == [(len(cells) * per_cell,)]
    # every cell's request rows are there, under its key, warm-up included
    assert rows(db, "SELECT min(n), max(n) FROM (SELECT count(*) n FROM requests GROUP BY cell_key)") == [
        (per_cell, per_cell)
    ]
    assert rows(db, "SELECT count(*) FROM spec_decode") == [(8,)]  # speculative cells only
    # the drafter served (its content hash) reaches every cell and deployment row of its variant
    draft = drafter_digest(REPO / "models" / "tiny-draft")
    for table in ("v_cells", "deployments"):
        assert rows(db, f"SELECT variant, drafter_sha256 FROM {table} GROUP BY ALL ORDER BY 1") == [
            ("draft-k3", draft),
            ("ngram-k3", None),
            ("plain", None),
        ]
    assert rows(
        db, "SELECT DISTINCT k, count(*) OVER () FROM spec_decode_positions JOIN cells USING (cell_key)"
    )[0] == (3, 24)
    # figures arrive unchanged from summary.json
    cell_dir = next((raw.campaign_dir / "cells").glob("draft-k3.r1.chat.c4.a1"))
    summary = summary_of(cell_dir)
    got = rows(
        db,
        "SELECT ttft_p95_s, tpot_p50_s, output_throughput_tok_s, requests_ok FROM cells WHERE cell_key = ?",
        [f"{raw.campaign_id}/{cell_dir.name}"],
    )
    assert got == [
        (
            summary["latency_s"]["ttft"]["p95"],
            summary["latency_s"]["tpot"]["p50"],
            summary["output_throughput_tok_s"],
            summary["requests"]["ok"],
        )
    ]
    assert rows(db, "SELECT status, runs, repeats, slo_tpot_p99_s FROM campaigns") == [
        ("complete", 1, 2, 0.1)
    ]


def test_reingest_changes_nothing(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    before = {t: dump(db, t) for t in (*DATA_TABLES, "ingest_log", "quarantine")}
    snapshot = snapshot_path(db).stat()

    again = ingest_raw(raw.raw_dir, db)

    assert {kind: set(c) for kind, c in again.counts().items()} == {
        k: {"skipped"} for k in ("campaign", "deployment", "cell", "capture")
    }
    assert again.rows == 0
    assert {t: dump(db, t) for t in before} == before
    assert snapshot_path(db).stat().st_ino == snapshot.st_ino, "a write that changed nothing is not re-copied"


def test_readers_notice_a_live_file_changed_behind_their_back(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    assert rows(db, "SELECT count(*) FROM quarantine") == [(0,)]
    con = duckdb.connect(str(db))  # a write outside warehouse.db.writer(), e.g. by hand
    con.execute("DELETE FROM cells WHERE variant = 'plain'")
    con.close()
    assert rows(db, "SELECT count(*) FROM cells WHERE variant = 'plain'") == [(0,)]


# -------------------------------------------------------------------------------------------- quarantine


def _negative_ttft(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(
        pl.when(pl.col("index") == 3).then(-0.5).otherwise(pl.col("ttft_s")).alias("ttft_s")
    )


CORRUPTIONS = {
    # name: (how to corrupt the cell directory, file, column, expected rows, words in the reason)
    "negative ttft": ("requests", "requests.parquet", "ttft_s", [3], "greater_than_or_equal_to(0)"),
    "duplicate request index": ("dup_index", "requests.parquet", "request_index", [1, 2], "once per cell"),
    "truncated parquet": ("truncate", "requests.parquet", None, [], "not a readable parquet file"),
    "missing column": ("drop_column", "requests.parquet", "ttft_s", [], "missing column"),
    "text in a number column": ("ttft_text", "requests.parquet", "ttft_s", [3], "do not convert to Float64"),
    "broken json": ("bad_json", "summary.json", None, [], "not valid JSON at line"),
    "acceptance above 1": ("acceptance", "summary.json", "acceptance_rate", [0], "less_than_or_equal_to(1)"),
    "summary field of wrong type": ("wall_type", "summary.json", "wall_s", [], "expected a number"),
}


def _corrupt(builder: RawBuilder, how: str) -> Path:
    slot = builder.slot("draft-k3", 1)
    cell = slot.cells[0]
    if how == "requests":
        return builder.write_cell(slot, cell, mutate_requests=_negative_ttft)
    if how == "dup_index":
        return builder.write_cell(
            slot, cell, mutate_requests=lambda f: f.with_columns(pl.col("index").replace(2, 1))
        )
    if how == "ttft_text":
        return builder.write_cell(
            slot,
            cell,
            mutate_requests=lambda f: f.with_columns(
                pl.when(pl.col("index") == 3)
                .then(pl.lit("fast"))
                .otherwise(pl.col("ttft_s").cast(pl.String))
                .alias("ttft_s")
            ),
        )
    if how == "acceptance":
        return builder.write_cell(
            slot, cell, mutate_summary=lambda s: s["speculation"].update(acceptance_rate=1.7)
        )
    if how == "wall_type":
        return builder.write_cell(slot, cell, mutate_summary=lambda s: s.update(wall_s="12.5 s"))
    path = builder.write_cell(slot, cell)
    if how == "truncate":
        data = (path / "requests.parquet").read_bytes()
        (path / "requests.parquet").write_bytes(data[: len(data) // 2])
    elif how == "drop_column":
        pl.read_parquet(path / "requests.parquet").drop("ttft_s").write_parquet(path / "requests.parquet")
    elif how == "bad_json":
        (path / "summary.json").write_text('{"status": "ok", "wall_s": 1.0,\n  "requests": ')
    return path


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupt_cell_is_quarantined_and_the_rest_loads(raw: RawBuilder, tmp_path: Path, name: str) -> None:
    how, file, column, failing_rows, words = CORRUPTIONS[name]
    bad = _corrupt(raw, how)  # a second attempt of a cell whose first attempt is fine
    bad_key = f"{raw.campaign_id}/{bad.name}"
    db = tmp_path / "w.duckdb"

    report = ingest_raw(raw.raw_dir, db)

    assert not report.ok
    [outcome] = report.quarantined
    assert outcome.key == bad_key
    assert f"{bad.name}/{file}" in outcome.message and words in outcome.message
    [(q_file, q_column, q_rows, reason)] = rows(
        db, "SELECT file, column_name, failing_rows, reason FROM quarantine WHERE artifact_key = ?", [bad_key]
    )
    assert (q_file, q_column) == (file, column)
    assert (q_rows or []) == failing_rows
    assert words in reason
    # nothing of it in any table; all the others are in
    for table in ("cells", "requests", "gauges", "spec_decode", "spec_decode_positions"):
        assert rows(db, f"SELECT count(*) FROM {table} WHERE cell_key = ?", [bad_key]) == [(0,)]
    assert rows(db, "SELECT count(*) FROM cells") == [(12,)]
    # the view keeps using the good first attempt
    assert rows(
        db, "SELECT attempt, attempts FROM v_cells WHERE cell_id = ?", [bad.name.rsplit(".a", 1)[0]]
    ) == [(1, 1)]


def test_quarantine_is_remembered_not_repeated(raw: RawBuilder, tmp_path: Path) -> None:
    _corrupt(raw, "requests")
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    log_before = dump(db, "ingest_log")
    quarantine_before = dump(db, "quarantine")

    again = ingest_raw(raw.raw_dir, db)

    assert [o.action for o in again.outcomes if o.kind == "cell"].count("quarantined") == 1
    assert "unchanged since" in again.quarantined[0].message
    assert dump(db, "ingest_log") == log_before
    assert dump(db, "quarantine") == quarantine_before


def test_failed_cells_are_ingested_as_failed_and_views_use_the_latest_ok_attempt(
    raw: RawBuilder, tmp_path: Path
) -> None:
    slot = raw.slot("ngram-k3", 0)
    cell = slot.cells[1]
    failed = raw.write_cell(slot, cell, status="failed", failed_requests=3)  # a2: failed
    later_ok = raw.write_cell(slot, cell)  # a3: ok again
    db = tmp_path / "w.duckdb"

    report = ingest_raw(raw.raw_dir, db)

    assert report.ok
    assert rows(
        db,
        "SELECT attempt, status, requests_failed FROM cells WHERE cell_id = ? ORDER BY attempt",
        [cell.cell_id],
    ) == [(1, "ok", 0), (2, "failed", 3), (3, "ok", 0)]
    assert rows(
        db,
        "SELECT count(*) FROM requests WHERE cell_key = ? AND NOT ok",
        [f"{raw.campaign_id}/{failed.name}"],
    ) == [(3,)]
    expected = summary_of(later_ok)["output_throughput_tok_s"]
    assert rows(
        db, "SELECT attempt, attempts, output_throughput_tok_s FROM v_cells WHERE cell_id = ?", [cell.cell_id]
    ) == [(3, 3, expected)]
    # a cell whose latest attempt failed is still represented by its latest ok one
    only_failed = raw.slot("draft-k3", 0).cells[0]
    raw.write_cell(raw.slot("draft-k3", 0), only_failed, status="failed")
    ingest_raw(raw.raw_dir, db)
    assert rows(db, "SELECT attempt, attempts FROM v_cells WHERE cell_id = ?", [only_failed.cell_id]) == [
        (1, 2)
    ]


def test_an_ingested_cell_that_changes_is_an_error_and_kept(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    cell_dir = next((raw.campaign_dir / "cells").glob("plain.r0.chat.c1.a1"))
    summary = summary_of(cell_dir)
    original = summary["output_throughput_tok_s"]
    summary["output_throughput_tok_s"] = original * 10
    (cell_dir / "summary.json").write_text(json.dumps(summary))

    report = ingest_raw(raw.raw_dir, db)

    [error] = report.errors
    assert error.key == f"{raw.campaign_id}/plain.r0.chat.c1.a1"
    assert "immutable" in error.message and "content changed" in error.message
    assert rows(db, "SELECT output_throughput_tok_s FROM cells WHERE cell_id = 'plain.r0.chat.c1'") == [
        (original,)
    ]


def test_living_records_are_updated(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    raw.write_run(failed_cells={"draft-k3.r1.chat.c4": "failed: EngineDied"})
    slot = raw.slot("plain", 0)
    raw.write_deployment(slot, launch=2, status="failed", teardown="killed after SIGTERM grace")

    report = ingest_raw(raw.raw_dir, db)

    assert report.counts()["campaign"] == {"updated": 1}
    assert report.counts()["deployment"]["inserted"] == 1
    assert rows(db, "SELECT status, runs, failed_cells FROM campaigns") == [
        ("incomplete", 2, ["draft-k3.r1.chat.c4"])
    ]
    assert rows(
        db, "SELECT launch, status FROM deployments WHERE slot = ? ORDER BY launch", [slot.deployment_id]
    ) == [(1, "stopped"), (2, "failed")]


# ------------------------------------------------------------------------------------------------ crashes


class Boom(RuntimeError):
    pass


def test_exception_inside_the_cell_transaction_leaves_no_partial_cell(
    raw: RawBuilder, tmp_path: Path
) -> None:
    db = tmp_path / "w.duckdb"
    seen: list[str] = []

    def crash_on_third_cell(kind: str, keys: list[str]) -> None:
        if kind == "cell":
            seen.extend(keys)
            if len(seen) == 3:
                raise Boom("injected")

    with pytest.raises(Boom):
        ingest_raw(raw.raw_dir, db, before_commit=crash_on_third_cell, per_artifact=True)

    committed = [k for (k,) in rows(db, "SELECT cell_key FROM cells ORDER BY cell_key")]
    assert committed == sorted(seen[:2])
    per_cell = raw.spec.load.requests + raw.spec.load.warmup
    assert rows(db, "SELECT cell_key, count(*) FROM requests GROUP BY cell_key ORDER BY cell_key") == [
        (k, per_cell) for k in committed
    ]
    for table in ("gauges", "spec_decode", "spec_decode_positions"):
        assert rows(
            db, f"SELECT count(*) FROM {table} WHERE cell_key NOT IN (SELECT cell_key FROM cells)"
        ) == [(0,)]
    assert rows(db, "SELECT count(*) FROM ingest_log WHERE artifact_key = ?", [seen[2]]) == [(0,)]

    # batched transactions: the crash takes the whole batch back, never part of a cell
    db2 = tmp_path / "w2.duckdb"
    with pytest.raises(Boom):
        ingest_raw(raw.raw_dir, db2, before_commit=lambda kind, keys: _raise_if(kind == "cell"))
    assert rows(db2, "SELECT count(*) FROM cells") == [(0,)]
    assert rows(db2, "SELECT count(*) FROM requests") == [(0,)]
    assert rows(db2, "SELECT count(*) FROM deployments") == [(len(raw.plan.deployments),)]

    # the next ingest completes the job, as a clean one would
    assert ingest_raw(raw.raw_dir, db).ok
    clean = tmp_path / "clean.duckdb"
    ingest_raw(raw.raw_dir, clean)
    for view in VIEWS:
        assert dump(db, view) == dump(clean, view)


def _raise_if(condition: bool) -> None:
    if condition:
        raise Boom("injected")


# ------------------------------------------------------------------------------------------------ rebuild


def test_rebuild_gives_identical_query_results(raw: RawBuilder, tmp_path: Path) -> None:
    _corrupt(raw, "requests")  # a quarantined artifact is rebuilt as quarantined
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    views = {v: dump(db, v) for v in VIEWS}
    tables = {t: dump(db, t) for t in DATA_TABLES}
    quarantine = dump(db, "quarantine", exclude=("quarantined_utc",))
    assert all(views.values()), "every view has rows to compare"
    inode = db.stat().st_ino

    report = rebuild(raw.raw_dir, db)

    assert db.stat().st_ino != inode, "rebuilt into a new file and swapped in"
    assert not list(tmp_path.glob(".w.duckdb.rebuild*")), "no temporary file left"
    assert len(report.quarantined) == 1
    assert {v: dump(db, v) for v in VIEWS} == views
    assert {t: dump(db, t) for t in DATA_TABLES} == tables
    assert dump(db, "quarantine", exclude=("quarantined_utc",)) == quarantine


def test_failed_rebuild_keeps_the_old_warehouse(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    before = dump(db, "v_cells")
    with pytest.raises(Exception, match="no raw artifacts"):
        rebuild(tmp_path / "missing", db)
    assert dump(db, "v_cells") == before


# -------------------------------------------------------------------------------------------------- views


def test_v_speedup_pairs_each_speculative_cell_with_its_plain_baseline(
    raw: RawBuilder, tmp_path: Path
) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    got = rows(
        db,
        "SELECT cell_id, baseline_cell_id, throughput_speedup, ttft_p50_speedup, ttft_p95_speedup, "
        "tpot_p50_speedup, tpot_p95_speedup FROM v_speedup ORDER BY cell_id",
    )
    speculative = sorted(
        c.cell_id for d in raw.plan.deployments if d.variant.method != "none" for c in d.cells
    )
    assert [g[0] for g in got] == speculative  # each exactly once: one plain baseline per repeat and load
    cells = raw.campaign_dir / "cells"
    for cell_id, baseline_id, thr, ttft50, ttft95, tpot50, tpot95 in got:
        variant, repeat, workload, load = cell_id.split(".", 3)
        assert baseline_id == f"plain.{repeat}.{workload}.{load}"  # same repeat, workload and load
        s, b = summary_of(cells / f"{cell_id}.a1"), summary_of(cells / f"{baseline_id}.a1")
        assert thr == pytest.approx(s["output_throughput_tok_s"] / b["output_throughput_tok_s"])
        assert ttft50 == pytest.approx(b["latency_s"]["ttft"]["p50"] / s["latency_s"]["ttft"]["p50"])
        assert ttft95 == pytest.approx(b["latency_s"]["ttft"]["p95"] / s["latency_s"]["ttft"]["p95"])
        assert tpot50 == pytest.approx(b["latency_s"]["tpot"]["p50"] / s["latency_s"]["tpot"]["p50"])
        assert tpot95 == pytest.approx(b["latency_s"]["tpot"]["p95"] / s["latency_s"]["tpot"]["p95"])
        # the synthetic draft model decodes 20 ms -> 12 ms per token: clearly faster per token
        if variant == "draft-k3":
            assert tpot50 > 1.4


def test_v_speedup_pairs_each_sampling_and_layout_with_its_own_plain(tmp_path: Path) -> None:
    """A sweep over two samplings and two layouts: every speculative cell pairs with exactly one plain cell,
    the plain served with its sampling and layout, never another setting's (even where that is faster)."""
    spec = parse_spec(
        {
            **make_spec().model_dump(mode="json", exclude={"variants", "sampling", "layouts"}),
            "variants": [
                {"name": "plain", "method": "none"},
                {"name": "draft", "method": "draft_model", "k": 3, "draft_model": "models/tiny-draft"},
            ],
            "sampling": [
                {"name": "greedy", "temperature": 0.0},
                {"name": "topk5", "temperature": 1.0, "top_k": 5},
            ],
            "layouts": [{"tensor_parallel_size": 1}, {"tensor_parallel_size": 2}],
        }
    )
    settings = ("greedy-tp1dp1", "greedy-tp2dp1", "topk5-tp1dp1", "topk5-tp2dp1")
    assert {v.name for v in spec.variants} == {f"{n}-{s}" for n in ("plain", "draft") for s in settings}
    # each setting's plain decodes at its own speed, so a wrong pairing shows in the speedup too
    profiles = {
        f"plain-{s}": VariantProfile(ttft_s=0.05, tpot_s=0.010 * (i + 1), tokens_per_chunk=1.0)
        for i, s in enumerate(settings)
    } | {
        f"draft-{s}": VariantProfile(ttft_s=0.05, tpot_s=0.008, tokens_per_chunk=2.0, acceptance_rate=0.5)
        for s in settings
    }
    builder = RawBuilder(tmp_path / "raw", spec=spec, profiles=profiles)
    builder.write_all(captures=False)
    db = tmp_path / "w.duckdb"
    assert ingest_raw(tmp_path / "raw", db).ok

    pairs = rows(db, "SELECT cell_id, variant, baseline_variant FROM v_speedup ORDER BY cell_id")
    speculative_cells = rows(db, "SELECT count(*) FROM v_cells WHERE method <> 'none'")[0][0]
    assert len(pairs) == speculative_cells == len(settings) * len(spec.load.concurrencies)
    assert len({cell for cell, _, _ in pairs}) == len(pairs)  # one baseline per cell
    for _, variant, baseline in pairs:
        assert baseline == variant.replace("draft-", "plain-", 1)
    keys = rows(db, "SELECT count(DISTINCT sampling_key), count(DISTINCT engine_key) FROM v_cells")
    assert keys == [(2, 2)]


def test_v_speedup_never_pairs_across_sampling_or_campaigns(tmp_path: Path) -> None:
    greedy = RawBuilder(tmp_path / "raw", spec=make_spec(name="greedy"))
    greedy.write_all(captures=False)
    # another campaign whose plain variant is missing: its speculative cells have no baseline anywhere
    lonely = RawBuilder(
        tmp_path / "raw",
        spec=make_spec(
            name="lonely",
            variants=[
                {"name": "plain", "method": "none"},
                {"name": "draft-k3", "method": "draft_model", "k": 3, "draft_model": "models/tiny-draft"},
            ],
        ),
    )
    lonely.write_campaign()
    for slot in lonely.arms():
        if slot.variant.method != "none":
            lonely.write_deployment(slot)
            for cell in slot.cells:
                lonely.write_cell(slot, cell)
    db = tmp_path / "w.duckdb"
    ingest_raw(tmp_path / "raw", db)

    assert rows(db, "SELECT DISTINCT campaign_id FROM v_speedup") == [(greedy.campaign_id,)]
    # change the sampling of one plain cell's attempt: that load loses its baseline
    slot, cell = greedy.slot("plain", 0), greedy.slot("plain", 0).cells[0]
    greedy.write_cell(slot, cell, mutate_meta=lambda meta: meta["sampling"].update(temperature=0.7))
    report = ingest_raw(tmp_path / "raw", db)
    assert report.ok, report.as_dict()
    load = cell.cell_id.rsplit(".", 1)[1]
    assert rows(db, "SELECT count(*) FROM v_speedup WHERE load_label = ?", [load]) == [(0,)]
    assert rows(db, "SELECT count(*) FROM v_speedup WHERE load_label <> ?", [load]) == [(2,)]


def test_v_acceptance_and_v_capacity(raw: RawBuilder, tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    cells = raw.campaign_dir / "cells"
    for cell_id, rate, length, per_position in rows(
        db,
        "SELECT cell_id, acceptance_rate, mean_acceptance_length, acceptance_rate_per_position FROM v_acceptance",
    ):
        spec = summary_of(cells / f"{cell_id}.a1")["speculation"]
        assert (rate, length) == (spec["acceptance_rate"], spec["mean_acceptance_length"])
        assert per_position == [spec["acceptance_rate_per_position"][str(i)] for i in range(3)]
    assert rows(db, "SELECT count(*) FROM v_acceptance") == [(8,)]
    assert rows(db, "SELECT count(*), count(DISTINCT cell_id) FROM v_acceptance_positions") == [(24, 8)]

    capacity = rows(
        db,
        "SELECT variant, load_label, repeats, achieved_rps, ttft_p99_s_worst, slo_ttft_p99_s, slo_met "
        "FROM v_capacity ORDER BY variant, load_label",
    )
    assert len(capacity) == 6 and all(r[2] == 2 for r in capacity)  # two repeats per variant and load
    for variant, load, _, achieved, worst_ttft, slo_ttft, met in capacity:
        per_repeat = [summary_of(cells / f"{variant}.r{r}.chat.{load}.a1") for r in (0, 1)]
        assert achieved == pytest.approx(sum(s["request_throughput_rps"] for s in per_repeat) / 2)
        assert worst_ttft == max(s["latency_s"]["ttft"]["p99"] for s in per_repeat)
        assert slo_ttft == 2.0
        assert met is True  # synthetic TTFT ~60 ms and TPOT ~20 ms are far inside 2 s / 100 ms


def test_v_capacity_reports_a_missed_slo(raw: RawBuilder, tmp_path: Path) -> None:
    slot = raw.slot("plain", 1)

    def slow(summary: dict) -> None:
        summary["latency_s"]["tpot"]["p99"] = 0.25  # the campaign's SLO is 0.1 s

    raw.write_cell(slot, slot.cells[0], mutate_summary=slow)
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    load = slot.cells[0].cell_id.rsplit(".", 1)[1]
    assert rows(
        db,
        "SELECT slo_met, tpot_p99_s_worst FROM v_capacity WHERE variant = 'plain' AND load_label = ?",
        [load],
    ) == [(False, 0.25)]


def test_achieved_concurrency_and_steal_reach_v_cells_and_older_cells_read_null(
    raw: RawBuilder, tmp_path: Path
) -> None:
    slot = raw.slot("plain", 1)

    def measured_load(summary: dict) -> None:
        summary["achieved_concurrency"] = 3.25
        summary["host"] = {
            "cpus": 2,
            "busy_share": 0.9,
            "ours_share": 0.8,
            "other_share": 0.02,
            "steal_share": 0.08,
        }

    cell_dir = raw.write_cell(slot, slot.cells[0], mutate_summary=measured_load)
    db = tmp_path / "w.duckdb"
    assert ingest_raw(raw.raw_dir, db).ok
    got = rows(
        db,
        "SELECT cell_id, achieved_concurrency, host_other_share, host_steal_share FROM v_cells "
        "WHERE achieved_concurrency IS NOT NULL OR host_steal_share IS NOT NULL",
    )
    assert got == [(cell_dir.name.rsplit(".a", 1)[0], 3.25, 0.02, 0.08)]
    # the template's summaries predate the fields: their cells read null, not zero
    assert rows(db, "SELECT count(*) FROM v_cells WHERE achieved_concurrency IS NULL") == [(11,)]


# -------------------------------------------------------------------------------------------- engine keys


def test_engine_settings_ignore_what_differs_per_launch_but_not_engine_arguments() -> None:
    base = [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m/target",
        "--served-model-name",
        "tiny-plain",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--max-model-len",
        "2048",
    ]
    spec = [
        "/other/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m/target",
        "--served-model-name=tiny-ngram",
        "--host",
        "127.0.0.1",
        "--port",
        "9999",
        "--max-model-len",
        "2048",
        "--speculative-config",
        '{"method":"ngram"}',
        "--enforce-eager",
    ]
    extra = {"kv_cache_gib": 1.0}
    plain = engine_settings(base, "local", extra)
    assert engine_settings(spec, "local", extra, variant_extra_args=["--enforce-eager"]) == plain
    assert engine_settings(spec, "local", extra) != plain  # an extra engine argument is a different setting
    longer = [a if a != "2048" else "4096" for a in base]
    assert engine_settings(longer, "local", extra) != plain
    assert engine_settings(base, "local", {"kv_cache_gib": 2.0}) != plain
    assert engine_settings(base, "slurm", extra) != plain


def test_duckdb_file_is_consistent_after_ingest(raw: RawBuilder, tmp_path: Path) -> None:
    """The live file (not only the snapshot) opens cleanly and agrees with the snapshot."""
    db = tmp_path / "w.duckdb"
    ingest_raw(raw.raw_dir, db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        live = con.execute("SELECT count(*), sum(ttft_s) FROM requests").fetchall()
    finally:
        con.close()
    assert live == rows(db, "SELECT count(*), sum(ttft_s) FROM requests")
    assert not Path(f"{db}.wal").exists()


# ------------------------------------------------------------------------------------------ other kinds


class NoteModel(pa.DataFrameModel):
    note_key: pl.String = pa.Field(unique=True)
    text: pl.String = pa.Field(str_length={"min_value": 1})
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field()

    class Config:
        strict = True


def _note_kind(frames) -> ArtifactKind:
    """A kind the ingest engine has never seen: RAW/<campaign>/notes/<name>.json, one row each."""
    return file_kind(
        name="note",
        table="notes",
        key_column="note_key",
        found=lambda campaign_dir: sorted((campaign_dir / "notes").glob("*.json")),
        frames=frames,
        models={"notes": NoteModel},
    )


def test_another_module_can_add_an_artifact_kind(raw: RawBuilder, tmp_path: Path) -> None:
    notes = raw.campaign_dir / "notes"
    notes.mkdir()
    (notes / "a.json").write_text(json.dumps({"text": "first"}))
    (notes / "b.json").write_text(json.dumps({"text": ""}))  # fails the model: quarantined

    def frames(ref: ArtifactRef, files, sha: str) -> dict:
        text = json.loads(files[f"{ref.name}.json"])["text"]
        return {"notes": [{"note_key": ref.key, "text": text, "source_path": ref.source_path, "sha256": sha}]}

    kind = _note_kind(frames)
    db = tmp_path / "w.duckdb"
    with writer(db) as con:
        con.execute(
            "CREATE TABLE notes (note_key VARCHAR PRIMARY KEY, text VARCHAR, source_path VARCHAR, "
            "sha256 VARCHAR)"
        )
        refs = list(kind.discover(raw.campaign_dir, raw.campaign_id))
        first = ingest_artifacts(con, kind, refs)
        again = ingest_artifacts(con, kind, refs)
    assert sorted((o.key.split("/")[1], o.action) for o in first) == [("a", "inserted"), ("b", "quarantined")]
    assert sorted(o.action for o in again) == ["quarantined", "skipped"]
    assert rows(db, "SELECT text FROM notes") == [("first",)]
    assert rows(db, "SELECT file, column_name FROM quarantine WHERE kind = 'note'") == [("notes", "text")]

    # a bug in a kind's code (not bad data) surfaces as itself, and nothing waits forever for it
    def broken(ref: ArtifactRef, files, sha: str) -> dict:
        raise RuntimeError("a bug in the kind's code")

    (notes / "c.json").write_text(json.dumps({"text": "third"}))
    with writer(db) as con, pytest.raises(RuntimeError, match="a bug"):
        ingest_artifacts(con, _note_kind(broken), list(kind.discover(raw.campaign_dir, raw.campaign_id)))
