"""Shallow drafters (issue 33): a drafter's own depth (its decoder layers) as an axis, beside the draft
depth k that analysis.depth studies.

Per speculative cell (analysis.depth.step_points: s_k = TPOT_mean x L, s_0 = plain's TPOT of the same
workload, load and repeat), the drafting cost per draft position is

    c = (s_k - s_0) / k

(what a speculative step costs beyond plain's, spread over the k draft positions; the verification of the
k extra tokens is in it too, the same for every drafter depth at one k). The per-layer cost model fits, per
method, workload and load, over every cell of the campaign's drafter depths (each repeat a point),

    c = a + b x layers

by least squares (analysis.stats.linear_fit: t intervals on a and b, n - 2 degrees of freedom): b is what
one more drafter layer costs per draft position, a what drafting costs without layers (embedding, lm_head,
the verification's share, the engine's bookkeeping). Which depth wins at a load is the one with the highest
throughput speedup over plain (analysis.speedup's geometric mean over repeats and its t interval), and the
table says whether its interval clears the runner-up's: a win the intervals cannot tell apart is named
as such, never as a verdict.

A variant's layer count is its `draft_layers` when it truncates its draft, else its drafter's config.json
`num_hidden_layers` (draft models and EAGLE-3 heads alike), read from the checkpoint the spec names;
variants whose checkpoint is not readable here are left out, and the notes say so.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import altair as alt
import polars as pl

from analysis.charts import titled_facets
from analysis.data import CampaignData
from analysis.depth import step_points
from analysis.report import Column, Section, col, fmt_bool, fmt_interval, html_table
from analysis.speedup import CELL_KEY_SCHEMA
from analysis.stats import linear_fit
from experiments.spec import Variant
from specgauge.settings import REPO_ROOT

GROUP_KEYS = ("method", "workload", "load_label", "concurrency")
# the cell keys as analysis.speedup types them: the group keys, a variant and its k
_KEY_SCHEMA = {key: CELL_KEY_SCHEMA[key] for key in (*GROUP_KEYS, "variant", "k")}

COST_SCHEMA = {
    **{key: _KEY_SCHEMA[key] for key in GROUP_KEYS},
    "layers": pl.List(pl.Int32),
    "n_points": pl.Int32,
    "per_layer_s": pl.Float64,
    "per_layer_low": pl.Float64,
    "per_layer_high": pl.Float64,
    "fixed_s": pl.Float64,
    "fixed_low": pl.Float64,
    "fixed_high": pl.Float64,
    "r_squared": pl.Float64,
    "note": pl.String,
}

WINNER_SCHEMA = {
    **_KEY_SCHEMA,
    "layers": pl.Int32,
    "throughput_speedup": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "interval": pl.String,
    "tokens_per_step": pl.Float64,
    "cost_per_position_s": pl.Float64,
    "wins": pl.Boolean,
    "clear": pl.Boolean,  # the winner's interval lies wholly above the runner-up's (both drawn)
}


def _config_layers(path: str) -> int | None:
    directory = Path(path) if Path(path).is_absolute() else REPO_ROOT / path
    try:
        layers = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("num_hidden_layers")
    except (OSError, ValueError):
        return None
    return layers if isinstance(layers, int) and not isinstance(layers, bool) else None


def drafter_layers(spec: dict[str, Any]) -> dict[str, int | None]:
    """Speculative variant name -> its drafter's decoder layers (None: not readable here, or no drafter)."""
    out: dict[str, int | None] = {}
    for entry in spec.get("variants") or []:
        variant = Variant.model_validate(entry)
        if not variant.speculative:
            continue
        if variant.draft_layers is not None:
            out[variant.name] = variant.draft_layers
        else:
            drafter = variant.methods[variant.method].drafter(variant)
            out[variant.name] = _config_layers(drafter) if drafter else None
    return out


def cost_points(data: CampaignData) -> pl.DataFrame:
    """Per speculative cell with a drafter of known depth: its layers and the cost per draft position."""
    points = step_points(data)
    layers = {name: n for name, n in drafter_layers(data.spec).items() if n is not None}
    if points.is_empty() or not layers:
        return pl.DataFrame()
    return (
        points.filter(pl.col("variant").is_in(list(layers)) & (pl.col("k") > 0))
        .with_columns(
            pl.col("variant").replace_strict(layers, return_dtype=pl.Int32).alias("layers"),
            ((pl.col("step_time_s") - pl.col("plain_step_time_s")) / pl.col("k")).alias(
                "cost_per_position_s"
            ),
        )
        .select(
            *GROUP_KEYS,
            "variant",
            "k",
            "repeat",
            "layers",
            "step_time_s",
            "plain_step_time_s",
            "tokens_per_step",
            "cost_per_position_s",
        )
    )


def cost_model(points: pl.DataFrame) -> pl.DataFrame:
    """c = a + b x layers per method, workload and load, over every cell of two or more drafter depths."""
    rows = []
    if points.is_empty():
        return pl.DataFrame(schema=COST_SCHEMA)
    for key, group in points.group_by(list(GROUP_KEYS), maintain_order=True):
        depths = sorted(set(group["layers"].to_list()))
        if len(depths) < 2:
            continue  # one depth: nothing to fit against
        fit = linear_fit(group["layers"].to_list(), group["cost_per_position_s"].to_list())
        rows.append(
            {
                **dict(zip(GROUP_KEYS, key, strict=True)),
                "layers": depths,
                "n_points": fit.n,
                "per_layer_s": fit.slope,
                "per_layer_low": fit.slope_low,
                "per_layer_high": fit.slope_high,
                "fixed_s": fit.intercept,
                "fixed_low": fit.intercept_low,
                "fixed_high": fit.intercept_high,
                "r_squared": fit.r2,
                "note": fit.note or "",
            }
        )
    return pl.DataFrame(rows, schema=COST_SCHEMA).sort("method", "workload", "concurrency", nulls_last=True)


def winners(points: pl.DataFrame, speedup: pl.DataFrame) -> pl.DataFrame:
    """Per method, workload and load where two or more drafter depths ran: each depth's throughput speedup,
    the winner (highest estimate) and whether its interval clears the runner-up's (both drawn, disjoint)."""
    if points.is_empty() or speedup.is_empty():
        return pl.DataFrame(schema=WINNER_SCHEMA)
    per_variant = points.group_by([*GROUP_KEYS, "variant", "k", "layers"]).agg(
        pl.col("tokens_per_step").mean(), pl.col("cost_per_position_s").mean()
    )
    gains = speedup.filter(pl.col("metric") == "throughput").select(
        "variant",
        "workload",
        "load_label",
        pl.col("estimate").alias("throughput_speedup"),
        "ci_low",
        "ci_high",
        "interval",
    )
    table = per_variant.join(gains, on=["variant", "workload", "load_label"], how="inner")
    rows = []
    for _, group in table.group_by(list(GROUP_KEYS), maintain_order=True):
        if group["layers"].n_unique() < 2:
            continue
        ranked = group.sort("throughput_speedup", descending=True).to_dicts()
        best, runner = ranked[0], ranked[1]
        clear = None not in (best["ci_low"], runner["ci_high"]) and best["ci_low"] > runner["ci_high"]
        for i, row in enumerate(ranked):
            rows.append({**row, "wins": i == 0, "clear": bool(clear) if i == 0 else False})
    return pl.DataFrame(rows, schema=WINNER_SCHEMA).sort(
        "method", "workload", "concurrency", "layers", nulls_last=True
    )


def depth_chart(table: pl.DataFrame) -> alt.FacetChart | None:
    """Throughput speedup over plain against load, one line per drafter depth, per method and workload."""
    if table.is_empty():
        return None
    frame = table.with_columns(
        (pl.col("layers").cast(pl.String) + " layers").alias("drafter"),
    )
    lines = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("concurrency:Q", title="concurrency", scale=alt.Scale(type="log")),
            y=alt.Y("throughput_speedup:Q", title="throughput over plain", scale=alt.Scale(zero=False)),
            color=alt.Color("drafter:N", title="drafter depth"),
            tooltip=[
                "variant",
                "k",
                "layers",
                alt.Tooltip("throughput_speedup:Q", format=".3f"),
                "interval",
                alt.Tooltip("cost_per_position_s:Q", format=".5f"),
            ],
        )
    )
    return titled_facets(
        lines,
        "Which drafter depth wins at which load",
        "throughput speedup over plain (geometric mean over repeats) per drafter depth",
        width=220,
        row=alt.Row("method:N"),
        column=alt.Column("workload:N"),
    )


def has_drafter_depths(data: CampaignData) -> bool:
    """Whether any method of the campaign ran drafters of two or more depths."""
    by_method: dict[str, set[int]] = {}
    for entry in data.spec.get("variants") or []:
        variant = Variant.model_validate(entry)
        layers = drafter_layers({"variants": [entry]}).get(variant.name)
        if layers is not None:
            by_method.setdefault(variant.method, set()).add(layers)
    return any(len(depths) > 1 for depths in by_method.values())


def _ms_interval(estimate: Any, low: Any, high: Any) -> str:
    scale = [None if v is None else v * 1000 for v in (estimate, low, high)]
    return fmt_interval(*scale, None if low is not None else "n<3 or flat: no interval")


def drafter_depth_section(data: CampaignData, speedup: pl.DataFrame, chart_html: str) -> Section:
    """The report's answer: the per-layer cost model and, per load, which drafter depth wins."""
    points = cost_points(data)
    model = cost_model(points)
    table = winners(points, speedup)
    missing = [name for name, n in drafter_layers(data.spec).items() if n is None]
    note = (
        f'<p class="note">Left out (drafter depth not readable here): {html.escape(", ".join(missing))}.</p>'
        if missing
        else ""
    )
    return Section(
        "drafter-depth",
        "Shallow drafters: which drafter depth wins at which load",
        '<p class="note">Cost per draft position c = (step_k - step_plain) / k per cell (step_k = TPOT_mean x L); '
        "fitted c = a + b x layers over every cell of the drafter depths (t intervals, n - 2 degrees of freedom). "
        "The winner has the highest throughput speedup at its load; <em>clear</em> when its interval lies above "
        "the runner-up's.</p>"
        + note
        + "<h3>Per-layer cost model</h3>"
        + html_table(
            model,
            [
                col("method"),
                col("workload"),
                col("load_label", "load"),
                Column("depths", lambda r: ", ".join(str(n) for n in r["layers"])),
                col("n_points", "n"),
                Column(
                    "b: per layer, ms [CI]",
                    lambda r: _ms_interval(r["per_layer_s"], r["per_layer_low"], r["per_layer_high"]),
                ),
                Column(
                    "a: fixed, ms [CI]", lambda r: _ms_interval(r["fixed_s"], r["fixed_low"], r["fixed_high"])
                ),
                col("r_squared", "R²"),
                col("note"),
            ],
            empty="no method ran drafters of two or more depths with step times",
        )
        + "<h3>Which depth wins</h3>"
        + html_table(
            table,
            [
                col("method"),
                col("workload"),
                col("load_label", "load"),
                col("variant"),
                col("k"),
                col("layers"),
                Column(
                    "throughput speedup [CI]",
                    lambda r: fmt_interval(r["throughput_speedup"], r["ci_low"], r["ci_high"], r["interval"]),
                ),
                col("tokens_per_step", "L"),
                Column("cost / position ms", lambda r: f"{r['cost_per_position_s'] * 1000:.3g}"),
                col("wins", "wins", fmt_bool),
                col("clear", "clear", fmt_bool),
            ],
            row_class=lambda r: "win" if r["wins"] else "",
            empty="no load where two drafter depths of one method ran",
        )
        + chart_html,
    )


def drafter_depth_chart(data: CampaignData, speedup: pl.DataFrame) -> alt.FacetChart | None:
    """The report's chart (None: no method ran two drafter depths)."""
    if not has_drafter_depths(data):
        return None
    return depth_chart(winners(cost_points(data), speedup))
