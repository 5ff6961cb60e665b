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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------------------------------ wide intervals


def _finite_positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _nice_up(value: float) -> float:
    """The smallest m x 10^k (m in NICE_MANTISSAS) at or above `value` (> 0)."""
    power = 10.0 ** math.floor(math.log10(value))
    for mantissa in (*NICE_MANTISSAS, 10.0):
        if mantissa * power >= value * (1 - 1e-9):
            return mantissa * power
    return 10.0 * power  # pragma: no cover (10.0 above always fits)


def ratio_range(estimates: Iterable[float | None], bounds: Iterable[float | None] = ()) -> float:
    """R of the ratio axis [1/R, R], symmetric around 1 in log space. It holds every finite positive estimate
    with a margin (POINT_MARGIN on the log), at least RATIO_FLOOR; `bounds` (the bands' ends; <= 0 or
    infinite ones run past anything) may widen it up to BAND_ROOM times the points' log extent, at least to 2,
    never past RATIO_CAP. Rounded up to a round number (1.25, 1.5, 2, 2.5, 3, 4, 5, 8, 10, ...)."""
    points = [abs(math.log(v)) for v in estimates if _finite_positive(v)]
    base = max(math.log(RATIO_FLOOR), POINT_MARGIN * max(points, default=0.0))
    reach = 0.0
    for v in bounds:
        if v is None or math.isnan(v):
            continue
        reach = max(reach, abs(math.log(v)) if _finite_positive(v) else math.inf)
    room = min(max(BAND_ROOM * base, math.log(2.0)), math.log(RATIO_CAP))
    return _nice_up(math.exp(max(base, min(reach, room))))


def _bound(column: str) -> pl.Expr:
    """A bound as Float64 with NaN as null (a NaN bound is no bound)."""
    return pl.col(column).cast(pl.Float64).fill_nan(None)


def clip_ratio_band(
    frame: pl.DataFrame, low_col: str, high_col: str, est_col: str, extra: Sequence[float] = ()
) -> tuple[pl.DataFrame, float]:
    """Clip a ratio band to [1/R, R], R = `ratio_range` of the frame's estimates (and `extra`: values that
    must stay on the axis, such as a decision threshold) and its bands. Adds:

    - `has_band`: both bounds present (null or NaN: no band) and high > low (zero width: no band);
    - `<low_col>_shown`, `<high_col>_shown`: the band clipped to [1/R, R] (null without a band);
    - `past_low`, `past_high`: the interval runs past the bottom / top (a bound <= 0 or -inf runs past the
      bottom: it cannot sit on a log axis; +inf past the top);
    - `drawable`: the estimate is finite and positive (a log axis cannot show the others);
    - `edge_low`, `edge_high`: 1/R and R, where the triangles of runs-past go; `clip_note`: words for tooltips.

    Returns the frame and R."""
    low, high, est = _bound(low_col), _bound(high_col), _bound(est_col)
    has_band = low.is_not_null() & high.is_not_null() & (high > low)
    drawable = est.is_not_null() & est.is_finite() & (est > 0)
    flags = frame.select(
        has_band.fill_null(False).alias("has_band"),
        drawable.fill_null(False).alias("drawable"),
        low.alias("_low"),
        high.alias("_high"),
        est.alias("_est"),
    )
    banded = flags.filter("has_band")
    r = ratio_range(
        [*flags.filter("drawable")["_est"].to_list(), *extra],
        [*banded["_low"].to_list(), *banded["_high"].to_list()],
    )
    floor = 1.0 / r
    past_low = pl.col("has_band") & (low < floor)
    past_high = pl.col("has_band") & (high > r)
    out = frame.with_columns(flags["has_band"], flags["drawable"]).with_columns(
        pl.when("has_band").then(low.clip(floor, r)).alias(f"{low_col}_shown"),
        pl.when("has_band").then(high.clip(floor, r)).alias(f"{high_col}_shown"),
        past_low.fill_null(False).alias("past_low"),
        past_high.fill_null(False).alias("past_high"),
        pl.lit(floor).alias("edge_low"),
        pl.lit(r).alias("edge_high"),
    )
    note = (
        pl.when(pl.col("past_low") & pl.col("past_high"))
        .then(pl.lit("runs past both ends"))
        .when("past_low")
        .then(pl.lit(f"runs below {floor:.3g}"))
        .when("past_high")
        .then(pl.lit(f"runs above {r:.3g}"))
        .when(pl.col("has_band"))
        .then(pl.lit("fits"))
        .otherwise(pl.lit("no interval"))
    )
    return out.with_columns(note.alias("clip_note")), r


def clip_spread_band(
    frame: pl.DataFrame,
    points: Sequence[str],
    lows: Sequence[str],
    highs: Sequence[str],
    by: Sequence[str],
    factor: float = SPREAD_FACTOR,
) -> pl.DataFrame:
    """Clip bands of a non-ratio quantity so that none stretches a panel's axis past `factor` times the span
    of its points. Per group of `by` (a panel): the points' extent [lo, hi] (every column of `points`, which
    are never clipped), span = max(hi - lo, a quarter of max |lo|, |hi|) and the range
    [lo - (factor - 1) / 2 x span, hi + (factor - 1) / 2 x span]. Adds `<col>_shown` for each column of `lows`
    and `highs` (clipped to the range; null stays null), `<col>_past` (it runs past), `past_low` / `past_high`
    (any low / high column runs past) and `edge_low` / `edge_high` (the range)."""
    group = list(by)
    lo = pl.min_horizontal(*[_bound(c) for c in points]).min().over(group)
    hi = pl.max_horizontal(*[_bound(c) for c in points]).max().over(group)
    span = pl.max_horizontal(hi - lo, 0.25 * pl.max_horizontal(lo.abs(), hi.abs()), pl.lit(1e-12))
    pad = (factor - 1) / 2 * span
    out = frame.with_columns((lo - pad).alias("edge_low"), (hi + pad).alias("edge_high"))
    out = out.with_columns(
        *[(_bound(c) < pl.col("edge_low")).fill_null(False).alias(f"{c}_past") for c in lows],
        *[(_bound(c) > pl.col("edge_high")).fill_null(False).alias(f"{c}_past") for c in highs],
        *[
            _bound(c).clip(pl.col("edge_low"), pl.col("edge_high")).alias(f"{c}_shown")
            for c in (*lows, *highs)
        ],
    )
    return out.with_columns(
        pl.any_horizontal(*[pl.col(f"{c}_past") for c in lows]).alias("past_low"),
        pl.any_horizontal(*[pl.col(f"{c}_past") for c in highs]).alias("past_high"),
    )


def _json_safe(frame: pl.DataFrame) -> pl.DataFrame:
    """Non-finite floats as null: Vega's data is JSON, which has no Infinity or NaN."""
    return frame.with_columns(
        pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c)
        for c, dtype in frame.schema.items()
        if dtype.is_float()
    )


def _number(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "none"
    return f"{value:.3g}"


def _interval_text(frame: pl.DataFrame, est_col: str, low_col: str, high_col: str) -> pl.Series:
    """'1.1 [1e-06, 1e+05]' per row, for tooltips (the true bounds, infinite ones included)."""
    return pl.Series(
        [
            _number(e) + ("" if lo is None or hi is None else f" [{_number(lo)}, {_number(hi)}]")
            for e, lo, hi in zip(
                frame[est_col].to_list(), frame[low_col].to_list(), frame[high_col].to_list(), strict=True
            )
        ],
        dtype=pl.String,
    )


def _range_text(r: float) -> str:
    return f"{1 / r:.3g}x-{r:.3g}x"


def _n_text(ns: Sequence[int | None], unit: str) -> str:
    known = sorted({int(n) for n in ns if n is not None})
    if not known:
        return f"n ({unit}) unknown"
    if len(known) == 1:
        return f"n = {known[0]} {unit} per point"
    return f"n = {known[0]}-{known[-1]} {unit} per point (labelled)"


def _quantitative(channel: Callable[..., Any], title: str, scale: alt.Scale) -> Callable[[str], Any]:
    """field -> the `channel` (alt.X or alt.Y) encoding of that quantitative field: one axis title and scale
    for every layer of a chart."""
    return lambda field: channel(f"{field}:Q", title=title, scale=scale)


def _past_markers(
    base: alt.Chart, channel: Callable[[str], Any], axis: str, size: int, tooltip: list | None = None
) -> list[alt.Chart]:
    """Triangles at the edges of a clipped axis (`axis` "y" or "x", `channel` its encoding of a field): at
    edge_high where an interval runs past the top (right), at edge_low where it runs past the bottom
    (left)."""
    high_shape, low_shape = (
        ("triangle-up", "triangle-down") if axis == "y" else ("triangle-right", "triangle-left")
    )
    markers = []
    for past, edge, shape in (("past_high", "edge_high", high_shape), ("past_low", "edge_low", low_shape)):
        encoding = {axis: channel(edge)} | ({} if tooltip is None else {"tooltip": tooltip})
        markers.append(
            base.transform_filter(f"datum.{past}")
            .mark_point(shape=shape, filled=True, size=size, opacity=1)
            .encode(**encoding)
        )
    return markers


def _speedup_frame(speedups: pl.DataFrame, mode: str) -> tuple[pl.DataFrame, dict[str, float]] | None:
    """The speedups of one load mode, each metric's band clipped to its own ratio range (`clip_ratio_band`),
    with the tooltip's interval text, the n label and the shaded area's ends; and metric -> its range R."""
    frame = speedups.filter(pl.col("load_mode") == mode, pl.col("metric").is_in(list(SPEEDUP_METRICS)))
    if frame.is_empty():
        return None
    column, _ = _load_axis(mode)
    if "n_repeats" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Int32).alias("n_repeats"))
    frame = frame.with_columns(
        pl.col("metric").replace_strict(SPEEDUP_METRICS).alias("measure"),
        pl.col(column).cast(pl.Float64).alias("load"),
    ).select(
        "variant",
        "workload",
        "measure",
        "load",
        "load_label",
        "estimate",
        "ci_low",
        "ci_high",
        "interval",
        "n_repeats",
    )
    parts, ranges = [], {}
    for measure in SPEEDUP_METRICS.values():
        part = frame.filter(pl.col("measure") == measure)
        if not part.is_empty():
            part, ranges[measure] = clip_ratio_band(part, "ci_low", "ci_high", "estimate")
            parts.append(part)
    frame = pl.concat(parts)
    frame = _json_safe(
        frame.with_columns(
            _interval_text(frame, "estimate", "ci_low", "ci_high").alias("estimate [interval]"),
            pl.format("n={}", pl.col("n_repeats")).alias("n_label"),
            *[
                pl.when(pl.col("has_band") & ~pl.col("past_low") & ~pl.col("past_high"))
                .then(pl.col(f"ci_{end}_shown"))
                .alias(f"area_{end}")
                for end in ("low", "high")
            ],
        )
    )
    return frame, ranges


def _speedup_layers(frame: pl.DataFrame, mode: str, labelled: bool) -> list[alt.Chart]:
    """One panel's layers: the axis anchor, the band (bars and a faint area), the rule at 1, the line, the
    points (hollow without an interval), the runs-past triangles and, when n varies, the n labels."""
    x = _load_x(frame["load"], _load_axis(mode)[1])
    color = alt.Color("variant:N", title="variant")
    y = _quantitative(
        alt.Y, "speedup vs plain (>1 faster, log)", alt.Scale(type="log", nice=False, zero=False)
    )
    tooltip = [
        "variant",
        "workload",
        "load_label",
        "measure",
        "estimate [interval]",
        alt.Tooltip("n_repeats:Q", title="n (repeats)"),
        "interval",
        alt.Tooltip("clip_note:N", title="band"),
    ]
    base = alt.Chart().encode(x=x, color=color)
    drawn = base.transform_filter("datum.drawable")
    # invisible: holds each panel's axis at exactly [1/R, R] of its metric (the domain follows the data)
    anchor = base.mark_rule(opacity=0).encode(y=y("edge_low"), y2="edge_high:Q")
    # the band: a bar at every point with an interval, and a faint area between neighbours that fit (broken
    # where an interval runs past the range, so that one wild interval does not shade its neighbours' loads)
    bars = (
        base.transform_filter("datum.has_band")
        .mark_rule(strokeWidth=2, opacity=0.45)
        .encode(y=y("ci_low_shown"), y2="ci_high_shown:Q")
    )
    band = drawn.mark_area(opacity=0.15, invalid="break-paths-filter-domains").encode(
        y=y("area_low"), y2="area_high:Q"
    )
    line = drawn.mark_line().encode(y=y("estimate"))
    points = drawn.mark_point(size=40, opacity=1, strokeWidth=1.5).encode(
        y=y("estimate"),
        fill=alt.condition("datum.has_band", alt.Color("variant:N", legend=None), alt.value("white")),
        tooltip=tooltip,
    )
    rule = alt.Chart().mark_rule(color="black", strokeDash=[4, 3]).encode(y=alt.datum(1))
    layers = [anchor, band, bars, rule, line, points, *_past_markers(base, y, "y", 70, tooltip)]
    if labelled:
        layers.append(
            drawn.mark_text(align="left", dx=5, dy=-7, fontSize=8).encode(y=y("estimate"), text="n_label:N")
        )
    return layers


def _speedup_subtitle(frame: pl.DataFrame, ranges: dict[str, float], confidence: float) -> list[str]:
    """What the bands are, the ranges they are clipped to, n, and the points drawn hollow or left out."""
    clip = (
        f"bands clipped to {_range_text(next(iter(ranges.values())))}"
        if len(set(ranges.values())) == 1
        else "bands clipped to " + ", ".join(f"{_range_text(r)} ({m})" for m, r in ranges.items())
    )
    hollow = frame.filter(pl.col("drawable") & ~pl.col("has_band")).height
    left_out = frame.filter(~pl.col("drawable")).height
    notes = [_n_text(frame["n_repeats"].to_list(), "repeats")]
    if hollow:
        notes.append(
            f"hollow: no interval ({hollow} point{'s' if hollow > 1 else ''}: one repeat or zero width)"
        )
    if left_out:
        notes.append(f"{left_out} without a positive estimate left out")
    return [
        f"geometric mean of per-repeat ratios against plain; bands: {percent(confidence)} t interval "
        "over repeats. TPOT/TTFT are per-request figures, not ITL.",
        f"log axis centred on 1; {clip}; {PAST_NOTE}",
        "; ".join(notes),
    ]


def speedup_chart(speedups: pl.DataFrame, mode: str, confidence: float = 0.95) -> alt.FacetChart | None:
    """Speedup against load, one panel per metric (rows) and workload (columns), on a log axis centred on 1
    (one range per metric: `clip_ratio_band`), a rule at 1 (no change). Bands: the interval over repeats,
    clipped to the stated range, a triangle at the edge where it runs past; points hollow without an
    interval (one repeat); n (repeats) in the tooltip and the subtitle, beside the point when it varies."""
    prepared = _speedup_frame(speedups, mode)
    if prepared is None:
        return None
    frame, ranges = prepared
    labelled = len({n for n in frame["n_repeats"].to_list() if n is not None}) > 1
    return (
        alt.layer(*_speedup_layers(frame, mode, labelled), data=frame)
        .properties(width=WIDTH, height=HEIGHT)
        .facet(
            row=alt.Row("measure:N", title=None, sort=list(SPEEDUP_METRICS.values())),
            column=alt.Column("workload:N", title="workload"),
        )
        .resolve_scale(y="independent")
        .properties(
            title={
                "text": f"Speedup against load ({'open loop' if mode == 'open' else 'closed loop'})",
                "subtitle": _speedup_subtitle(frame, ranges, confidence),
            }
        )
    )


def latency_chart(
    latencies: pl.DataFrame, metrics: tuple[str, ...], title: str, subtitle: str
) -> alt.FacetChart | None:
    """Distributions as boxes from precomputed quantiles: box p25-p75, whiskers p5-p95, tick p50, dot p99.
    Whiskers and p99 are clipped per panel to SPREAD_FACTOR times the span of its boxes
    (`clip_spread_band`); a triangle at the edge marks one that runs past."""
    frame = latencies.filter(pl.col("metric").is_in(list(metrics)))
    if frame.is_empty():
        return None
    quantiles = ("q05_ms", "q25_ms", "q50_ms", "q75_ms", "q95_ms", "q99_ms")
    frame = frame.with_columns(
        pl.col("metric").replace_strict(LATENCY_LABELS).alias("measure"),
        *[(pl.col(f"q{q}") * 1000).alias(f"q{q}_ms") for q in ("05", "25", "50", "75", "95", "99")],
        (pl.col("mean") * 1000).alias("mean_ms"),
    ).select("variant", "workload", "load_label", "measure", "n", "mean_ms", *quantiles)
    frame = _json_safe(
        clip_spread_band(
            frame,
            points=("q25_ms", "q50_ms", "q75_ms"),
            lows=("q05_ms",),
            highs=("q95_ms", "q99_ms"),
            by=("measure", "workload"),
        )
    )
    order = sorted(frame["load_label"].unique().to_list(), key=_load_sort_key)
    y = _quantitative(alt.Y, "ms", alt.Scale(zero=False))
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
            *[alt.Tooltip(f"{c}:Q", format=".2f") for c in ("mean_ms", *quantiles)],
        ],
    )
    whisker = base.mark_rule().encode(y=y("q05_ms_shown"), y2="q95_ms_shown:Q")
    box = base.mark_bar(size=8, opacity=0.6).encode(y=y("q25_ms"), y2="q75_ms:Q")
    median = base.mark_tick(color="black", size=10, thickness=2).encode(y=y("q50_ms"))
    p99 = (
        base.transform_filter("!datum.q99_ms_past")
        .mark_point(shape="diamond", filled=True, size=25)
        .encode(y=y("q99_ms_shown"))
    )
    lines = [subtitle]
    if frame["past_low"].any() or frame["past_high"].any():
        lines.append(
            f"whiskers and p99 clipped to {SPREAD_FACTOR:g}x the span of the boxes in their panel; "
            "\u25b2/\u25bc = runs past (the tooltip has the value)"
        )
    return (
        alt.layer(whisker, box, median, p99, *_past_markers(base, y, "y", 45), data=frame)
        .properties(width=WIDTH, height=HEIGHT)
        .facet(
            row=alt.Row("measure:N", title=None, sort=[LATENCY_LABELS[m] for m in metrics]),
            column=alt.Column("workload:N", title="workload"),
        )
        .resolve_scale(y="independent")
        .properties(title={"text": title, "subtitle": lines if len(lines) > 1 else subtitle})
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


def titled_facets(
    chart: alt.Chart | alt.LayerChart,
    title: str,
    subtitle: str,
    *,
    width: int = WIDTH,
    height: int = HEIGHT,
    **facets: alt.Row | alt.Column,
) -> alt.FacetChart:
    """`chart` as panels of width x height, faceted by `facets` (row=, column=), under a title and subtitle:
    the tail every faceted chart of the report shares."""
    return (
        chart.properties(width=width, height=height)
        .facet(**facets)
        .properties(title={"text": title, "subtitle": subtitle})
    )


def position_chart(per_position: pl.DataFrame) -> alt.FacetChart | None:
    """Acceptance rate per draft position (1 = the first drafted token), per variant and workload."""
    if per_position.is_empty():
        return None
    frame = per_position.with_columns((pl.col("position") + 1).alias("draft_position"))
    lines = (
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
    )
    return titled_facets(
        lines,
        "Per-position acceptance",
        "accepted at position i / drafts (vLLM counters), mean over repeats and loads",
        column=alt.Column("workload:N", title="workload"),
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
    (analysis/simulate/cost.py); crosses: what the served chains measured, for the cost model's check. Log
    axis centred on 1, [1/R, R] from every point (`ratio_range`; no bands, nothing clipped); a projection or
    measurement that is not a positive number cannot sit on it and is left out."""
    speedup = pl.col("projected_speedup").cast(pl.Float64)
    frame = projections.filter(speedup.is_not_null() & speedup.is_finite() & (speedup > 0))
    if frame.is_empty():
        return None
    measured = pl.col("measured_speedup").cast(pl.Float64)
    frame = frame.with_columns(
        pl.when(measured.is_finite() & (measured > 0)).then(measured).alias("measured_speedup")
    )
    r = ratio_range([*frame["projected_speedup"].to_list(), *frame["measured_speedup"].to_list()])
    y_scale = alt.Scale(type="log", domain=[1.0 / r, r], nice=False, zero=False)
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
    frame = _json_safe(frame)
    x = _load_x(frame["load"], "concurrency (closed loop)")
    # tableau20: the served chains plus a few shapes easily pass the default scheme's 10 colours
    scale, legend = alt.Scale(scheme="tableau20"), alt.Legend(labelLimit=320)
    base = alt.Chart().encode(x=x, color=alt.Color("shape:N", title="shape", scale=scale, legend=legend))
    line = base.mark_line(point=True).encode(
        y=alt.Y("projected_speedup:Q", title="projected speedup vs plain (>1 faster, log)", scale=y_scale),
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
    served = base.mark_point(shape="cross", size=90, filled=True).encode(
        y=alt.Y("measured_speedup:Q", title="projected speedup vs plain (>1 faster, log)", scale=y_scale)
    )
    rule = alt.Chart().mark_rule(color="black", strokeDash=[4, 3]).encode(y=alt.datum(1))
    return (
        alt.layer(line, served, rule, data=frame)
        .properties(width=WIDTH, height=HEIGHT)
        .facet(column=alt.Column("workload:N", title="workload"))
        .properties(
            title={
                "text": "Trees and drafter combinations: projected speedup (offline)",
                "subtitle": "simulated acceptance on the campaign's greedy captures x a step-time model fitted on "
                "its cells; crosses: the served chains' measured speedup; log axis centred on 1 "
                f"({_range_text(r)})",
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
    with its interval over repeats, on a log axis centred on 1 (`clip_ratio_band`: the interval clipped to
    the stated range, a triangle at the edge where it runs past; hollow points: no interval); the dashed rule
    at 1 is no change, the green one the minimum effect the gain must clear, the red one the harm another
    stratum may take. The stratum's label carries its n (paired repeats)."""
    if view.is_empty():
        return None
    rows = []
    for r in view.filter(pl.col("stratum").is_not_null()).iter_rows(named=True):
        n = r.get("n_repeats")
        for key, label in ADAPTATION_METRICS.items():
            estimate = r.get(f"{key}_ratio")
            if estimate is None:
                continue
            rows.append(
                {
                    "stratum": f"{r['stratum']} {r['load_label']}"
                    + (" (target)" if r["target"] else "")
                    + (f" n={n}" if n is not None else ""),
                    "metric": label,
                    "ratio": float(estimate),
                    "low": r.get(f"{key}_low"),
                    "high": r.get(f"{key}_high"),
                    "n_repeats": n,
                    "adopt": "adopt" if r["adopt"] else "keep old",
                }
            )
    if not rows:
        return None
    schema = {"low": pl.Float64, "high": pl.Float64, "n_repeats": pl.Int64}
    frame = pl.DataFrame(rows, schema_overrides=schema)
    thresholds = (1.0 + min_effect, 1.0 - max_harm)
    frame, r = clip_ratio_band(frame, "low", "high", "ratio", extra=thresholds)
    frame = _json_safe(
        frame.with_columns(_interval_text(frame, "ratio", "low", "high").alias("ratio [interval]"))
    )
    x = _quantitative(
        alt.X, "new head / old head (log)", alt.Scale(type="log", domain=[1.0 / r, r], nice=False, zero=False)
    )
    tooltip = [
        "stratum",
        "metric",
        "ratio [interval]",
        alt.Tooltip("n_repeats:Q", title="n (repeats)"),
        alt.Tooltip("clip_note:N", title="interval"),
        "adopt",
    ]
    base = alt.Chart(frame).encode(
        y=alt.Y("stratum:N", title=None),
        yOffset=alt.YOffset("metric:N"),
        color=alt.Color("metric:N", sort=list(ADAPTATION_METRICS.values()), title=None),
    )
    bars = (
        base.transform_filter("datum.has_band")
        .mark_rule(strokeWidth=2)
        .encode(x=x("low_shown"), x2="high_shown:Q")
    )
    # two layers rather than a conditional fill, so that the verdict's legend keeps filled symbols
    shape = alt.Shape("adopt:N", title="verdict")
    points = (
        base.transform_filter("datum.drawable && datum.has_band")
        .mark_point(size=60, opacity=1, filled=True)
        .encode(x=x("ratio"), shape=shape, tooltip=tooltip)
    )
    hollow_points = (
        base.transform_filter("datum.drawable && !datum.has_band")
        .mark_point(size=60, opacity=1, strokeWidth=1.5, fill="white")
        .encode(x=x("ratio"), shape=shape, tooltip=tooltip)
    )
    rules = [
        alt.Chart(pl.DataFrame({"x": [v]})).mark_rule(strokeDash=[4, 3], color=colour).encode(x=x("x"))
        for v, colour in ((1.0, "#666"), (thresholds[0], "#2a9d4b"), (thresholds[1], "#c0392b"))
    ]
    hollow = frame.filter(pl.col("drawable") & ~pl.col("has_band")).height
    notes = [_n_text(frame["n_repeats"].to_list(), "paired repeats")]
    if hollow:
        notes.append(f"hollow: no interval ({hollow})")
    return alt.layer(
        *rules, bars, points, hollow_points, *_past_markers(base, x, "x", 60, tooltip)
    ).properties(
        width=WIDTH + 100,
        height=alt.Step(14),
        title={
            "text": "Adapted head against the old one, per stratum",
            "subtitle": [
                "ratio with its 95% t interval over repeats; green dashes: 1 + minimum effect, red: 1 - harm limit",
                f"log axis centred on 1; intervals clipped to {_range_text(r)}; "
                "a triangle at the edge: the interval runs past; " + "; ".join(notes),
            ],
        },
    )
