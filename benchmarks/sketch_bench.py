"""Merged percentiles from the latency sketches stored at ingest (warehouse/sketches.py) at 1x, 10x, 100x and
1,000x, against the exact `quantile_cont` over the request rows, side by side, with the sketch's error.
Targets on the project's 2-core machine: merged percentiles at 100x under 2 s, at 1,000x under 10 s, error at
most 1% relative.

1. Writes and ingests the synthetic campaign of benchmarks/warehouse_bench.py (990 cells, 1,000,890 request
   rows; its sketch rows and group rollup written by the ingest: the seconds of `sketches.roll_up` inside
   it are summed) and times the sketch rows of its request rows alone (what the sketches add to an ingest).
2. At 1x, 10x, 100x (the warehouse grown with copies of that campaign, warehouse_bench.grow, sketch rows
   copied with the cells; the copies' rollup then built by `sketches.roll_up`, as an ingest builds it, and
   timed), each in a fresh process reading the snapshot, 3 runs each: `SELECT * FROM
   v_sketch_percentiles_merged` (TTFT/TPOT/E2E/ITL p50/p90/p95/p99 per campaign, variant, workload and load,
   over all their cells), which reads the rollup; "before": the same answer merged from the per-cell rows at
   query time (`sketches.MERGED_AT_QUERY_TIME`, the view before migration 0022), checked equal; and, once,
   the exact TTFT/TPOT/E2E percentiles with `quantile_cont` over the request rows. The sketch's relative
   error against the exact p50/p90/p99 of every group and metric: max and median.
3. At 1,000x (a billion request values): a copy of the 1x warehouse whose cells are copied 1,000 times
   (small tables only) and whose sketch rows are generated here, from per-campaign distributions, in
   streaming chunks (2 processes): per cell 1,011 values each of TTFT, TPOT and E2E (log-normal, median and
   spread drawn per campaign, and per cell a launch-to-launch shift) and 2 ITL values per request of 64
   tokens each. Each chunk (one campaign copy) is inserted and rolled up (`sketches.roll_up`, timed apart)
   as an ingest batch is. No request rows are written. The exact percentiles are numpy's (linear, as
   quantile_cont) over the same generated values of every group; the merged view is timed as in 2.

    .venv/bin/python benchmarks/sketch_bench.py [--sizes 1,10,100] [--thousand | --no-thousand]
                                                [--workdir DIR] [--keep]

100x writes about 23 GB of Parquet (request rows) under the work folder, removed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from rich.console import Console

from warehouse import sketches
from warehouse.db import _copy_snapshot, reader, snapshot_path, writer
from warehouse.ingest import ingest_raw

REPO = Path(__file__).resolve().parent.parent
console = Console(width=max(Console().width, 150))

GROUP = ("campaign_id", "variant", "workload", "load_label")
MERGED = "SELECT * FROM v_sketch_percentiles_merged"
BEFORE = sketches.MERGED_AT_QUERY_TIME
# The exact figures the sketch is judged against, per group: quantile_cont over every successful measured
# request (TPOT over those of 2 tokens or more, as the summary and the sketch define it).
EXACT = """
SELECT c.campaign_id, c.variant, c.workload, c.load_label, m.metric,
       quantile_cont(CASE m.metric WHEN 'ttft' THEN r.ttft_s WHEN 'e2e' THEN r.e2e_s
                     ELSE CASE WHEN r.completion_tokens >= 2 THEN r.tpot_s END END, [0.5, 0.9, 0.99]) AS exact
FROM requests r
JOIN v_cells c USING (cell_key)
CROSS JOIN (VALUES ('ttft'), ('tpot'), ('e2e')) m(metric)
WHERE r.phase = 'measured' AND r.ok
GROUP BY ALL
"""
QUANTILES = (0.5, 0.9, 0.99)
CELL_VALUES = 1011  # values of each metric per cell at 1,000x: the 1x campaign's requests per cell
ITL_GAPS, ITL_TOKENS = 2, 64  # per request at 1,000x: gaps, each carrying this many tokens

QUERY_TIMER = """
import json, sys, time
from warehouse.db import reader
db, sql, runs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
times = []
with reader(db) as con:
    for _ in range(runs):
        started = time.perf_counter()
        table = con.sql(sql).to_arrow_table()
        times.append(time.perf_counter() - started)
if out:
    import pyarrow.parquet as pq
    pq.write_table(table, out)
print(json.dumps({"times": times, "rows": table.num_rows}))
"""


def _warehouse_bench() -> Any:
    spec = importlib.util.spec_from_file_location(
        "warehouse_bench", REPO / "benchmarks" / "warehouse_bench.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def query(db: Path, sql: str, runs: int = 3, out: Path | None = None) -> tuple[float, float, int]:
    """(first, median, result rows) of `runs` runs in a fresh process reading the snapshot; the last
    result written to `out` when given."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            QUERY_TIMER,
            str(db),
            sql,
            str(runs),
            str(out or ""),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["times"][0], statistics.median(result["times"]), result["rows"]


def errors(merged: pl.DataFrame, exact: pl.DataFrame) -> dict[str, float]:
    """Relative error of the sketch's p50/p90/p99 against the exact ones, over every group and metric."""
    exact = exact.with_columns(
        **{f"exact_p{round(q * 100)}": pl.col("exact").list.get(i) for i, q in enumerate(QUANTILES)}
    )
    joined = merged.join(exact, on=[*GROUP, "metric"])
    assert joined.height == exact.height, (joined.height, exact.height)
    out: dict[str, float] = {"groups": float(joined.height)}
    every = []
    for q in QUANTILES:
        p = round(q * 100)
        rel = ((joined[f"p{p}_s"] - joined[f"exact_p{p}"]).abs() / joined[f"exact_p{p}"]).to_numpy()
        out[f"p{p}_max"], out[f"p{p}_median"] = float(rel.max()), float(np.median(rel))
        every.append(rel)
    out["max"] = float(np.concatenate(every).max())
    return out


@contextmanager
def timing_roll_ups() -> Iterator[list[float]]:
    """The seconds of every `sketches.roll_up` call made inside (the ingest's calls, through
    `sketches.insert`, which looks the function up in its module at each call)."""
    seconds: list[float] = []
    real = sketches.roll_up

    def timed(*args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        try:
            real(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)

    sketches.roll_up = timed  # type: ignore[assignment]
    try:
        yield seconds
    finally:
        sketches.roll_up = real  # type: ignore[assignment]


def roll_up_copies(db: Path, campaigns: list[str]) -> float:
    """The group rollup of copied campaigns (their cells and sketch rows already there), built by
    `sketches.roll_up` as an ingest builds it, in one transaction; its seconds."""
    with writer(db) as con:
        found = con.execute("SELECT cell_key FROM cells WHERE campaign_id = ANY(?)", [campaigns]).fetchall()
        started = time.perf_counter()
        con.execute("BEGIN TRANSACTION")
        sketches.roll_up(con, [key for (key,) in found])
        con.execute("COMMIT")
        return time.perf_counter() - started


def same_answers(new: Path, before: Path) -> None:
    """The view over the rollup answers exactly what the merge at query time answers."""
    order = [*GROUP, "metric"]
    a, b = pl.read_parquet(new).sort(order), pl.read_parquet(before).sort(order)
    if not a.equals(b):
        raise AssertionError(f"the rollup's answers differ from the merge at query time: {a} {b}")


def measure_size(db: Path, size: int, work: Path) -> dict[str, Any]:
    """Sketch (the rollup, and before: merged at query time) and exact timings and the sketch's error at
    one size."""
    row: dict[str, Any] = {"size": f"{size}x", "load_before": os.getloadavg()[0]}
    with reader(db) as con:
        row["values"] = con.execute(
            "SELECT count(*) FROM requests WHERE phase = 'measured' AND ok"
        ).fetchone()[0]  # type: ignore[index]
        row["sketch_rows"] = con.execute("SELECT count(*) FROM cell_sketches").fetchone()[0]  # type: ignore[index]
        row["group_rows"] = con.execute("SELECT count(*) FROM group_sketches").fetchone()[0]  # type: ignore[index]
    merged_out, exact_out = work / f"merged{size}.parquet", work / f"exact{size}.parquet"
    row["sketch_s"] = query(db, MERGED, out=merged_out)
    row["before_s"] = query(db, BEFORE, out=work / f"before{size}.parquet")
    same_answers(merged_out, work / f"before{size}.parquet")
    row["exact_s"] = query(db, EXACT, runs=1, out=exact_out)
    row["error"] = errors(pl.read_parquet(merged_out), pl.read_parquet(exact_out))
    row["load_during"] = os.getloadavg()[0]
    return row


# ------------------------------------------------------------------------------------------------ 1,000x


def _campaign_sketch(args: tuple[int, list[str], np.ndarray, int]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One campaign copy's sketch rows and its groups' exact percentiles, from values generated here.
    `cells`: its cell keys; `group_of`: each cell's group (0..groups-1, every group `repeats` cells)."""
    copy, cells, group_of, seed = args
    rng = np.random.default_rng([seed, copy])
    n_cells, groups = len(cells), int(group_of.max()) + 1
    # per campaign: a median scale and a spread per metric; per group a median; per cell a launch shift
    scale = rng.uniform(0.5, 2.0)
    medians = {"ttft": 0.05, "tpot": 0.015, "e2e": 0.05 + 0.015 * 255, "itl": 0.015}
    spreads = {"ttft": (0.08, 0.16), "tpot": (0.04, 0.08), "e2e": (0.03, 0.06), "itl": (0.04, 0.10)}
    frames, exact_rows = [], []
    order = np.argsort(group_of, kind="stable")  # cells of one group together
    for metric, median in medians.items():
        sigma = rng.uniform(*spreads[metric])
        mu_group = np.log(median * scale) + rng.normal(0, 0.3, groups)
        mu_cell = mu_group[group_of] + rng.normal(0, 0.02, n_cells)
        per_cell = CELL_VALUES * (ITL_GAPS if metric == "itl" else 1)
        logs = mu_cell[:, None] + sigma * rng.standard_normal((n_cells, per_cell))
        # bucket = ceil(log2(v) * multiplier): ln(v) is what was drawn, so no exp and log round trip
        keys = np.ceil(logs * (sketches.MAPPING._multiplier / np.log(2))).astype(np.int64)
        low = int(keys.min())
        span = int(keys.max()) - low + 1
        flat = (np.arange(n_cells)[:, None] * span + (keys - low)).ravel()
        counts = np.bincount(flat, minlength=n_cells * span).reshape(n_cells, span)
        cell_idx, offset = np.nonzero(counts)
        weight = ITL_TOKENS if metric == "itl" else 1
        frames.append(
            pl.DataFrame(
                {
                    "cell_key": np.asarray(cells)[cell_idx],
                    "block": np.zeros(cell_idx.size, dtype=np.int32),
                    "metric": metric,
                    "bucket": (offset + low).astype(np.int32),
                    "count": counts[cell_idx, offset].astype(np.int64) * weight,
                }
            )
        )
        by_group = logs[order].reshape(groups, -1)  # a group's values in one row
        exact_rows.append(_exact(by_group, weight, metric, copy))
    return pl.concat(frames), pl.concat(exact_rows)


def _exact(logs: np.ndarray, weight: int, metric: str, copy: int) -> pl.DataFrame:
    """Each row's exact p50/p90/p99 of exp(logs), every value counted `weight` times, interpolated linearly
    between the two values around rank q (n - 1), as numpy's default and quantile_cont."""
    m = logs.shape[1]
    n = m * weight
    ranks = [q * (n - 1) for q in QUANTILES]
    needed = sorted(
        {int(np.floor(r)) // weight for r in ranks}
        | {min(int(np.floor(r)) + 1, n - 1) // weight for r in ranks}
    )
    part = np.partition(logs, needed, axis=1)
    out = []
    for r in ranks:
        lo = int(np.floor(r))
        hi = min(lo + 1, n - 1)
        v_lo, v_hi = np.exp(part[:, lo // weight]), np.exp(part[:, hi // weight])
        out.append(v_lo + (r - lo) * (v_hi - v_lo))
    return pl.DataFrame(
        {
            "copy": copy,
            "group": np.arange(logs.shape[0]),
            "metric": metric,
            "exact": np.stack(out, axis=1).tolist(),
        }
    )


def thousand(db: Path, base: str, copies: int, work: Path, seed: int = 32) -> dict[str, Any]:
    """The 1,000x warehouse (see the module docstring) and its timings and errors."""
    big = work / "t.duckdb"
    new_id = f"CASE WHEN n = 0 THEN '{base}' ELSE '{base}~' || n END"
    with writer(big) as con:  # migrated: the schema and views; cells copied from the 1x campaign's
        con.execute(f"ATTACH '{snapshot_path(db)}' AS src (READ_ONLY)")
        cells = con.sql(
            "SELECT cell_key, variant, workload, load_label FROM src.cells "
            f"WHERE campaign_id = '{base}' ORDER BY cell_key"
        ).pl()
        columns = {r[0] for r in con.execute("DESCRIBE src.cells").fetchall()}
        replaced = [f"replace(cell_key, '{base}/', {new_id} || '/') AS cell_key", f"{new_id} AS campaign_id"]
        replaced += [
            f"replace({c}, '{base}', {new_id}) AS {c}"
            for c in ("deployment_id", "source_path")
            if c in columns
        ]
        con.execute(
            f"INSERT INTO cells SELECT c.* REPLACE ({', '.join(replaced)}) "
            f"FROM src.cells c, (SELECT unnest(range({copies})) AS n) WHERE c.campaign_id = '{base}'"
        )
        con.execute("DETACH src")
    cells = cells.with_columns(g=pl.struct("variant", "workload", "load_label").rank("dense") - 1)
    groups = cells.select("g", "variant", "workload", "load_label").unique()
    started = time.perf_counter()
    exact_parts, rows, roll_up_s = [], 0, 0.0
    with writer(big) as con:
        keys, group_of = cells["cell_key"].to_list(), cells["g"].to_numpy()
        for sketch, exact in _generated(keys, group_of, base, copies, seed):
            # one transaction per campaign copy, as the ingest writes a batch (and no result left unread
            # before register)
            con.execute("BEGIN TRANSACTION")
            con.register("_rows", sketch.to_arrow())
            con.execute("INSERT INTO cell_sketches SELECT * FROM _rows").fetchall()
            con.unregister("_rows")
            rolling = time.perf_counter()  # the copy's rollup, as an ingest batch's
            sketches.roll_up(con, sketch.get_column("cell_key").unique(), sketch)
            roll_up_s += time.perf_counter() - rolling
            con.execute("COMMIT")
            rows += sketch.height
            exact_parts.append(exact)
        group_rows = con.execute("SELECT count(*) FROM group_sketches").fetchone()[0]  # type: ignore[index]
    row: dict[str, Any] = {
        "size": f"{copies}x",
        "values": copies * cells.height * CELL_VALUES,
        "sketch_rows": rows,
        "group_rows": group_rows,
        "generate_s": time.perf_counter() - started,
        "roll_up_s": roll_up_s,
        "load_before": os.getloadavg()[0],
    }
    merged_out = work / "merged-thousand.parquet"
    row["sketch_s"] = query(big, MERGED, out=merged_out)
    row["before_s"] = query(big, BEFORE, out=work / "before-thousand.parquet")
    same_answers(merged_out, work / "before-thousand.parquet")
    row["exact_s"] = None
    row["error"] = _thousand_errors(pl.read_parquet(merged_out), pl.concat(exact_parts), groups, base)
    row["load_during"] = os.getloadavg()[0]
    return row


def _generated(
    cells: list[str], group_of: np.ndarray, base: str, copies: int, seed: int
) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    def keys(n: int) -> list[str]:
        return cells if n == 0 else [c.replace(f"{base}/", f"{base}~{n}/", 1) for c in cells]

    # spawned, not forked: a fork of a process running polars' and DuckDB's threads can hang the child
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from pool.map(
            _campaign_sketch, ((n, keys(n), group_of, seed) for n in range(copies)), chunksize=4
        )


def _thousand_errors(
    merged: pl.DataFrame, exact: pl.DataFrame, groups: pl.DataFrame, base: str
) -> dict[str, float]:
    named = exact.join(groups, left_on="group", right_on="g")
    named = named.with_columns(
        campaign_id=pl.when(pl.col("copy") == 0)
        .then(pl.lit(base))
        .otherwise(pl.lit(f"{base}~") + pl.col("copy").cast(pl.String))
    )
    return errors(merged, named.select(*GROUP, "metric", "exact"))


# ------------------------------------------------------------------------------------------------ the run


def sketch_cost(db: Path) -> tuple[int, float]:
    """The request rows of the warehouse and the seconds sketches.sketch_rows takes over them."""
    with reader(db) as con:
        requests = con.sql("SELECT * FROM requests").pl()
    started = time.perf_counter()
    sketches.sketch_rows(requests)
    return requests.height, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1,10,100", help="warehouse sizes, in campaigns")
    parser.add_argument("--thousand", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--copies", type=int, default=1000, help="campaign copies of the generated size")
    parser.add_argument("--requests-per-cell", type=int, default=1011, help="of the written campaign")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    bench = _warehouse_bench()
    work = Path(tempfile.mkdtemp(prefix="sketch-bench-", dir=args.workdir))
    load_before = os.getloadavg()[0]
    results: list[dict[str, Any]] = []
    try:
        console.print(f"work folder {work}; load average before: {load_before:.2f} (1 min)")
        builder = bench.build_raw(work / "raw", args.requests_per_cell, 5)
        os.sync()
        db = work / "w.duckdb"
        with timing_roll_ups() as roll_ups:
            ingest_s, report = bench.timed(lambda: ingest_raw(builder.campaign_dir, db))
        assert report.ok, report.as_dict()
        rows, sketch_s = sketch_cost(db)
        console.print(
            f"ingest of {rows:,} request rows {ingest_s:.2f} s, of which the group rollup "
            f"{sum(roll_ups):.2f} s ({len(roll_ups)} batches); the sketch rows alone take {sketch_s:.2f} s "
            "(measured apart, in this process)"
        )
        base, present = builder.campaign_id, 1
        for size in sizes:
            roll_up_s = sum(roll_ups) if size == present else 0.0  # 1x: the ingest's
            if size > present:
                bench.grow(db, base, range(present, size))
                roll_up_s = roll_up_copies(db, [f"{base}~{n}" for n in range(present, size)])
                present = size
            _copy_snapshot(db)
            results.append(measure_size(db, size, work) | {"roll_up_s": roll_up_s})
            console.print(results[-1])
        if args.thousand:
            shutil.rmtree(bench.parts.parts_dir(db) / "requests", ignore_errors=True)  # disk for 1,000x
            results.append(thousand(db, base, args.copies, work))
            console.print(results[-1])
    finally:
        if args.keep:
            console.print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report_table(bench, results, load_before, os.getloadavg()[0])


def report_table(bench: Any, results: list[dict[str, Any]], load_before: float, load_after: float) -> None:
    """The figures of every size (`bench`: benchmarks/warehouse_bench.py, whose table helpers it uses)."""
    head = (
        "size",
        "request values",
        "sketch rows (per cell)",
        "rollup rows",
        "rollup built s",
        "merged from the rollup s (first / median)",
        "before: merged at query time s (first / median)",
        "exact quantile_cont s",
        "error p50 max / median",
        "p90 max / median",
        "p99 max / median",
        "load before / during",
    )
    lines = []
    for r in results:
        e = r["error"]
        limit = 2.0 if r["size"] in ("1x", "10x", "100x") else 10.0
        met = "" if max(r["sketch_s"][:2]) < limit else " (MISSED)"
        lines.append(
            (
                r["size"],
                f"{r['values']:,}",
                f"{r['sketch_rows']:,}",
                f"{r['group_rows']:,}",
                f"{r['roll_up_s']:.2f}",
                f"{r['sketch_s'][0]:.2f} / {r['sketch_s'][1]:.2f}{met}",
                f"{r['before_s'][0]:.2f} / {r['before_s'][1]:.2f}",
                "-" if r["exact_s"] is None else f"{r['exact_s'][0]:.2f}",
                *(f"{e[f'p{p}_max']:.3%} / {e[f'p{p}_median']:.3%}" for p in (50, 90, 99)),
                f"{r['load_before']:.1f} / {r['load_during']:.1f}",
            )
        )
    console.print(bench.figures_table("Merged percentiles from sketches", head, lines))
    console.print(
        f"{os.cpu_count()} CPUs; load average (1 min) {load_before:.2f} before, {load_after:.2f} after"
    )
    bench.print_markdown(console, head, lines)


if __name__ == "__main__":
    main()
