"""Warehouse speed: ingest of about 1 million request rows, and v_speedup plus a latency-percentile query over
about 10 million request rows. Targets on the project's 2-core machine: ingest >= 200,000 rows/s, each query
under 2 s.

1. Writes a synthetic campaign (tests/warehouse_fixtures.py, the documented raw layout): 3 variants x 5 repeats
   x 3 workload strata x 22 loads = 990 cells of 1,011 requests each (1,000,890 request rows, chunk lists of
   15-32 entries), with deployments, campaign.json and a run record.
2. Ingests it into a fresh warehouse twice, side by side: batched transactions (the default) and one
   transaction per cell (`per_artifact=True`), then once more to time the idempotent skip.
3. Grows the batched warehouse to 10x (copies of every cell under new campaign ids, inside DuckDB), then
   times `SELECT * FROM v_speedup` and TTFT/TPOT percentiles per variant, workload and load over every
   measured request, in a fresh process reading the snapshot, as `specgauge sql` does. Each query runs 3
   times: the first run and the median are reported, and the target is judged on the slower of the two.
4. Reports the cost of the reader snapshot (the copy a writer makes when it finishes) at both sizes.

    .venv/bin/python benchmarks/warehouse_bench.py [--copies 10] [--workdir DIR] [--keep] [--no-per-cell]

Uses about 3 GB under the work folder (a temporary folder in /tmp by default), removed at the end.
The machine's load average is printed with the results: other work on the 2 cores slows every figure.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from warehouse.db import _copy_snapshot, writer
from warehouse.ingest import ingest_raw

REPO = Path(__file__).resolve().parent.parent

console = Console(width=max(Console().width, 130))

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
DATA_TABLES = ("cells", "requests", "gauges", "spec_decode", "spec_decode_positions")


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


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def grow(db: Path, copies: int) -> int:
    """Add copies-1 copies of every cell under new campaign ids (<id>~n), so views pair within each copy."""
    with writer(db) as con:
        for table in DATA_TABLES:
            columns = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            replaced = ["cell_key || '~' || n AS cell_key"]
            if "campaign_id" in columns:
                replaced.append("campaign_id || '~' || n AS campaign_id")
            if "deployment_id" in columns:
                replaced.append("deployment_id || '~' || n AS deployment_id")
            con.execute(
                f"INSERT INTO {table} SELECT {table}.* REPLACE ({', '.join(replaced)}) "
                f"FROM {table}, range(1, {copies}) t(n) WHERE NOT contains(cell_key, '~')"
            )
        con.execute(
            f"INSERT INTO campaigns SELECT campaigns.* REPLACE (campaign_id || '~' || n AS campaign_id) "
            f"FROM campaigns, range(1, {copies}) t(n)"
        )
        return con.execute("SELECT count(*) FROM requests").fetchone()[0]


QUERY_TIMER = """
import json, sys, time
from warehouse.db import reader
times = []
with reader(sys.argv[1]) as con:
    for _ in range(int(sys.argv[3])):
        started = time.perf_counter()
        rows = con.sql(sys.argv[2]).to_arrow_table().num_rows
        times.append(time.perf_counter() - started)
print(json.dumps({"times": times, "rows": rows}))
"""


def query_times(db: Path, sql: str, runs: int = 3) -> tuple[float, float, int]:
    """Run a query `runs` times in a fresh process reading the snapshot, as `specgauge sql` does."""
    done = subprocess.run(
        [sys.executable, "-c", QUERY_TIMER, str(db), sql, str(runs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["times"][0], statistics.median(result["times"]), result["rows"]


def snapshot_seconds(db: Path) -> float:
    seconds, _ = timed(lambda: _copy_snapshot(db))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests-per-cell", type=int, default=1011)
    parser.add_argument("--repeats", type=int, default=5, help="5 gives 990 cells")
    parser.add_argument("--copies", type=int, default=10, help="query at this many times the ingested rows")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--no-per-cell", action="store_true", help="skip the one-transaction-per-cell comparison (minutes)"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="warehouse-bench-", dir=args.workdir))
    load_before = os.getloadavg()
    results: list[tuple[str, str, str, str, str]] = []
    try:
        console.print(f"work folder {work}; load average before: {load_before[0]:.2f} (1 min)")
        seconds, builder = timed(lambda: build_raw(work / "raw", args.requests_per_cell, args.repeats))
        cells = sum(len(d.cells) for d in builder.plan.deployments)
        raw_mb = sum(p.stat().st_size for p in (work / "raw").rglob("*") if p.is_file()) / 1e6
        console.print(f"wrote {cells} cells, {raw_mb:.0f} MB of raw artifacts in {seconds:.1f} s")
        os.sync()  # the fixture's writeback would otherwise land inside the ingest's time

        batched_db, single_db = work / "batched.duckdb", work / "per-cell.duckdb"
        batched_s, report = timed(lambda: ingest_raw(builder.raw_dir, batched_db))
        assert report.ok, report.as_dict()
        request_rows = report.rows_by_table["requests"]
        all_rows = report.rows
        results.append(
            (
                "ingest, batched transactions (default)",
                f"{request_rows:,} requests ({all_rows:,} rows)",
                f"{batched_s:.2f}",
                f"{request_rows / batched_s:,.0f}",
                _verdict(request_rows / batched_s >= 200_000),
            )
        )
        if not args.no_per_cell:
            single_s, single = timed(lambda: ingest_raw(builder.raw_dir, single_db, per_artifact=True))
            assert single.ok and single.rows_by_table["requests"] == request_rows
            single_db.unlink()
            results.append(
                (
                    "ingest, one transaction per cell",
                    f"{request_rows:,} requests",
                    f"{single_s:.2f}",
                    f"{request_rows / single_s:,.0f}",
                    f"batched is {single_s / batched_s:.1f}x faster",
                )
            )
        skip_s, again = timed(lambda: ingest_raw(builder.raw_dir, batched_db))
        assert again.rows == 0
        results += [
            (
                "re-ingest (all skipped: hash only)",
                f"{cells} cells",
                f"{skip_s:.2f}",
                f"{request_rows / skip_s:,.0f}",
                "",
            ),
            (
                "reader snapshot copy (1x)",
                f"{batched_db.stat().st_size / 1e6:,.0f} MB",
                f"{snapshot_seconds(batched_db):.2f}",
                "",
                "at the end of every write",
            ),
        ]
        shutil.rmtree(work / "raw")

        grow_s, total = timed(lambda: grow(batched_db, args.copies))
        console.print(f"grew the warehouse to {total:,} request rows in {grow_s:.1f} s")
        for label, sql in (
            ("SELECT * FROM v_speedup", "SELECT * FROM v_speedup"),
            ("TTFT/TPOT/E2E percentiles by variant, workload, load", PERCENTILES),
        ):
            first, median, n = query_times(batched_db, sql)
            results.append(
                (
                    f"query: {label}",
                    f"{total:,} requests -> {n:,} result rows",
                    f"{first:.2f} first, {median:.2f} median",
                    f"{total / max(first, median):,.0f}",
                    _verdict(max(first, median) < 2.0),
                )
            )
        results.append(
            (
                "reader snapshot copy (10x)",
                f"{batched_db.stat().st_size / 1e6:,.0f} MB",
                f"{snapshot_seconds(batched_db):.2f}",
                "",
                "at the end of every write",
            )
        )
    finally:
        if args.keep:
            console.print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    load_after = os.getloadavg()
    table = Table(title="Warehouse benchmark", title_justify="left")
    for column in ("step", "size", "seconds", "rows/s", "target / note"):
        table.add_column(column, justify="left" if column in ("step", "size", "target / note") else "right")
    for row in results:
        table.add_row(*row)
    console.print(table)
    console.print(
        f"{os.cpu_count()} CPUs; load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    console.print("markdown:\n| step | size | seconds | rows/s | target / note |\n|---|---|---:|---:|---|")
    for row in results:
        console.print("| " + " | ".join(row) + " |", highlight=False, markup=False)


def _verdict(met: bool) -> str:
    return "target met" if met else "TARGET MISSED"


if __name__ == "__main__":
    main()
