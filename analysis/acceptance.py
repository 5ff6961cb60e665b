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
from analysis.stats import LinearFit, linear_fit

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
