"""Warehouse speed at 1x, 10x and 100x: what one more campaign's ingest costs as the warehouse grows, and
two queries over every request row. Targets on the project's 2-core machine: ingest >= 200,000 request
rows/s, the cost of one more campaign flat across sizes, each query under 2 s at 10x and 10 s at 100x.

1. Writes a synthetic campaign (tests/warehouse_fixtures.py, the documented raw layout): 3 variants x 5 repeats
   x 3 workload strata x 22 loads = 990 cells of 1,011 requests each (1,000,890 request rows, chunk lists of
   15-32 entries), with deployments, campaign.json and a run record: one "campaign" (1x).
2. At each size N (campaigns), the warehouse holds N - 1 campaigns and one more is ingested: at 1x the raw
   campaign into a fresh warehouse, later a copy of it under a new campaign id (its JSON rewritten, its
   parquet files linked), with `ingest_raw` as `specgauge ingest` runs it: open, migrate, read, validate,
   write, commit, close, and the reader snapshot copy. That is the cost of one more campaign.
3. Before that, grows the warehouse to N - 1 campaigns by adding copies of the first under new campaign ids:
   its cells (and their small tables) copied inside DuckDB, its request and gauge Parquet files rewritten
   with the new cell keys and listed in the manifest, as an ingest would have left them.
4. At each size: `SELECT * FROM v_speedup` and TTFT/TPOT/E2E percentiles per campaign, variant, workload and
   load over every successful measured request, each 3 times in a fresh process reading the snapshot
   (warehouse.db.reader; the first run and the median, the target judged on the slower), the percentiles
   also through `specgauge sql`'s sandbox (warehouse.db.restrict_file_access: Arrow reads the files);
   the reader snapshot's copy alone; the DuckDB file's and the Parquet files' size.

    .venv/bin/python benchmarks/warehouse_bench.py [--sizes 1,10,100] [--workdir DIR] [--keep]

100x is about 100 million request rows: about 17 GB of Parquet under the work folder (a temporary folder
in /tmp by default), removed at the end. The machine's load average is printed with the results.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from warehouse import parts, sketches
from warehouse.db import _copy_snapshot, writer
from warehouse.ingest import ingest_raw

REPO = Path(__file__).resolve().parent.parent

console = Console(width=max(Console().width, 150))

CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
RATES = (0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PERCENTILES = """
SELECT c.campaign_id, c.variant, c.workload, c.load_label,
       count(*) AS requests,
       quantile_cont(r.ttft_s, [0.5, 0.9, 0.99]) AS ttft_p50_p90_p99,
       quantile_cont(r.tpot_s, [0.5, 0.9, 0.99]) AS tpot_p50_p90_p99,
       quantile_cont(r.e2e_s, [0.5, 0.99]) AS e2e_p50_p99
FROM requests r
JOIN v_cells c USING (cell_key)
WHERE r.phase = 'measured' AND r.ok
GROUP BY ALL
"""
SPEEDUP = "SELECT * FROM v_speedup"
# The campaign's small tables, copied inside DuckDB when the warehouse grows (keyed by cell or deployment).
# The sketch rollup (sketch_groups, group_sketches) is not copied but brought up to date by the ingest's own
# sketches.roll_up over the copies' cells, as if they had been ingested.
CELL_TABLES = ("cells", "spec_decode", "spec_decode_positions", "cell_sketches")


def _fixtures() -> Any:
    """The tests' raw-tree builder (tests/warehouse_fixtures.py): the benchmark ingests what the tests do."""
    sys.path.insert(0, str(REPO / "tests"))
    return importlib.import_module("warehouse_fixtures")


def build_raw(raw_dir: Path, requests_per_cell: int, repeats: int) -> Any:
    fixtures = _fixtures()
    spec = fixtures.make_spec(
        name="bench",
        concurrencies=CONCURRENCIES,
        rates=RATES,
        repeats=repeats,
        requests=requests_per_cell - 10,
        warmup=10,
        strata=("chat", "code", "summarization"),
    )
    spec = spec.model_copy(update={"capture": spec.capture.model_copy(update={"enabled": False})})
    builder = fixtures.RawBuilder(raw_dir, spec=spec, fast_frames=True)
    builder.write_all(captures=False)
    return builder


def another_campaign(campaign_dir: Path, new_id: str, into: Path) -> Path:
    """A copy of a raw campaign under another campaign id: JSON documents rewritten (ids inside them must
    match their place), everything else hard-linked (raw files are immutable). Returns its directory."""
    old_id = campaign_dir.name
    target = into / new_id
    for path in sorted(campaign_dir.rglob("*")):
        dest = target / str(path.relative_to(campaign_dir)).replace(old_id, new_id)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        elif path.suffix == ".json":
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(path.read_text().replace(old_id, new_id))
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, dest)
    return target


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def grow(db: Path, base: str, copies: range) -> None:
    """Add copies of campaign `base` under the ids `<base>~n` (n in `copies`): small tables inside DuckDB,
    request and gauge rows as new Parquet files listed in the manifest, in one transaction."""
    with writer(db) as con:
        root = parts.root_of(con)
        assert root is not None
        written: list[parts.PartFile] = []
        sources = {
            table: pq.read_table([str(f) for f in _campaign_files(con, root, table, base)])
            for table in parts.PARTED_TABLES
        }
        for n in copies:
            new = f"{base}~{n}"
            for table, rows in sources.items():
                keys = pc.replace_substring(
                    rows.column("cell_key"), f"{base}/", f"{new}/", max_replacements=1
                )
                copy = rows.set_column(rows.schema.get_field_index("cell_key"), "cell_key", keys)
                written.append(parts.write_part(root, table, new, copy, f"grow{n}"))
        numbers = f"(SELECT unnest({list(copies)}) AS n)"
        like = f"'{base}/%'"
        con.execute("BEGIN TRANSACTION")
        for table in CELL_TABLES:
            columns = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            replaced = [f"replace(cell_key, '{base}/', '{base}~' || n || '/') AS cell_key"]
            for column in ("campaign_id", "deployment_id", "source_path"):
                if column in columns:
                    replaced.append(f"replace({column}, '{base}', '{base}~' || n) AS {column}")
            con.execute(
                f"INSERT INTO {table} SELECT {table}.* REPLACE ({', '.join(replaced)}) "
                f"FROM {table}, {numbers} WHERE cell_key LIKE {like}"
            )
        con.execute(
            f"INSERT INTO deployments SELECT deployments.* REPLACE (replace(deployment_id, '{base}', "
            f"'{base}~' || n) AS deployment_id, '{base}~' || n AS campaign_id) "
            f"FROM deployments, {numbers} WHERE campaign_id = '{base}'"
        )
        con.execute(
            f"INSERT INTO campaigns SELECT campaigns.* REPLACE ('{base}~' || n AS campaign_id) "
            f"FROM campaigns, {numbers} WHERE campaign_id = '{base}'"
        )
        copied = [f"{base}~{n}" for n in copies]
        new_cells = con.execute("SELECT cell_key FROM cells WHERE campaign_id = ANY(?)", [copied]).fetchall()
        sketches.roll_up(con, [key for (key,) in new_cells])  # their rows read back from cell_sketches
        parts.record(con, root, written)
        con.execute("COMMIT")


def _campaign_files(con: Any, root: Path, table: str, campaign: str) -> list[Path]:
    names = con.execute(
        f"SELECT file FROM {parts.MANIFEST} WHERE table_name = ? AND campaign_id = ? ORDER BY file",
        [table, campaign],
    ).fetchall()
    return [root / n for (n,) in names]


QUERY_TIMER = """
import json, sys, time
from warehouse.db import reader, reads_only, restrict_file_access
times = []
with reader(sys.argv[1]) as con:
    if sys.argv[4] == "sandbox":
        restrict_file_access(con, reads_only=reads_only(sys.argv[2]))
    for _ in range(int(sys.argv[3])):
        started = time.perf_counter()
        rows = con.sql(sys.argv[2]).to_arrow_table().num_rows
        times.append(time.perf_counter() - started)
print(json.dumps({"times": times, "rows": rows}))
"""


def query_times(db: Path, sql: str, mode: str = "reader", runs: int = 3) -> tuple[float, float, int]:
    """Run a query `runs` times in a fresh process reading the snapshot (`mode` sandbox: as `specgauge sql`
    does, no file reachable but through the warehouse's views)."""
    done = subprocess.run(
        [sys.executable, "-c", QUERY_TIMER, str(db), sql, str(runs), mode],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["times"][0], statistics.median(result["times"]), result["rows"]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def count(db: Path, sql: str) -> int:
    from warehouse.db import reader

    with reader(db) as con:
        found = con.execute(sql).fetchone()
        assert found is not None
        return int(found[0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests-per-cell", type=int, default=1011)
    parser.add_argument("--repeats", type=int, default=5, help="5 gives 990 cells")
    parser.add_argument("--sizes", default="1,10,100", help="warehouse sizes, in campaigns")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="first, where one ingest's seconds go (benchmarks/ingest_profile.py)",
    )
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    work = Path(tempfile.mkdtemp(prefix="warehouse-bench-", dir=args.workdir))
    load_before = os.getloadavg()
    results: list[dict[str, Any]] = []
    loads: list[str] = []
    try:
        console.print(f"work folder {work}; load average before: {load_before[0]:.2f} (1 min)")
        seconds, builder = timed(lambda: build_raw(work / "raw", args.requests_per_cell, args.repeats))
        cells = sum(len(d.cells) for d in builder.plan.deployments)
        base = builder.campaign_id
        raw_mb = folder_bytes(work / "raw") / 1e6
        console.print(f"wrote {cells} cells, {raw_mb:.0f} MB of raw artifacts in {seconds:.1f} s")
        os.sync()  # the fixture's writeback would otherwise land inside the ingest's time
        if args.profile:
            print_profile(builder.campaign_dir, work / "profile")

        db = work / "w.duckdb"
        present, next_copy, request_rows = 0, 1, 0
        for size in sizes:
            if size - 1 > present:
                copies = range(next_copy, next_copy + size - 1 - present)
                grow_s, _ = timed(lambda: grow(db, base, copies))  # noqa: B023
                console.print(f"grew by {len(copies)} copies of the campaign in {grow_s:.1f} s")
                present, next_copy = size - 1, copies.stop
            # One more campaign: the first is the raw campaign itself, later ones a copy under a new id.
            probe = (
                builder.campaign_dir
                if present == 0
                else another_campaign(builder.campaign_dir, f"{base}-p{size}", work / "probe")
            )
            os.sync()
            load = os.getloadavg()[0]
            ingest_s, report = timed(lambda: ingest_raw(probe, db))  # noqa: B023
            assert report.ok, report.as_dict()  # type: ignore[attr-defined]
            request_rows = report.rows_by_table["requests"]  # type: ignore[attr-defined]
            present += 1
            if probe != builder.campaign_dir:
                shutil.rmtree(probe.parent)
            total = count(db, "SELECT count(*) FROM requests")
            row: dict[str, Any] = {
                "size": size,
                "requests": total,
                "campaigns": count(db, "SELECT count(*) FROM campaigns"),
                "ingest_s": ingest_s,
                "ingest_rows_s": request_rows / ingest_s,
                "load": load,
                # the 1-minute average just after the ingest: mostly the ingest's own minute
                "load_after": os.getloadavg()[0],
            }
            for name, sql, mode in (
                ("speedup", SPEEDUP, "reader"),
                ("percentiles", PERCENTILES, "reader"),
                ("percentiles_sandbox", PERCENTILES, "sandbox"),
            ):
                first_q, median_q, n = query_times(db, sql, mode)
                row[name] = (first_q, median_q, n)
            row["snapshot_s"], _ = timed(lambda: _copy_snapshot(db))
            row["duckdb_mb"] = db.stat().st_size / 1e6
            row["parquet_mb"] = folder_bytes(parts.parts_dir(db)) / 1e6
            loads.append(f"{size}x: {os.getloadavg()[0]:.2f}")
            results.append(row)
            console.print(row)
    finally:
        if args.keep:
            console.print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    load_after = os.getloadavg()
    report_table(results, load_before[0], load_after[0], loads)


def print_profile(campaign_dir: Path, folder: Path) -> None:
    """The 1x ingest into a fresh warehouse with each step timed, as run and serial (CPU per step)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from ingest_profile import profile_ingest, profile_table

    for serial in (False, True):
        load = os.getloadavg()[0]
        profile = profile_ingest(campaign_dir, folder / f"{serial}" / "w.duckdb", serial=serial)
        title = f"one ingest, {'serial' if serial else 'as run'}: load average {load:.2f} before"
        console.print(profile_table(profile, f"{title}, {os.getloadavg()[0]:.2f} after"))
        shutil.rmtree(folder / f"{serial}")


def figures_table(title: str, head: Sequence[str], lines: Sequence[Sequence[str]]) -> Table:
    """`lines` under `head` as a rich table, every column right-aligned (they are figures)."""
    table = Table(title=title, title_justify="left")
    for column in head:
        table.add_column(column, justify="right")
    for line in lines:
        table.add_row(*line)
    return table


def print_markdown(out: Console, head: Sequence[str], lines: Sequence[Sequence[str]]) -> None:
    """The same table as markdown, to paste into the docs."""
    out.print("markdown:\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for line in lines:
        out.print("| " + " | ".join(line) + " |", highlight=False, markup=False)


def report_table(
    results: list[dict[str, Any]], load_before: float, load_after: float, loads: list[str]
) -> None:
    head = (
        "size",
        "request rows",
        "one more campaign: s",
        "rows/s",
        "v_speedup s (first/median)",
        "percentiles s (first/median)",
        "percentiles, sql sandbox s",
        "snapshot copy s",
        "DuckDB MB",
        "Parquet MB",
    )
    lines = []
    for r in results:
        limit = 2.0 if r["size"] <= 10 else 10.0
        met = max(r["speedup"][:2]) < limit and max(r["percentiles"][:2]) < limit
        lines.append(
            (
                f"{r['size']}x",
                f"{r['requests']:,}",
                f"{r['ingest_s']:.2f}",
                f"{r['ingest_rows_s']:,.0f}" + ("" if r["ingest_rows_s"] >= 200_000 else " (MISSED)"),
                f"{r['speedup'][0]:.2f} / {r['speedup'][1]:.2f}",
                f"{r['percentiles'][0]:.2f} / {r['percentiles'][1]:.2f}" + ("" if met else " (MISSED)"),
                f"{r['percentiles_sandbox'][0]:.2f} / {r['percentiles_sandbox'][1]:.2f}",
                f"{r['snapshot_s']:.3f}",
                f"{r['duckdb_mb']:,.0f}",
                f"{r['parquet_mb']:,.0f}",
            )
        )
    console.print(figures_table("Warehouse at 1x/10x/100x", head, lines))
    if len(results) > 1:
        small = results[0]
        ratios = Table(title=f"Ratios to {small['size']}x", title_justify="left")
        for column in ("size", "rows", "one more campaign", "v_speedup", "percentiles", "snapshot copy"):
            ratios.add_column(column, justify="right")
        for r in results[1:]:
            ratios.add_row(
                f"{r['size']}x",
                f"{r['requests'] / small['requests']:.1f}",
                f"{r['ingest_s'] / small['ingest_s']:.2f}",
                f"{r['speedup'][1] / small['speedup'][1]:.1f}",
                f"{r['percentiles'][1] / small['percentiles'][1]:.1f}",
                f"{r['snapshot_s'] / small['snapshot_s']:.1f}",
            )
        console.print(ratios)
    console.print(
        f"{os.cpu_count()} CPUs; load average (1 min) {load_before:.2f} before, {load_after:.2f} after; "
        f"at the end of each size {', '.join(loads)}; at each ingest (before -> after) "
        + ", ".join(f"{r['size']}x: {r['load']:.2f} -> {r['load_after']:.2f}" for r in results)
    )
    print_markdown(console, head, lines)


if __name__ == "__main__":
    main()
