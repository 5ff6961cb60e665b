"""Break-even acceptance measured from synthetic-acceptance runs (analysis.breakeven), on a planted campaign:
speedup over plain planted as L / 2 at every load, so speculation pays above L* = 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import PlantedBuilder, profile

from analysis.data import AnalysisSettings, load_campaign
from analysis.run import compute
from experiments.spec import parse_spec
from warehouse.db import reader

PLAIN_TPOT = 0.020
DRIFT = [1.00, 1.05, 0.97]
NOISE = [1.01, 0.99, 1.005]
TRUE_BREAK_EVEN = 2.0
FAST = AnalysisSettings()


def spec(repeats: int):
    return parse_spec(
        {
            "name": "breakeven",
            "target": {"model": "models/tiny-target", "served_model_name": "tiny", "max_model_len": 2048},
            "variants": [
                {"name": "plain", "method": "none"},
                {
                    "name": "syn",
                    "method": "draft_model",
                    "k": 3,
                    "draft_model": "models/tiny-draft",
                    "synthetic_acceptance_length": [1.5, 2.5, 3.5],
                },
            ],
            "workloads": [{"file": "workloads/smoke.jsonl", "strata": ["chat"]}],
            "load": {"concurrencies": [1, 4], "requests": 16, "warmup": 2, "allow_short_cells": True},
            "repeats": repeats,
            "capture": {"corpus": "workloads/capture.jsonl", "plain_controls": 1},
            "validity": {"aa_control": False},  # the synthetic runs only: no A/A arm
            "launcher": {"kind": "local", "patches": ["cpu-synthetic-acceptance"]},
        }
    )


def plant(variant: str, repeat: int, workload: str, load: str):
    tpot = PLAIN_TPOT * DRIFT[repeat]
    if variant == "plain":
        return profile(tpot, None)
    length = float(variant.rsplit("-L", 1)[1])
    return profile(
        tpot / (length / TRUE_BREAK_EVEN) * NOISE[repeat], (length - 1) / 3, tokens_per_chunk=length
    )


def test_the_crossing_of_speedup_and_one_is_the_planted_break_even(tmp_path: Path) -> None:
    db = PlantedBuilder(tmp_path / "raw", spec=spec(repeats=3), plant=plant).build(
        tmp_path / "w.duckdb", gates=False
    )
    with reader(db) as con:
        data = load_campaign(con)
    results = compute(data, FAST)
    table = results.break_even
    assert table.height == 2  # one row per load
    for row in table.iter_rows(named=True):
        assert row["lengths"] == [1.5, 2.5, 3.5] and row["n_repeats"] == 3
        # TTFT is planted equal, so the throughput speedup is a little under the TPOT ratio: L* a bit above 2
        assert row["break_even"] == pytest.approx(TRUE_BREAK_EVEN, rel=0.05), row
        assert row["break_even_low"] <= row["break_even"] <= row["break_even_high"]
        assert row["break_even_high"] - row["break_even_low"] < 0.3 and row["note"] == ""
    assert results.recommendations == []  # synthetic variants measure cost: never recommended as a config


def test_one_repeat_has_no_interval_and_says_so(tmp_path: Path) -> None:
    db = PlantedBuilder(tmp_path / "raw", spec=spec(repeats=1), plant=plant).build(
        tmp_path / "w.duckdb", gates=False
    )
    with reader(db) as con:
        table = compute(load_campaign(con), FAST).break_even
    assert table["break_even_low"].null_count() == table.height and set(table["note"]) == {
        "one repeat: no interval"
    }
