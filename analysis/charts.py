"""Altair charts of a campaign's analysis. Each function takes frames the question modules produced and
returns a chart, or None when the campaign has nothing to draw. `save_chart` writes a self-contained HTML
file (Vega, Vega-Lite and Vega-Embed inline: it renders offline, no CDN) and a PNG (vl-convert).

Wide intervals never flatten a chart (issue 30): ratios (speedups, new head / old head, projected
speedups) sit on a log axis centred on 1, [1/R, R] with R chosen from the point estimates
(`ratio_range`); bands are clipped to that stated range and a triangle at the edge marks an interval that runs
past it (`clip_ratio_band`). Every point estimate is drawn, hollow where it has no interval, and its n is in
the tooltip and the subtitle (labelled beside the point when it varies). Charts of other quantities with
bands clip them the same way to a range set by their points (`clip_spread_band`).

Latency charts say which inter-token latency they show: a `chunk gap` is the time between two streamed
chunks (under speculation one chunk often carries several tokens, so it is not a per-token latency, although
vLLM's bench reports it as "ITL"); `ITL per token` divides each gap by the tokens of its chunk.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import altair as alt
import polars as pl

from analysis.stats import percent

WIDTH, HEIGHT = 200, 150
# The ratio axis [1/R, R] (`ratio_range`): never narrower than 0.8x-1.25x; the points' largest |log ratio|
# times POINT_MARGIN always fits (a point is never clipped); bands may widen it up to BAND_ROOM times the
# points' log extent (at least to 0.5x-2x) but never past RATIO_CAP; R is then rounded up to a round number.
RATIO_FLOOR, RATIO_CAP = 1.25, 8.0
POINT_MARGIN, BAND_ROOM = 1.2, 2.0
NICE_MANTISSAS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
# Other quantities: no band may stretch a panel's axis past SPREAD_FACTOR times the span of its points.
SPREAD_FACTOR = 10.0
PAST_NOTE = "\u25b2/\u25bc = the interval runs past"
SPEEDUP_METRICS = {
    "throughput": "output throughput",
    "tpot_p50": "TPOT p50",
    "ttft_p50": "TTFT p50",
}
LATENCY_LABELS = {
    "ttft": "TTFT (ms)",
    "tpot": "TPOT (ms)",
    "e2e": "E2E (ms)",
    "chunk_gap": "ITL kind: chunk gap (ms)",
    "itl_per_token": "ITL kind: ITL per token (ms)",
}
WASTE_PARTS = {
    "useful_share": "useful",
    "wasted_drafting_share": "wasted: drafting",
    "wasted_verification_share": "wasted: verification",
    "rejection_share": "rejection sampling",
    "other_share": "other",
}


@dataclass(frozen=True)
class ChartFiles:
    name: str
    title: str
    html: Path
    png: Path


def _load_axis(mode: str) -> tuple[str, str]:
    return (
        ("rate", "offered rate (req/s)") if mode == "open" else ("concurrency", "concurrency (closed loop)")
    )


def speedup_chart(speedups: pl.DataFrame, mode: str, confidence: float = 0.95) -> alt.FacetChart | None:
    """Speedup against load, one panel per metric (rows) and workload (columns), bands = the interval over
    repeats (none with one repeat), a rule at 1 (no change)."""
    frame = speedups.filter(pl.col("load_mode") == mode, pl.col("metric").is_in(list(SPEEDUP_METRICS)))
    if frame.is_empty():
        return None
    column, label = _load_axis(mode)
    frame = frame.with_columns(
        pl.col("metric").replace_strict(SPEEDUP_METRICS).alias("measure"),
        pl.col(column).cast(pl.Float64).alias("load"),
    ).select(
        "variant", "workload", "measure", "load", "load_label", "estimate", "ci_low", "ci_high", "interval"
    )
    x = _load_x(frame["load"], label)
    base = alt.Chart().encode(x=x, color=alt.Color("variant:N", title="variant"))
    band = base.mark_area(opacity=0.2).encode(y=alt.Y("ci_low:Q"), y2="ci_high:Q")
    line = base.mark_line(point=True).encode(
        y=alt.Y("estimate:Q", title="speedup vs plain (>1 faster)", scale=alt.Scale(zero=False)),
        tooltip=[
            "variant",
            "workload",
            "load_label",
            "measure",
            alt.Tooltip("estimate:Q", format=".3f"),
            alt.Tooltip("ci_low:Q", format=".3f"),
            alt.Tooltip("ci_high:Q", format=".3f"),
            "interval",
        ],
    )
    rule = alt.Chart().mark_rule(color="black", strokeDash=[4, 3]).encode(y=alt.datum(1))
    return (
        alt.layer(band, line, rule, data=frame)
        .properties(width=WIDTH, height=HEIGHT)
        .facet(
            row=alt.Row("measure:N", title=None, sort=list(SPEEDUP_METRICS.values())),
            column=alt.Column("workload:N", title="workload"),
        )
        .resolve_scale(y="independent")
        .properties(
            title={
                "text": f"Speedup against load ({'open loop' if mode == 'open' else 'closed loop'})",
                "subtitle": f"geometric mean of per-repeat ratios against plain; bands: {percent(confidence)} t interval "
                "over repeats (no band with one repeat). TPOT/TTFT are per-request figures, not ITL.",
            }
        )
    )


def latency_chart(
    latencies: pl.DataFrame, metrics: tuple[str, ...], title: str, subtitle: str
) -> alt.FacetChart | None:
    """Distributions as boxes from precomputed quantiles: box p25-p75, whiskers p5-p95, tick p50, dot p99."""
    frame = latencies.filter(pl.col("metric").is_in(list(metrics)))
    if frame.is_empty():
        return None
    frame = frame.with_columns(
        pl.col("metric").replace_strict(LATENCY_LABELS).alias("measure"),
        *[(pl.col(f"q{q}") * 1000).alias(f"q{q}_ms") for q in ("05", "25", "50", "75", "95", "99")],
        (pl.col("mean") * 1000).alias("mean_ms"),
    ).select(
        "variant",
        "workload",
        "load_label",
        "measure",
        "n",
        "mean_ms",
        "q05_ms",
        "q25_ms",
        "q50_ms",
        "q75_ms",
        "q95_ms",
        "q99_ms",
    )
    order = sorted(frame["load_label"].unique().to_list(), key=_load_sort_key)
    base = alt.Chart().encode(
        x=alt.X("load_label:N", title="load", sort=order),
        xOffset=alt.XOffset("variant:N"),
        color=alt.Color("variant:N"),
        tooltip=[
            "variant",
            "workload",
            "load_label",
            "measure",
            "n",
            *[
                alt.Tooltip(f"{c}:Q", format=".2f")
                for c in ("mean_ms", "q05_ms", "q25_ms", "q50_ms", "q75_ms", "q95_ms", "q99_ms")
            ],
        ],
    )
    whisker = base.mark_rule().encode(
        y=alt.Y("q05_ms:Q", title="ms", scale=alt.Scale(zero=False)), y2="q95_ms:Q"
    )
    box = base.mark_bar(size=8, opacity=0.6).encode(y="q25_ms:Q", y2="q75_ms:Q")
    median = base.mark_tick(color="black", size=10, thickness=2).encode(y="q50_ms:Q")
    p99 = base.mark_point(shape="diamond", filled=True, size=25).encode(y="q99_ms:Q")
    return (
        alt.layer(whisker, box, median, p99, data=frame)
        .properties(width=WIDTH, height=HEIGHT)
        .facet(
            row=alt.Row("measure:N", title=None, sort=[LATENCY_LABELS[m] for m in metrics]),
            column=alt.Column("workload:N", title="workload"),
        )
        .resolve_scale(y="independent")
        .properties(title={"text": title, "subtitle": subtitle})
    )


def request_latency_chart(latencies: pl.DataFrame) -> alt.FacetChart | None:
    return latency_chart(
        latencies,
        ("ttft", "tpot", "e2e"),
        "Request latency distributions (successful measured requests, all repeats)",
        "box p25-p75, whiskers p5-p95, black tick p50, diamond p99. TPOT = (E2E - TTFT) / (tokens - 1) per "
        "request: not an ITL of either kind.",
    )


def itl_chart(latencies: pl.DataFrame) -> alt.FacetChart | None:
    return latency_chart(
        latencies,
        ("chunk_gap", "itl_per_token"),
        "Inter-token latency, both kinds: chunk gap (top) and ITL per token (bottom)",
        "chunk gap = time between streamed chunks; a speculative chunk often holds several tokens, so it is "
        "NOT a per-token latency (vLLM's bench calls it ITL). ITL per token = gap / tokens in the chunk, "
        "token-weighted.",
    )


def position_chart(per_position: pl.DataFrame) -> alt.FacetChart | None:
    """Acceptance rate per draft position (1 = the first drafted token), per variant and workload."""
    if per_position.is_empty():
        return None
    frame = per_position.with_columns((pl.col("position") + 1).alias("draft_position"))
    return (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("draft_position:O", title="draft position"),
            y=alt.Y("acceptance_rate:Q", title="acceptance rate", scale=alt.Scale(domain=[0, 1])),
            color="variant:N",
            tooltip=[
                "variant",
                "workload",
                "draft_position",
                alt.Tooltip("acceptance_rate:Q", format=".3f"),
                "cells",
            ],
        )
        .properties(width=WIDTH, height=HEIGHT)
        .facet(column=alt.Column("workload:N", title="workload"))
        .properties(
            title={
                "text": "Per-position acceptance",
                "subtitle": "accepted at position i / drafts (vLLM counters), mean over repeats and loads",
            }
        )
    )


def pareto_points(cells: pl.DataFrame) -> pl.DataFrame:
    """Mean TPOT p50 and output throughput per variant, workload and load, with a Pareto flag per workload
    (no other point is at least as fast per token and at least as high in throughput, one strictly)."""
    points = (
        cells.group_by("variant", "method", "k", "workload", "load_mode", "load_label", "concurrency", "rate")
        .agg(
            pl.col("tpot_p50_s").mean(),
            pl.col("output_throughput_tok_s").mean(),
            pl.len().alias("repeats"),
        )
        .drop_nulls(["tpot_p50_s", "output_throughput_tok_s"])
        .filter(pl.col("tpot_p50_s") > 0)  # 0 s: a stream read in one burst, no latency to place
        .sort("workload", "variant", "concurrency", "rate", nulls_last=True)
    )
    flags = []
    for row in points.iter_rows(named=True):
        peers = points.filter(pl.col("workload") == row["workload"])
        dominated = peers.filter(
            (pl.col("tpot_p50_s") <= row["tpot_p50_s"])
            & (pl.col("output_throughput_tok_s") >= row["output_throughput_tok_s"])
            & (
                (pl.col("tpot_p50_s") < row["tpot_p50_s"])
                | (pl.col("output_throughput_tok_s") > row["output_throughput_tok_s"])
            )
        )
        flags.append(dominated.is_empty())
    return points.with_columns(pl.Series("pareto", flags, dtype=pl.Boolean))


def pareto_chart(cells: pl.DataFrame) -> alt.FacetChart | None:
    points = pareto_points(cells)
    if points.is_empty():
        return None
    frame = points.with_columns(
        (pl.col("tpot_p50_s") * 1000).alias("tpot_p50_ms"),
        pl.when(pl.col("pareto"))
        .then(pl.lit("Pareto-optimal"))
        .otherwise(pl.lit("dominated"))
        .alias("front"),
        pl.coalesce(pl.col("concurrency").cast(pl.Float64), pl.col("rate")).alias("load"),
    )
    base = alt.Chart().encode(
        x=alt.X(
            "tpot_p50_ms:Q",
            title="TPOT p50 (ms, lower is better; per request, not an ITL)",
            scale=alt.Scale(zero=False),
        ),
        y=alt.Y("output_throughput_tok_s:Q", title="output throughput (tok/s)", scale=alt.Scale(zero=False)),
        color="variant:N",
    )
    lines = base.mark_line(opacity=0.5).encode(order="load:Q", detail="load_mode:N")
    dots = base.mark_point(size=70, opacity=1).encode(
        fill=alt.condition("datum.pareto", alt.Color("variant:N", legend=None), alt.value("white")),
        tooltip=[
            "variant",
            "workload",
            "load_label",
            "repeats",
            alt.Tooltip("tpot_p50_ms:Q", format=".2f"),
            alt.Tooltip("output_throughput_tok_s:Q", format=".1f"),
            "front",
        ],
    )
    labels = base.mark_text(dx=8, dy=-6, fontSize=9, color="gray").encode(text="load_label:N")
    return (
        alt.layer(lines, dots, labels, data=frame)
        .properties(width=WIDTH + 40, height=HEIGHT + 40)
        .facet(column=alt.Column("workload:N", title="workload"))
        .resolve_scale(x="independent", y="independent")
        .properties(
            title={
                "text": "Throughput against latency (Pareto)",
                "subtitle": "one point per variant and load (mean over repeats); filled = on the Pareto front "
                "of its workload",
            }
        )
    )


def capacity_chart(capacity: pl.DataFrame, mode: str) -> alt.VConcatChart | None:
    """Goodput and achieved request rate against load, and p99 TTFT/TPOT relative to their SLOs."""
    frame = capacity.filter(pl.col("load_mode") == mode)
    if frame.is_empty():
        return None
    column = "offered_rate_rps" if mode == "open" else "concurrency"
    _, label = _load_axis(mode)
    frame = frame.with_columns(pl.col(column).cast(pl.Float64).alias("load"))
    rates = frame.unpivot(
        index=["variant", "workload", "load", "load_label"],
        on=["goodput_rps", "achieved_rps"],
        variable_name="measure",
        value_name="rps",
    ).with_columns(
        pl.col("measure").replace_strict({"goodput_rps": "goodput", "achieved_rps": "achieved rate"})
    )
    tails = frame.with_columns(
        (pl.col("ttft_p99_s_worst") / pl.col("slo_ttft_p99_s")).alias("TTFT p99 / SLO"),
        (pl.col("tpot_p99_s_worst") / pl.col("slo_tpot_p99_s")).alias("TPOT p99 / SLO"),
    ).unpivot(
        index=["variant", "workload", "load", "load_label"],
        on=["TTFT p99 / SLO", "TPOT p99 / SLO"],
        variable_name="measure",
        value_name="ratio",
    )
    x = _load_x(frame["load"], label)
    top = (
        alt.Chart(rates)
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("rps:Q", title="requests/s"),
            color="variant:N",
            strokeDash=alt.StrokeDash("measure:N", legend=None),
            shape=alt.Shape("measure:N", title=None),
            tooltip=["variant", "workload", "load_label", "measure", alt.Tooltip("rps:Q", format=".3f")],
        )
        .properties(width=WIDTH, height=HEIGHT)
        .facet(column=alt.Column("workload:N", title="workload"))
        .properties(title="Goodput (requests within both SLOs per second) and achieved request rate")
    )
    tail_line = (
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("ratio:Q", title="worst repeat's p99 / SLO (>1 violates)", scale=alt.Scale(type="log")),
            color="variant:N",
            strokeDash=alt.StrokeDash("measure:N", legend=None),
            shape=alt.Shape("measure:N", title=None),
            tooltip=["variant", "workload", "load_label", "measure", alt.Tooltip("ratio:Q", format=".3f")],
        )
    )
    limit = alt.Chart().mark_rule(color="red", strokeDash=[4, 3]).encode(y=alt.datum(1))
    bottom = (
        alt.layer(tail_line, limit, data=tails)
        .properties(width=WIDTH, height=HEIGHT)
        .facet(column=alt.Column("workload:N", title="workload"))
        .properties(title="Tail latency against the SLO (TTFT and TPOT p99; TPOT is per request, not an ITL)")
    )
    return (
        alt.vconcat(top, bottom)
        .resolve_scale(strokeDash="independent")
        .properties(
            title={
                "text": f"Capacity ({'open-loop rate sweep' if mode == 'open' else 'closed loop'})",
                "subtitle": "a load meets the SLO when every repeat's p99 TTFT and TPOT are within it",
            }
        )
    )


def step_chart(points: pl.DataFrame) -> alt.FacetChart | None:
    """Inferred step time against depth k; plain at k = 0 (its TPOT: one token per step)."""
    if points.is_empty() or points.filter(pl.col("method") != "none").is_empty():
        return None
    plain = points.filter(pl.col("method") == "none")
    methods = points.filter(pl.col("method") != "none")["method"].unique().to_list()
    series = pl.concat(
        [
            methods_frame.with_columns(pl.lit(m).alias("series"))
            for m in methods
            for methods_frame in (plain, points.filter(pl.col("method") == m))
        ]
    ).with_columns((pl.col("step_time_s") * 1000).alias("step_time_ms"))
    order = sorted(series["load_label"].unique().to_list(), key=_load_sort_key)
    return (
        alt.Chart(series)
        .mark_line(point=True)
        .encode(
            x=alt.X("k:Q", title="depth k (0 = plain)", axis=alt.Axis(tickMinStep=1)),
            y=alt.Y("step_time_ms:Q", title="inferred step time (ms)", scale=alt.Scale(zero=False)),
            color=alt.Color("series:N", title="method"),
            tooltip=[
                "variant",
                "workload",
                "load_label",
                "k",
                alt.Tooltip("step_time_ms:Q", format=".2f"),
                "n",
            ],
        )
        .properties(width=WIDTH - 40, height=HEIGHT - 20)
        .facet(row=alt.Row("load_label:N", title="load", sort=order), column=alt.Column("workload:N"))
        .properties(
            title={
                "text": "Inferred step time against depth k",
                "subtitle": "step = TPOT_mean x T / (T - accepted); speculation pays per token while tokens per "
                "step exceed step_k / step_plain",
            }
        )
    )


def waste_chart(waste: pl.DataFrame) -> alt.FacetChart | None:
    """Where profiled engine time went (useful, wasted drafting and verification, rejection, other)."""
    if waste.is_empty():
        return None
    frame = (
        waste.with_columns(pl.format("{} {}", pl.col("variant"), pl.col("load_label")).alias("window"))
        .unpivot(
            index=["window", "variant", "workload", "load_label", "profiler"],
            on=list(WASTE_PARTS),
            variable_name="part",
            value_name="share",
        )
        .with_columns(pl.col("part").replace_strict(WASTE_PARTS), pl.col("workload").fill_null("all"))
    )
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X(
                "share:Q", title="share of measured engine time", stack="zero", scale=alt.Scale(domain=[0, 1])
            ),
            y=alt.Y("window:N", title=None),
            color=alt.Color("part:N", sort=list(WASTE_PARTS.values()), title=None),
            tooltip=["window", "workload", "profiler", "part", alt.Tooltip("share:Q", format=".3f")],
        )
        .properties(width=WIDTH + 100, height=alt.Step(18))
        .facet(row=alt.Row("workload:N"))
        .properties(
            title={
                "text": "Where engine time went (profiled windows)",
                "subtitle": "wasted = drafting and verification of draft tokens that were rejected",
            }
        )
    )


def tree_sim_chart(projections: pl.DataFrame) -> alt.FacetChart | None:
    """Projected throughput speedup of each simulated shape against concurrency, one panel per workload
    (analysis/simulate/cost.py); crosses: what the served chains measured, for the cost model's check."""
    frame = projections.filter(pl.col("projected_speedup").is_not_null())
    if frame.is_empty():
        return None
    frame = frame.with_columns(pl.col("concurrency").cast(pl.Float64).alias("load")).select(
        "shape",
        pl.col("stratum").alias("workload"),
        "load",
        "load_label",
        "projected_speedup",
        "measured_speedup",
        "mean_acceptance_length",
        "verified_tokens_per_step",
    )
    x = _load_x(frame["load"], "concurrency (closed loop)")
    # tableau20: the served chains plus a few shapes easily pass the default scheme's 10 colours
    scale, legend = alt.Scale(scheme="tableau20"), alt.Legend(labelLimit=320)
    base = alt.Chart().encode(x=x, color=alt.Color("shape:N", title="shape", scale=scale, legend=legend))
    line = base.mark_line(point=True).encode(
        y=alt.Y(
            "projected_speedup:Q", title="projected speedup vs plain (>1 faster)", scale=alt.Scale(zero=False)
        ),
        tooltip=[
            "shape",
            "workload",
            "load_label",
            alt.Tooltip("projected_speedup:Q", format=".3f"),
            alt.Tooltip("mean_acceptance_length:Q", format=".3f"),
            alt.Tooltip("verified_tokens_per_step:Q", format=".2f"),
            alt.Tooltip("measured_speedup:Q", format=".3f"),
        ],
    )
    served = base.mark_point(shape="cross", size=90, filled=True).encode(y="measured_speedup:Q")
    rule = alt.Chart().mark_rule(color="black", strokeDash=[4, 3]).encode(y=alt.datum(1))
    return (
        alt.layer(line, served, rule, data=frame)
        .properties(width=WIDTH, height=HEIGHT)
        .facet(column=alt.Column("workload:N", title="workload"))
        .properties(
            title={
                "text": "Trees and drafter combinations: projected speedup (offline)",
                "subtitle": "simulated acceptance on the campaign's greedy captures x a step-time model fitted on "
                "its cells; crosses: the served chains' measured speedup",
            }
        )
    )


def _load_x(loads: pl.Series, title: str) -> alt.X:
    """A log2 load axis whose ticks are the measured loads."""
    values = sorted({float(v) for v in loads.drop_nulls().to_list()})
    return alt.X("load:Q", title=title, scale=alt.Scale(type="log", base=2), axis=alt.Axis(values=values))


def _load_sort_key(label: str) -> tuple[int, float]:
    if label.startswith("rate"):
        return (1, float(label[4:]))
    if label.startswith("c"):
        return (0, float(label[1:]))
    return (2, 0.0)


def save_chart(chart: alt.TopLevelMixin, directory: Path, name: str, title: str) -> ChartFiles:
    """<name>.html (self-contained: Vega inline) and <name>.png (vl-convert) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    html, png = directory / f"{name}.html", directory / f"{name}.png"
    chart.save(str(html), inline=True)
    chart.save(str(png), scale_factor=1.0)
    return ChartFiles(name=name, title=title, html=html, png=png)


ADAPTATION_METRICS = {
    "mal": "mean acceptance length",
    "throughput": "output throughput",
    "tpot": "TPOT p50 (old / new)",
}


def adaptation_chart(
    view: pl.DataFrame, min_effect: float = 0.10, max_harm: float = 0.05
) -> alt.LayerChart | None:
    """New head against old per stratum (v_adaptation): each metric's ratio (> 1: the new head is better)
    with its interval over repeats; the dashed rule at 1 is no change, the green one the minimum effect the
    gain must clear, the red one the harm another stratum may take."""
    if view.is_empty():
        return None
    rows = []
    for r in view.filter(pl.col("stratum").is_not_null()).iter_rows(named=True):
        for key, label in ADAPTATION_METRICS.items():
            estimate = r.get(f"{key}_ratio")
            if estimate is None:
                continue
            rows.append(
                {
                    "stratum": f"{r['stratum']} {r['load_label']}" + (" (target)" if r["target"] else ""),
                    "metric": label,
                    "ratio": estimate,
                    "low": r.get(f"{key}_low") if r.get(f"{key}_low") is not None else estimate,
                    "high": r.get(f"{key}_high") if r.get(f"{key}_high") is not None else estimate,
                    "adopt": "adopt" if r["adopt"] else "keep old",
                }
            )
    if not rows:
        return None
    frame = pl.DataFrame(rows)
    base = alt.Chart(frame).encode(
        y=alt.Y("stratum:N", title=None),
        yOffset=alt.YOffset("metric:N"),
        color=alt.Color("metric:N", sort=list(ADAPTATION_METRICS.values()), title=None),
    )
    bars = base.mark_rule(strokeWidth=2).encode(
        x=alt.X("low:Q", title="new head / old head", scale=alt.Scale(zero=False)), x2="high:Q"
    )
    points = base.mark_point(filled=True, size=60).encode(
        x="ratio:Q",
        shape=alt.Shape("adopt:N", title="verdict"),
        tooltip=[
            "stratum",
            "metric",
            alt.Tooltip("ratio:Q", format=".3f"),
            alt.Tooltip("low:Q", format=".3f"),
            alt.Tooltip("high:Q", format=".3f"),
            "adopt",
        ],
    )
    rules = [
        alt.Chart(pl.DataFrame({"x": [x]})).mark_rule(strokeDash=[4, 3], color=colour).encode(x="x:Q")
        for x, colour in ((1.0, "#666"), (1.0 + min_effect, "#2a9d4b"), (1.0 - max_harm, "#c0392b"))
    ]
    return alt.layer(*rules, bars, points).properties(
        width=WIDTH + 100,
        height=alt.Step(14),
        title={
            "text": "Adapted head against the old one, per stratum",
            "subtitle": "ratio with its 95% t interval over repeats; green dashes: 1 + minimum effect, red: 1 - harm limit",
        },
    )
