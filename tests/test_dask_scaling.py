"""benchmarks/dask_scaling.py at its smallest: N = 1, 2 with a tiny closed-loop load, every side (one process,
issue 21's workers, a LocalCluster of real Dask worker processes) against real emulator processes, and two
steps of the saturation table. Checks the tables' rows and that every request of every cell was recorded,
once, with the cell's indices; no timing is judged here (the figures are docs/performance.md's, "Across hosts
on Dask")."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import dask_scaling  # a script of benchmarks/, which is no package


def test_each_side_records_every_request_at_one_and_two_processes(capsys: pytest.CaptureFixture[str]) -> None:
    load = dask_scaling.Load(streams=2, requests=6, tokens=4, step_ms=5.0)
    rows = dask_scaling.scaling_rows([1, 2], load)
    assert [(r["n"], r["side"]) for r in rows] == [(n, side) for n in (1, 2) for side in dask_scaling.SIDES]
    for r in rows:
        expected = load.streams * r["n"] + load.requests * r["n"]  # warm-up (one a stream) + measured
        assert r["expected_records"] == expected
        assert r["indices"] == list(range(expected)), (r["side"], r["n"])  # each request once, none lost
        assert r["requests_ok"] == r["requests"] == load.requests * r["n"]
        assert r["streams"] == load.streams * r["n"]
        assert r["chunks_per_s"] > 0 and r["load_cpu_per_s"] > 0  # (emulators: in 10 ms ticks, may read 0)
        assert not math.isnan(r["ttft_err_p99_ms"]) and not math.isnan(r["client_part_p99_ms"])
        assert (r["parent_cpu_per_s"] is None) == (r["side"] == "one process")
    dask_scaling.print_scaling(rows)
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)  # the header and one line a row
    assert table[1].startswith("| 1 | one process | 2 | 6/6 |")
    assert table[-1].startswith("| 2 | dask | 4 | 12/12 |")


def test_saturation_steps_raise_the_offered_rate_on_one_dask_worker() -> None:
    rows = dask_scaling.saturation_rows([2, 4], tokens=4, step_ms=5.0, window_s=0.5)
    assert [r["streams"] for r in rows] == [2, 4]
    assert rows[0]["offered_chunks_per_s"] < rows[1]["offered_chunks_per_s"]
    for r in rows:
        assert r["side"] == "dask" and r["n"] == 1
        assert r["indices"] == list(range(r["expected_records"]))
        assert r["requests_ok"] == r["requests"] >= 2 * r["streams"]
