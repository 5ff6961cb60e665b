"""Q2: how strongly acceptance rate and mean acceptance length predict TTFT, TPOT and throughput.

Per speculative method, every cell (variant x repeat x workload x load) is a point: x = its acceptance rate
or vLLM's mean acceptance length (from its /metrics deltas), y = its speedup against the paired plain cell
(TTFT p50, TPOT p50, output throughput). Speedups rather than raw seconds: raw latency is dominated by load
and prompt length, which the paired ratio takes out, leaving what speculation changes. Fits are least
squares (scipy.stats.linregress) with t intervals and R². Cells of one deployment are not independent
replicates, so the intervals describe the fit over these cells; `n_deployments` says how many launches
they came from.
"""

from __future__ import annotations

from dataclasses import asdict

import polars as pl

from analysis.data import AnalysisSettings, CampaignData
from analysis.stats import LinearFit, cluster_ratio_interval, has_interval, interval_label, linear_fit

PREDICTORS = ("acceptance_rate", "mean_acceptance_length")
RESPONSES = ("ttft_p50_speedup", "tpot_p50_speedup", "throughput_speedup")

FIT_SCHEMA = {
    "question": pl.String,
    "method": pl.String,
    "workload": pl.String,
    "predictor": pl.String,
    "response": pl.String,
    "n": pl.Int32,
    "n_deployments": pl.Int32,
    "slope": pl.Float64,
    "slope_low": pl.Float64,
    "slope_high": pl.Float64,
    "intercept": pl.Float64,
    "intercept_low": pl.Float64,
    "intercept_high": pl.Float64,
    "r2": pl.Float64,
    "p_value": pl.Float64,
    "note": pl.String,
}


def fit_row(
    question: str,
    method: str,
    workload: str | None,
    predictor: str,
    response: str,
    points: pl.DataFrame,
    confidence: float,
) -> dict:
    """One fit of `response` on `predictor` over the frame's rows (which carry variant and repeat)."""
    clean = (
        points.select(predictor, response, "variant", "repeat")
        .drop_nulls([predictor, response])
        .filter(pl.col(response).is_finite() & (pl.col(response) > 0))  # see speedup.py: 0 is no speedup
    )
    fit = linear_fit(clean[predictor].to_list(), clean[response].to_list(), confidence=confidence)
    n_deployments = clean.select("variant", "repeat").n_unique() if clean.height else 0
    return fit_record(question, method, workload, predictor, response, fit, n_deployments=n_deployments)


def fit_record(
    question: str,
    method: str,
    workload: str | None,
    predictor: str,
    response: str,
    fit: LinearFit,
    *,
    n_deployments: int,
    note: str | None = None,
) -> dict:
    """A row of FIT_SCHEMA (Q2's fits and Q3's step-time fits): the fit's figures, its note unless `note`."""
    return {
        "question": question,
        "method": method,
        "workload": workload,
        "predictor": predictor,
        "response": response,
        **asdict(fit),  # n, slope (low, high), intercept (low, high), r2, p_value, note
        "n_deployments": n_deployments,
        "note": fit.note if note is None else note,
    }


def acceptance_fits(data: CampaignData, settings: AnalysisSettings | None = None) -> pl.DataFrame:
    """Per method, each predictor x response: slope, intercept (with intervals), R², p-value, n."""
    settings = settings or AnalysisSettings()
    points = data.speedup
    if points.is_empty():
        return pl.DataFrame(schema=FIT_SCHEMA)
    rows = [
        fit_row("Q2", method, None, predictor, response, group, settings.confidence)
        for (method,), group in points.group_by(["method"], maintain_order=True)
        for predictor in PREDICTORS
        for response in RESPONSES
    ]
    return pl.DataFrame(rows, schema=FIT_SCHEMA).sort("method", "predictor", "response")


def acceptance_points(data: CampaignData) -> pl.DataFrame:
    """The points behind the fits (for the report's scatter)."""
    columns = ["variant", "method", "k", "repeat", "workload", "load_label", *PREDICTORS, *RESPONSES]
    return data.speedup.select(columns) if not data.speedup.is_empty() else pl.DataFrame()


def per_position(data: CampaignData) -> pl.DataFrame:
    """Mean acceptance per draft position, per variant and workload, over repeats and loads."""
    if data.positions.is_empty():
        return pl.DataFrame(
            schema={
                "variant": pl.String,
                "method": pl.String,
                "k": pl.Int32,
                "workload": pl.String,
                "position": pl.Int32,
                "acceptance_rate": pl.Float64,
                "cells": pl.UInt32,
            }
        )
    return (
        data.positions.group_by("variant", "method", "k", "workload", "position")
        .agg(pl.col("acceptance_rate").mean(), pl.len().alias("cells"))
        .sort("variant", "workload", "position")
    )


# -------------------------------------------------------------------------- acceptance with its interval

# The acceptance figures with their bootstrap intervals, named alike in every table that carries them
ACCEPTANCE_FIGURES = {
    "mean_acceptance_length": pl.Float64,
    "mean_acceptance_length_low": pl.Float64,
    "mean_acceptance_length_high": pl.Float64,
    "acceptance_rate": pl.Float64,
    "acceptance_rate_low": pl.Float64,
    "acceptance_rate_high": pl.Float64,
}
ACCEPTANCE_INTERVAL_SCHEMA = {
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int32,
    "workload": pl.String,
    "load_label": pl.String,
    "prompts": pl.Int32,
    "launches": pl.Int32,
    "requests": pl.Int32,
    **ACCEPTANCE_FIGURES,
    "counters_mean_acceptance_length": pl.Float64,
    "acceptance_interval": pl.String,
}


def acceptance_intervals(data: CampaignData, settings: AnalysisSettings | None = None) -> pl.DataFrame:
    """Mean acceptance length and acceptance rate per speculative variant, workload and load, from the
    requests' own acceptance (vLLM's per-request block, tasks.load.client), with a bootstrap interval over
    prompts (analysis.stats.cluster_ratio_interval; several launches are resampled too). Under greedy decoding
    every launch accepts the same, so the spread that generalises is between prompts: one launch gets an
    interval. `counters_mean_acceptance_length` is the cells' counter figure (mean over them) beside it: the
    requests' sums must agree with the counters. Variants whose requests carry no acceptance (vLLM before
    0.32, `target.per_request_acceptance: false`) get the counter figure and no interval, and say so."""
    settings = settings or AnalysisSettings()
    keys = ["variant", "method", "k", "workload", "load_label"]
    counters = (
        data.acceptance.group_by(keys).agg(
            pl.col("mean_acceptance_length").mean().alias("counters_mean_acceptance_length")
        )
        if not data.acceptance.is_empty()
        else pl.DataFrame(
            schema={
                **{k: ACCEPTANCE_INTERVAL_SCHEMA[k] for k in keys},
                "counters_mean_acceptance_length": pl.Float64,
            }
        )
    )
    requests = data.request_acceptance
    # each key's requests, partitioned once (not one filter of every request per key)
    by_key = requests.partition_by(keys, as_dict=True) if not requests.is_empty() else {}
    rows = []
    for key in counters.sort(keys).iter_rows(named=True):
        group = by_key.get(tuple(key[k] for k in keys), pl.DataFrame())
        row = {k: key[k] for k in keys} | {
            "counters_mean_acceptance_length": key["counters_mean_acceptance_length"]
        }
        if group.is_empty():
            rows.append(
                row
                | {
                    "prompts": 0,
                    "launches": 0,
                    "requests": 0,
                    "mean_acceptance_length": key["counters_mean_acceptance_length"],
                    "acceptance_interval": "counters only (no per-request acceptance): no interval",
                }
            )
            continue
        clusters = group["prompt_id"].to_list()
        launches = group["deployment_id"].to_list()
        accepted = group["spec_accepted_tokens"].to_list()
        common = {"confidence": settings.confidence, "seed": 0}
        # a step accepts at most k drafts and a draft is accepted at most once: no interval reaches past them
        depth = float(key["k"]) if key["k"] else None
        mal = cluster_ratio_interval(
            accepted, group["spec_steps"].to_list(), clusters, launches, offset=1.0, ceiling=depth, **common
        )
        rate = cluster_ratio_interval(
            accepted, group["spec_draft_tokens"].to_list(), clusters, launches, ceiling=1.0, **common
        )
        mal_drawn, rate_drawn = has_interval(mal), has_interval(rate)
        rows.append(
            row
            | {
                "prompts": len(set(clusters)),
                "launches": len(set(launches)),
                "requests": group.height,
                "mean_acceptance_length": mal.estimate,
                "mean_acceptance_length_low": mal.low if mal_drawn else None,
                "mean_acceptance_length_high": mal.high if mal_drawn else None,
                "acceptance_rate": rate.estimate,
                "acceptance_rate_low": rate.low if rate_drawn else None,
                "acceptance_rate_high": rate.high if rate_drawn else None,
                "acceptance_interval": interval_label(mal),
            }
        )
    return pl.DataFrame(rows, schema=ACCEPTANCE_INTERVAL_SCHEMA)
