"""Charts stay readable when intervals are wide (issue 30): ratios on a log axis centred on 1, bands clipped
to a stated range with a triangle where the interval runs past it, every point drawn (hollow without an
interval) with its n. Checked on planted frames, in the helpers' numbers and in the Vega-Lite specs (no
rendering needed), and one PNG through vl-convert."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from analysis.charts import (
    adaptation_chart,
    clip_ratio_band,
    clip_spread_band,
    latency_chart,
    ratio_range,
    save_chart,
    speedup_chart,
    tree_sim_chart,
)

WILD = (1e-6, 1e5)  # the demo of 2026-12-02: a band from 1e-6 to 1e5 around a speedup of 1.1


def speedups(wild: bool = True, single: bool = False) -> pl.DataFrame:
    """Closed-loop speedups of two variants, two workloads, three loads, throughput and TPOT; with `wild` one
    throughput interval is WILD around 1.1; with `single` one cell has one repeat (no interval)."""
    rows = []
    for variant, base in (("ngram-k3", 1.1), ("draft-k3", 1.35)):
        for workload in ("chat", "code"):
            for c in (1, 2, 4):
                for metric in ("throughput", "tpot_p50"):
                    est = base * (1 - 0.02 * c)
                    low, high, n = est / 1.08, est * 1.08, 3
                    if wild and (variant, workload, c, metric) == ("ngram-k3", "chat", 2, "throughput"):
                        est, (low, high) = 1.1, WILD
                    if single and (variant, workload, c) == ("draft-k3", "code", 4):
                        low, high, n = None, None, 1
                    rows.append(
                        {
                            "variant": variant,
                            "workload": workload,
                            "load_mode": "closed",
                            "concurrency": c,
                            "rate": None,
                            "load_label": f"c{c}",
                            "metric": metric,
                            "estimate": est,
                            "ci_low": low,
                            "ci_high": high,
                            "n_repeats": n,
                            "interval": f"n={n}, t on log-ratios" if n > 1 else "n=1, no interval",
                        }
                    )
    return pl.DataFrame(rows, schema_overrides={"rate": pl.Float64, "n_repeats": pl.Int32})


def layers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    inner = spec.get("spec", spec)
    return inner["layer"]


def dataset(spec: dict[str, Any]) -> list[dict[str, Any]]:
    (values,) = [v for v in spec["datasets"].values() if len(v) > 1]
    return values


def marks(spec: dict[str, Any], shape: str) -> list[dict[str, Any]]:
    return [layer for layer in layers(spec) if layer["mark"].get("shape") == shape]


# ------------------------------------------------------------------------------------------------- helpers


def test_a_wild_interval_is_clipped_and_flagged_both_ways_and_the_range_stays_around_the_estimates() -> None:
    frame = pl.DataFrame({"est": [1.1, 1.2], "low": [WILD[0], 1.1], "high": [WILD[1], 1.3]})
    out, r = clip_ratio_band(frame, "low", "high", "est")
    assert r == 2.0  # the points alone want 1.25x; the bands may widen it to 2x, not to 1e5
    wild, tame = out.row(0, named=True), out.row(1, named=True)
    assert (wild["low_shown"], wild["high_shown"]) == (0.5, 2.0)
    assert wild["past_low"] and wild["past_high"] and wild["has_band"] and wild["drawable"]
    assert wild["clip_note"] == "runs past both ends"
    assert (tame["low_shown"], tame["high_shown"]) == (1.1, 1.3)
    assert not tame["past_low"] and not tame["past_high"] and tame["clip_note"] == "fits"
    assert out["est"].to_list() == [1.1, 1.2]  # the points are never moved
    assert out["edge_low"].to_list() == [0.5, 0.5] and out["edge_high"].to_list() == [2.0, 2.0]


def test_the_ratio_range_is_symmetric_around_one_and_holds_every_point() -> None:
    assert ratio_range([1.0, 1.05]) == 1.25  # never narrower than 0.8x-1.25x
    assert ratio_range([0.5]) == ratio_range([2.0])  # symmetric in log space: 1/2 and 2 are as far from 1
    assert ratio_range([1.1], [1e-9, 1e9]) == 2.0  # a wild band alone widens it to 2x at most
    assert ratio_range([1.3], [1.0, 1.55]) == 1.75  # a tame band is held (rounded up to a round number)
    assert ratio_range([3.0], [math.inf]) == 8.0  # bands never push past RATIO_CAP...
    assert ratio_range([20.0]) >= 20.0 * 1.2  # ...but a point is never cut off
    assert ratio_range([0.05]) == ratio_range([20.0])
    assert ratio_range([None, math.nan, 0.0, -1.0, math.inf]) == 1.25  # nothing drawable: the narrowest


def test_null_nan_zero_infinite_and_zero_width_bounds() -> None:
    """A null or NaN bound is no band; zero width is no band; 0 or -inf runs past the bottom (a log axis
    cannot hold it), +inf past the top; an estimate that is not a positive number is not drawable."""
    frame = pl.DataFrame(
        {
            "est": [1.1, 1.1, 1.1, 1.1, 1.1, 0.0, math.inf],
            "low": [None, math.nan, 0.0, 1.0, 1.1, 0.9, 0.9],
            "high": [1.2, 1.2, math.inf, 1.2, 1.1, 1.1, 1.1],
        }
    )
    out, r = clip_ratio_band(frame, "low", "high", "est")
    assert out["has_band"].to_list() == [False, False, True, True, False, True, True]
    assert out["drawable"].to_list() == [True] * 5 + [False, False]
    assert out["past_low"].to_list() == [False, False, True, False, False, False, False]
    assert out["past_high"].to_list() == [False, False, True, False, False, False, False]
    assert out["low_shown"].to_list()[:3] == [None, None, 1 / r]
    assert out["high_shown"].to_list()[2] == r
    assert out["clip_note"].to_list()[:2] == ["no interval", "no interval"]


def test_spread_bands_are_clipped_to_ten_times_the_span_of_the_points_per_panel() -> None:
    frame = pl.DataFrame(
        {
            "panel": ["a", "a", "b"],
            "mid": [10.0, 20.0, 100.0],
            "lo": [8.0, -1e9, 90.0],
            "hi": [1e9, 25.0, 110.0],
        }
    )
    out = clip_spread_band(frame, points=("mid",), lows=("lo",), highs=("hi",), by=("panel",))
    a = out.filter(pl.col("panel") == "a")
    # panel a: points 10-20, span 10: the range is 10 - 45 to 20 + 45, ten spans in all
    assert a["edge_low"].to_list() == [-35.0, -35.0] and a["edge_high"].to_list() == [65.0, 65.0]
    assert a["hi_shown"].to_list() == [65.0, 25.0] and a["lo_shown"].to_list() == [8.0, -35.0]
    assert a["past_high"].to_list() == [True, False] and a["past_low"].to_list() == [False, True]
    b = out.filter(pl.col("panel") == "b").row(0, named=True)  # one point: a quarter of it as the span
    assert (b["edge_low"], b["edge_high"]) == (100.0 - 112.5, 100.0 + 112.5)
    assert not b["past_low"] and not b["past_high"] and b["hi_shown"] == 110.0


# -------------------------------------------------------------------------------------------------- charts


def test_the_speedup_chart_draws_ratios_on_a_log_axis_centred_on_one_with_the_wild_band_clipped() -> None:
    frame = speedups(wild=True)
    frame = frame.with_columns(  # an infinite bound must not break the spec's JSON
        pl.when(pl.col("ci_high") == WILD[1]).then(math.inf).otherwise(pl.col("ci_high")).alias("ci_high")
    )
    spec = speedup_chart(frame, "closed").to_dict()
    json.dumps(spec, allow_nan=False)  # Vega's data is JSON: no Infinity, no NaN
    scales = [
        layer["encoding"]["y"].get("scale") for layer in layers(spec) if "field" in layer["encoding"]["y"]
    ]
    assert scales and all(s == {"type": "log", "nice": False, "zero": False} for s in scales)
    assert {"y": {"datum": 1}} in [{"y": layer["encoding"]["y"]} for layer in layers(spec)]  # the rule at 1
    rows = dataset(spec)
    throughput = [r for r in rows if r["measure"] == "output throughput"]
    tpot = [r for r in rows if r["measure"] == "TPOT p50"]
    # the axis of each metric is [1/R, R] (an invisible rule from edge_low to edge_high holds it), with R
    # from that metric's points: the wild band keeps throughput at 0.5x-2x, TPOT (no wild band) at its own
    anchor = layers(spec)[0]
    assert anchor["mark"] == {"type": "rule", "opacity": 0}
    assert anchor["encoding"]["y"]["field"] == "edge_low" and anchor["encoding"]["y2"]["field"] == "edge_high"
    assert {(r["edge_low"], r["edge_high"]) for r in throughput} == {(0.5, 2.0)}
    assert {(r["edge_low"], r["edge_high"]) for r in tpot} == {(1 / 1.5, 1.5)}
    for r in rows:
        assert r["edge_low"] * r["edge_high"] == pytest.approx(1.0)
        assert r["edge_low"] <= r["ci_low_shown"] <= r["estimate"] <= r["ci_high_shown"] <= r["edge_high"]
    (wild,) = [r for r in rows if r["past_high"] or r["past_low"]]
    assert (wild["ci_low_shown"], wild["ci_high_shown"], wild["estimate"]) == (0.5, 2.0, 1.1)
    assert wild["ci_high"] is None and wild["area_low"] is None  # no Infinity in JSON; no area through it
    assert wild["estimate [interval]"] == "1.1 [1e-06, inf]" and wild["clip_note"] == "runs past both ends"
    (up,) = marks(spec, "triangle-up")
    (down,) = marks(spec, "triangle-down")
    assert up["transform"] == [{"filter": "datum.past_high"}] and up["encoding"]["y"]["field"] == "edge_high"
    assert (
        down["transform"] == [{"filter": "datum.past_low"}] and down["encoding"]["y"]["field"] == "edge_low"
    )
    subtitle = spec["title"]["subtitle"]
    assert "log axis centred on 1" in subtitle[1] and "0.5x-2x (output throughput)" in subtitle[1]
    assert "0.667x-1.5x (TPOT p50)" in subtitle[1] and "\u25b2/\u25bc" in subtitle[1]
    assert subtitle[2] == "n = 3 repeats per point"  # one n everywhere: said once, no labels
    assert not [layer for layer in layers(spec) if layer["mark"]["type"] == "text"]


def test_every_point_is_drawn_with_its_n_and_hollow_without_an_interval() -> None:
    spec = speedup_chart(speedups(wild=False, single=True), "closed").to_dict()
    rows = dataset(spec)
    assert all(r["drawable"] for r in rows)
    (points,) = [
        layer for layer in layers(spec) if layer["mark"]["type"] == "point" and "shape" not in layer["mark"]
    ]
    assert points["encoding"]["y"]["field"] == "estimate"
    fill = points["encoding"]["fill"]
    assert fill["condition"]["test"] == "datum.has_band" and fill["value"] == "white"  # hollow without
    assert "n_repeats" in [t["field"] for t in points["encoding"]["tooltip"]]
    lonely = [r for r in rows if r["n_repeats"] == 1]
    assert len(lonely) == 2 and not any(r["has_band"] for r in lonely)
    assert all(r["ci_low_shown"] is None and r["clip_note"] == "no interval" for r in lonely)
    subtitle = spec["title"]["subtitle"][2]
    assert "n = 1-3 repeats per point (labelled)" in subtitle and "hollow: no interval (2 points" in subtitle
    (labels,) = [layer for layer in layers(spec) if layer["mark"]["type"] == "text"]
    assert labels["encoding"]["text"]["field"] == "n_label" and {r["n_label"] for r in rows} == {"n=1", "n=3"}
    assert not marks(spec, "triangle-up") or all(not r["past_high"] for r in rows)


def test_the_latency_chart_keeps_its_scale_but_clips_a_wild_whisker() -> None:
    rows = []
    for variant, q50 in (("plain", 0.020), ("draft-k3", 0.015)):
        q95 = 100.0 if variant == "draft-k3" else q50 * 2  # 100 s against 20 ms medians
        rows.append(
            {
                "variant": variant,
                "workload": "chat",
                "load_label": "c1",
                "metric": "ttft",
                "n": 64,
                "mean": q50,
                "q05": q50 * 0.5,
                "q25": q50 * 0.8,
                "q50": q50,
                "q75": q50 * 1.2,
                "q95": q95,
                "q99": q95 * 1.5,
            }
        )
    spec = latency_chart(pl.DataFrame(rows), ("ttft",), "TTFT", "sub").to_dict()
    values = dataset(spec)
    wild = next(r for r in values if r["variant"] == "draft-k3")
    assert wild["q95_ms_past"] and wild["q99_ms_past"] and wild["past_high"]
    assert wild["q95_ms"] == 100_000.0 and wild["q95_ms_shown"] == wild["edge_high"] < 100
    assert "q50_ms_shown" not in wild and wild["q50_ms"] == 15.0  # the boxes and medians are never clipped
    assert all(layer["encoding"]["y"]["scale"] == {"zero": False} for layer in layers(spec))  # not log
    (up,) = marks(spec, "triangle-up")
    assert up["transform"] == [{"filter": "datum.past_high"}]
    assert "clipped to 10x the span of the boxes" in spec["title"]["subtitle"][1]
    tame = latency_chart(pl.DataFrame(rows[:1]), ("ttft",), "TTFT", "sub").to_dict()
    assert tame["title"]["subtitle"] == "sub"  # nothing clipped: nothing to say


def adaptation_view(high: float | None) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "stratum": stratum,
                "load_label": "c1",
                "target": stratum == "code",
                "adopt": stratum == "code",
                "n_repeats": 3,
                "mal_ratio": 1.2,
                "mal_low": 1.1,
                "mal_high": 1.3,
                "throughput_ratio": 1.15,
                "throughput_low": 1e-6 if stratum == "chat" else 1.05,
                "throughput_high": high if stratum == "chat" else 1.25,
                "tpot_ratio": 1.1,
                "tpot_low": None,
                "tpot_high": None,
            }
            for stratum in ("chat", "code")
        ]
    )


def test_the_adaptation_chart_is_centred_on_one_and_clips_its_wild_interval() -> None:
    spec = adaptation_chart(adaptation_view(1e5), 0.10, 0.05).to_dict()
    json.dumps(spec, allow_nan=False)
    scales = [layer["encoding"]["x"]["scale"] for layer in spec["layer"]]
    assert all(s == {"type": "log", "domain": [0.5, 2.0], "nice": False, "zero": False} for s in scales)
    rules = sorted(spec["datasets"][layer["data"]["name"]][0]["x"] for layer in spec["layer"][:3])
    assert rules == [0.95, 1.0, 1.1]  # no change, harm limit, minimum effect: all on the axis
    values = [r for layer in spec["layer"][3:4] for r in spec["datasets"][layer["data"]["name"]]]
    wild = next(r for r in values if r["stratum"].startswith("chat") and r["metric"] == "output throughput")
    assert (wild["low_shown"], wild["high_shown"], wild["ratio"]) == (0.5, 2.0, 1.15)
    assert wild["past_low"] and wild["past_high"]
    hollow = [r for r in values if r["metric"] == "TPOT p50 (old / new)"]
    assert len(hollow) == 2 and not any(r["has_band"] for r in hollow)
    assert all(r["stratum"].endswith("n=3") for r in values)
    assert {layer["mark"].get("shape") for layer in spec["layer"]} >= {"triangle-left", "triangle-right"}
    filters = {
        layer["transform"][0]["filter"]: layer["mark"] for layer in spec["layer"] if "transform" in layer
    }
    assert filters["datum.drawable && !datum.has_band"]["fill"] == "white"  # hollow without an interval
    assert filters["datum.drawable && datum.has_band"]["filled"] is True
    assert "intervals clipped to 0.5x-2x" in spec["title"]["subtitle"][1]
    assert "hollow: no interval (2)" in spec["title"]["subtitle"][1]


def test_the_tree_sim_chart_is_centred_on_one() -> None:
    projections = pl.DataFrame(
        {
            "shape": ["chain-3", "tree-2x2"],
            "stratum": ["chat", "chat"],
            "concurrency": [1, 1],
            "load_label": ["c1", "c1"],
            "projected_speedup": [1.4, 0.9],
            "measured_speedup": [1.3, None],
            "mean_acceptance_length": [2.0, 2.5],
            "verified_tokens_per_step": [4.0, 6.0],
        }
    )
    spec = tree_sim_chart(projections).to_dict()
    scale = spec["spec"]["layer"][0]["encoding"]["y"]["scale"]
    assert scale["type"] == "log" and scale["domain"][0] * scale["domain"][1] == pytest.approx(1.0)
    assert scale["domain"] == [1 / 1.5, 1.5]  # 1.4 with its margin (1.4^1.2 = 1.497), rounded up: 1.5


def test_a_chart_with_a_wild_band_saves_to_html_and_png(tmp_path: Path) -> None:
    files = save_chart(speedup_chart(speedups(wild=True, single=True), "closed"), tmp_path, "speedup", "t")
    assert files.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and files.png.stat().st_size > 10_000
    assert files.html.stat().st_size > 100_000  # Vega inline
