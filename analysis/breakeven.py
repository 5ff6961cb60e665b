"""Break-even acceptance measured directly: the acceptance length at which speculation stops paying, from
synthetic-acceptance runs (a variant listed with several `synthetic_acceptance_length` values: the drafter
and the verification run for real, acceptance is drawn at the named length), beside the break-even the depth
analysis infers from the real runs (analysis.depth: L* = s_k / s_0).

Per drafter family, depth k, workload and closed-loop load: the throughput speedup over plain at each
configured length L (paired per repeat, as Q1) is fitted by least squares, speedup = a + b L, and the
break-even is L* = (1 - a) / b, where the line crosses 1. Its interval: each repeat's points at every L
(one block, so drift stays paired) give that repeat's own crossing; Student t over those
(analysis.stats.per_repeat_interval). With two lengths the
line goes through both points; a crossing outside the measured lengths is an extrapolation, and `note`
says so.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from analysis.data import AnalysisSettings, CampaignData
from analysis.speedup import gain
from analysis.stats import has_interval, per_repeat_interval
from experiments.spec import Variant

BREAK_EVEN_SCHEMA = {
    "family": pl.String,
    "k": pl.Int32,
    "workload": pl.String,
    "concurrency": pl.Int32,
    "lengths": pl.List(pl.Float64),
    "n_repeats": pl.Int32,
    "break_even": pl.Float64,
    "break_even_low": pl.Float64,
    "break_even_high": pl.Float64,
    "inferred_break_even": pl.Float64,  # analysis.depth's L* from the real variant of the same k, if measured
    "note": pl.String,
}


def synthetic_lengths(spec: dict) -> dict[str, tuple[str, int, float]]:
    """variant name -> (family, k, configured length) for the spec's synthetic-acceptance variants."""
    out = {}
    for entry in spec.get("variants") or []:
        variant = Variant.model_validate(entry)
        if variant.synthetic_acceptance_length is not None:
            family = " ".join(part for part in (variant.method, variant.drafter) if part)
            out[variant.name] = (family, int(variant.k or 0), float(variant.synthetic_acceptance_length))
    return out


def _crossing(lengths: np.ndarray, speedups: np.ndarray) -> float:
    """Where the least-squares line through (L, speedup) crosses 1 (nan when it is flat or not defined)."""
    if len(np.unique(lengths)) < 2:
        return float("nan")
    slope, intercept = np.polyfit(lengths, speedups, 1)
    return float((1.0 - intercept) / slope) if slope != 0 else float("nan")


def _per_repeat_crossings(points: list[tuple[float, int, float]], repeats: list[int]) -> list[float]:
    """Each repeat's own crossing (its points alone)."""
    return [
        _crossing(
            np.array([p[0] for p in points if p[1] == r]), np.array([p[2] for p in points if p[1] == r])
        )
        for r in repeats
    ]


def break_even_table(
    data: CampaignData, speedups: pl.DataFrame, depth: pl.DataFrame, settings: AnalysisSettings | None = None
) -> pl.DataFrame:
    settings = settings or AnalysisSettings()
    synthetic = synthetic_lengths(data.spec)
    rows = gain(speedups, "throughput").filter(
        (pl.col("load_mode") == "closed") & pl.col("variant").is_in(list(synthetic))
    )
    if rows.is_empty():
        return pl.DataFrame(schema=BREAK_EVEN_SCHEMA)
    rows = rows.with_columns(
        pl.col("variant").replace_strict({v: f for v, (f, _, _) in synthetic.items()}).alias("family"),
        pl.col("variant")
        .replace_strict({v: length for v, (_, _, length) in synthetic.items()})
        .alias("length"),
    )
    real = {}
    if not depth.is_empty():
        for r in depth.filter(~pl.col("variant").is_in(list(synthetic))).iter_rows(named=True):
            real[(r["method"], r["k"], r["workload"], r["concurrency"])] = r["break_even_tokens_per_step"]
    out = []
    keys = ["family", "k", "workload", "concurrency"]
    for key, group in rows.sort("length").group_by(keys, maintain_order=True):
        family, k, workload, concurrency = key
        points = [
            (float(r["length"]), repeat, ratio)
            for r in group.iter_rows(named=True)
            for repeat, ratio in zip(r["repeats"], r["per_repeat"], strict=True)
        ]
        lengths = np.array([p[0] for p in points])
        ratios = np.array([p[2] for p in points])
        repeats = sorted({p[1] for p in points})
        estimate = _crossing(lengths, ratios)
        low = high = None
        notes = []
        if len(repeats) > 1:
            interval = per_repeat_interval(
                estimate, _per_repeat_crossings(points, repeats), confidence=settings.confidence
            )
            if has_interval(interval):
                low, high = interval.low, interval.high
            else:
                notes.append(interval.method)
        measured = sorted(set(lengths.tolist()))
        if len(repeats) < 2:
            notes.append("one repeat: no interval")
        if np.isfinite(estimate) and not measured[0] <= estimate <= measured[-1]:
            notes.append(f"extrapolated beyond the measured lengths {measured[0]:g}-{measured[-1]:g}")
        method = str(group["method"][0])
        out.append(
            {
                "family": family,
                "k": int(k),
                "workload": workload,
                "concurrency": int(concurrency),
                "lengths": measured,
                "n_repeats": len(repeats),
                "break_even": estimate if np.isfinite(estimate) else None,
                "break_even_low": low,
                "break_even_high": high,
                "inferred_break_even": real.get((method, int(k), workload, int(concurrency))),
                "note": "; ".join(notes),
            }
        )
    return pl.DataFrame(out, schema=BREAK_EVEN_SCHEMA)
