"""Q3: which depth k is best at each workload and load, and where drafting costs more than it saves.

Per cell (docs/analysis.md has the derivation):
  T  = generated tokens in the measured window, A = accepted draft tokens, steps = T - A;
  L  = T / (T - A)                   tokens per decode step (the bonus token included, over ALL steps);
  s_k = TPOT_mean x L                 inferred step time of the speculative deployment (summary.json);
  s_0 = TPOT_mean of plain            plain makes one token per step, so its step time is its TPOT;
  TPOT_spec / TPOT_plain = s_k / (L s_0), so speculation pays per token exactly when L > L* where
  L* = s_k / s_0                      the break-even tokens per step (break-even acceptance length).
The plain cell is the one of the same workload, load and repeat (paired as in Q1). Relative step time
s_k / s_0 against k is fitted per method when a campaign has several depths: slope = the added cost of one
more draft position, as a fraction of plain's step, and the fitted line is L*(k).
"""

from __future__ import annotations

import polars as pl

from analysis.acceptance import FIT_SCHEMA, fit_record
from analysis.data import AnalysisSettings, CampaignData
from analysis.speedup import CELL_KEY_SCHEMA, LOAD_KEYS, VARIANT_KEYS, gain
from analysis.stats import has_interval, interval_label, linear_fit, mean_interval

PAIR_KEYS = ("workload", "load_mode", "concurrency", "rate", "repeat")

DEPTH_SCHEMA = {
    **CELL_KEY_SCHEMA,
    "n_repeats": pl.Int32,
    "step_time_s": pl.Float64,
    "step_time_low": pl.Float64,
    "step_time_high": pl.Float64,
    "interval": pl.String,
    "plain_step_time_s": pl.Float64,
    "relative_step_time": pl.Float64,
    "tokens_per_step": pl.Float64,
    "break_even_tokens_per_step": pl.Float64,
    "mean_acceptance_length": pl.Float64,
    "acceptance_rate": pl.Float64,
    "throughput_speedup": pl.Float64,
    "tpot_p50_speedup": pl.Float64,
    "below_one": pl.Boolean,
    "pays_per_token": pl.Boolean,
    "best": pl.Boolean,
}


def step_points(data: CampaignData) -> pl.DataFrame:
    """One row per speculative cell with its step time, its paired plain step time, L and L*."""
    if data.acceptance.is_empty():
        return pl.DataFrame()
    plain = data.cells.filter(pl.col("method") == "none").select(
        *PAIR_KEYS, pl.col("tpot_mean_s").alias("plain_step_time_s")
    )
    spec = data.acceptance.join(data.cells.select("cell_id", "tpot_mean_s"), on="cell_id", how="left")
    return (
        spec.join(plain, on=list(PAIR_KEYS), how="inner", nulls_equal=True)
        .with_columns(
            (
                (pl.col("decode_steps") + pl.col("accepted_tokens")).cast(pl.Float64)
                / pl.col("decode_steps").cast(pl.Float64)
            ).alias("tokens_per_step"),
            pl.col("inferred_step_time_s").alias("step_time_s"),
        )
        .with_columns(
            (pl.col("step_time_s") / pl.col("plain_step_time_s")).alias("relative_step_time"),
        )
        .with_columns(pl.col("relative_step_time").alias("break_even_tokens_per_step"))
        # A step time of 0 comes from streams read in one burst (TPOT 0: the tiny model on a fast machine
        # outran the client's reads); like a 0 s latency in a speedup, it measures nothing and is left out.
        .filter((pl.col("step_time_s") > 0) & (pl.col("plain_step_time_s") > 0))
    )


def depth_table(
    data: CampaignData, speedups: pl.DataFrame, settings: AnalysisSettings | None = None
) -> pl.DataFrame:
    """Per speculative variant, workload and load: step time (interval over repeats), L, L*, speedups, the
    flags `below_one` (throughput speedup < 1) and `pays_per_token` (L > L*), and `best` (highest throughput
    speedup among the depths of its method at that workload and load)."""
    settings = settings or AnalysisSettings()
    points = step_points(data)
    if points.is_empty():
        return pl.DataFrame(schema=DEPTH_SCHEMA)
    throughput = gain(speedups, "throughput").select(
        *VARIANT_KEYS, *LOAD_KEYS, pl.col("estimate").alias("throughput_speedup")
    )
    tpot = gain(speedups, "tpot_p50").select(
        *VARIANT_KEYS, *LOAD_KEYS, pl.col("estimate").alias("tpot_p50_speedup")
    )
    rows = []
    for key, group in points.group_by([*VARIANT_KEYS, *LOAD_KEYS], maintain_order=True):
        interval = mean_interval(group["step_time_s"].to_list(), confidence=settings.confidence)
        drawn = has_interval(interval)
        tokens_per_step = float(group["tokens_per_step"].mean())
        break_even = float(group["break_even_tokens_per_step"].mean())
        rows.append(
            {
                **dict(zip((*VARIANT_KEYS, *LOAD_KEYS), key, strict=True)),
                "n_repeats": interval.n,
                "step_time_s": interval.estimate,
                "step_time_low": interval.low if drawn else None,
                "step_time_high": interval.high if drawn else None,
                "interval": interval_label(interval),
                "plain_step_time_s": float(group["plain_step_time_s"].mean()),
                "relative_step_time": float(group["relative_step_time"].mean()),
                "tokens_per_step": tokens_per_step,
                "break_even_tokens_per_step": break_even,
                "mean_acceptance_length": group["mean_acceptance_length"].mean(),
                "acceptance_rate": group["acceptance_rate"].mean(),
                "pays_per_token": tokens_per_step > break_even,
            }
        )
    table = (
        pl.DataFrame(rows, schema={name: DEPTH_SCHEMA[name] for name in rows[0]})
        .join(throughput, on=[*VARIANT_KEYS, *LOAD_KEYS], how="left", nulls_equal=True)
        .join(tpot, on=[*VARIANT_KEYS, *LOAD_KEYS], how="left", nulls_equal=True)
        .with_columns((pl.col("throughput_speedup") < 1.0).alias("below_one"))
    )
    best_score = pl.col("throughput_speedup").max().over("method", *LOAD_KEYS)
    table = table.with_columns((pl.col("throughput_speedup") == best_score).fill_null(False).alias("best"))
    return (
        table.select(list(DEPTH_SCHEMA))
        .cast(DEPTH_SCHEMA)
        .sort(  # type: ignore[arg-type]
            "workload", "load_mode", "concurrency", "rate", "method", "k", nulls_last=True
        )
    )


def step_time_fits(data: CampaignData, settings: AnalysisSettings | None = None) -> pl.DataFrame:
    """Relative step time s_k / s_0 against k, per method (all workloads and loads) and per method and
    workload. Needs at least two depths of the method: with one there is no slope (`note` says so)."""
    settings = settings or AnalysisSettings()
    points = step_points(data)
    if points.is_empty():
        return pl.DataFrame(schema=FIT_SCHEMA)
    rows = []
    # One fit per method and setting: a sweep's samplings and layouts step at different costs.
    points = points.with_columns(
        pl.col("variant").replace_strict(data.setting_labels, default="").alias("setting")
    )
    for (method, setting), group in points.group_by(["method", "setting"], maintain_order=True):
        scopes: list[tuple[str | None, pl.DataFrame]] = [(None, group)]
        scopes += [(w, g) for (w,), g in group.group_by(["workload"], maintain_order=True)]
        for workload, scope in scopes:
            fit = linear_fit(
                scope["k"].to_list(), scope["relative_step_time"].to_list(), confidence=settings.confidence
            )
            note = fit.note
            if not fit.fitted and scope["k"].n_unique() < 2:
                note = f"one depth (k={scope['k'][0]}): no slope; L* per cell is in the depth table"
            n_deployments = scope.select("variant", "repeat").n_unique()
            rows.append(
                fit_record(
                    "Q3",
                    f"{method} ({setting})" if setting else method,
                    workload,
                    "k",
                    "relative_step_time",
                    fit,
                    n_deployments=n_deployments,
                    note=note,
                )
            )
    return pl.DataFrame(rows, schema=FIT_SCHEMA).sort("method", "workload", nulls_last=False)


def step_chart_points(data: CampaignData) -> pl.DataFrame:
    """Step time against k per workload and load for the chart: plain at k = 0 (its TPOT), every
    speculative variant at its depth; mean over repeats."""
    plain = (
        data.cells.filter(pl.col("method") == "none")
        .group_by("variant", "method", "workload", "load_label", "concurrency", "rate")
        .agg(pl.col("tpot_mean_s").mean().alias("step_time_s"), pl.len().alias("n"))
        .with_columns(pl.lit(0, dtype=pl.Int32).alias("k"))
    )
    points = step_points(data)
    if points.is_empty():
        return plain.select(
            "variant", "method", "k", "workload", "load_label", "concurrency", "rate", "step_time_s", "n"
        )
    spec = points.group_by("variant", "method", "k", "workload", "load_label", "concurrency", "rate").agg(
        pl.col("step_time_s").mean(), pl.len().alias("n")
    )
    columns = ["variant", "method", "k", "workload", "load_label", "concurrency", "rate", "step_time_s", "n"]
    return pl.concat([plain.select(columns), spec.select(columns).cast({"k": pl.Int32})]).sort(
        "workload", "concurrency", "rate", "method", "k", nulls_last=True
    )
