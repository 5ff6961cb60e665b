"""Q4: when n-gram speculation is the better operational choice than a draft model.

Per workload and load, the best n-gram variant and the best draft-model variant (highest gain estimate
among their depths) are set side by side with the decision rule's verdict for each, their paired ratio
(draft / n-gram, per repeat, t interval over repeats on the log scale), the KV-cache capacity each deployment reported at
start-up (a draft model's weights and KV cache take memory the target's KV cache no longer has), the peak
KV-cache usage and the preemptions during the cells.

The choice:
  - neither wins under the decision rule: plain;
  - one wins: that one;
  - both win: the draft model only when its gain over n-gram is itself significant (the interval of
    draft / n-gram lies above 1); otherwise n-gram, which is as fast within the evidence and costs no draft
    weights, no KV-cache capacity and no second model to keep in step with the target.
`indicative` says which point estimate is higher; it is not a decision.
"""

from __future__ import annotations

import polars as pl

from analysis.data import AnalysisSettings, CampaignData
from analysis.speedup import LOAD_KEYS, gain, paired_ratio
from analysis.stats import has_interval, interval_label

CHOICE_SCHEMA = {
    "workload": pl.String,
    "load_mode": pl.String,
    "load_label": pl.String,
    "concurrency": pl.Int32,
    "rate": pl.Float64,
    "ngram_variant": pl.String,
    "ngram_speedup": pl.Float64,
    "ngram_low": pl.Float64,
    "ngram_high": pl.Float64,
    "ngram_wins": pl.Boolean,
    "draft_variant": pl.String,
    "draft_speedup": pl.Float64,
    "draft_low": pl.Float64,
    "draft_high": pl.Float64,
    "draft_wins": pl.Boolean,
    "draft_over_ngram": pl.Float64,
    "draft_over_ngram_low": pl.Float64,
    "draft_over_ngram_high": pl.Float64,
    "n_repeats": pl.Int32,
    "interval": pl.String,
    "kv_tokens_plain": pl.Int64,
    "kv_tokens_ngram": pl.Int64,
    "kv_tokens_draft": pl.Int64,
    "draft_kv_loss": pl.Float64,
    "kv_usage_peak_ngram": pl.Float64,
    "kv_usage_peak_draft": pl.Float64,
    "preemptions_ngram": pl.Float64,
    "preemptions_draft": pl.Float64,
    "choice": pl.String,
    "reason": pl.String,
    "indicative": pl.String,
}


def kv_capacity(data: CampaignData) -> dict[str, int | None]:
    """variant -> KV-cache tokens its measured deployments reported (mean over launches; None: unknown)."""
    if data.deployments.is_empty():
        return {}
    arms = data.deployments.filter(pl.col("repeat").is_not_null() & pl.col("kv_cache_tokens").is_not_null())
    return {
        row["variant"]: round(row["kv"]) if row["kv"] is not None else None
        for row in arms.group_by("variant")
        .agg(pl.col("kv_cache_tokens").mean().alias("kv"))
        .iter_rows(named=True)
    }


def _best(decisions: pl.DataFrame, method: str) -> pl.DataFrame:
    """The highest-gain variant of a method per workload and load."""
    rows = decisions.filter(pl.col("method") == method)
    if rows.is_empty():
        return rows
    return (
        rows.sort("estimate", descending=True, nulls_last=True)
        .group_by(list(LOAD_KEYS), maintain_order=True)
        .first()
    )


def choice_table(
    data: CampaignData,
    speedups: pl.DataFrame,
    decisions: pl.DataFrame,
    settings: AnalysisSettings | None = None,
) -> pl.DataFrame:
    settings = settings or AnalysisSettings()
    # n-gram against the draft model within the reference setting (the first plain variant's sampling and
    # layout): a sweep's other settings are not mixed into one choice.
    plains = data.variants().filter(pl.col("method") == "none")["variant"].to_list()
    reference = data.setting_of(plains[0]) if plains else ""
    same = [name for name in decisions["variant"].unique().to_list() if data.setting_of(name) == reference]
    decisions = decisions.filter(pl.col("variant").is_in(same))
    ngram, draft = _best(decisions, "ngram"), _best(decisions, "draft_model")
    if ngram.is_empty() or draft.is_empty():
        return pl.DataFrame(schema=CHOICE_SCHEMA)
    kv = kv_capacity(data)
    plain_kv = next((kv.get(v) for v in plains if data.setting_of(v) == reference), None)
    gains = gain(speedups, settings.gain_metric)
    usage = data.cells.group_by("variant", *LOAD_KEYS).agg(
        pl.col("gauge_kv_cache_usage_max").max().alias("peak"),
        pl.col("gauge_preemptions").sum().alias("preemptions"),
    )

    def usage_of(variant: str, load: dict) -> tuple[float | None, float | None]:
        match = usage.filter(
            pl.col("variant") == variant,
            *[pl.col(k).is_null() if load[k] is None else pl.col(k) == load[k] for k in LOAD_KEYS],
        )
        return (match["peak"][0], match["preemptions"][0]) if match.height else (None, None)

    def per_repeat(variant: str, load: dict) -> dict[int, float]:
        match = gains.filter(
            pl.col("variant") == variant,
            *[pl.col(k).is_null() if load[k] is None else pl.col(k) == load[k] for k in LOAD_KEYS],
        )
        if match.is_empty():
            return {}
        return dict(zip(match["repeats"][0], match["per_repeat"][0], strict=True))

    rows = []
    pairs = ngram.join(draft, on=list(LOAD_KEYS), how="inner", nulls_equal=True, suffix="_d")
    for row in pairs.iter_rows(named=True):
        load = {k: row[k] for k in LOAD_KEYS}
        n_var, d_var = row["variant"], row["variant_d"]
        ratio = paired_ratio(per_repeat(d_var, load), per_repeat(n_var, load), settings)
        drawn = ratio is not None and has_interval(ratio)
        n_peak, n_pre = usage_of(n_var, load)
        d_peak, d_pre = usage_of(d_var, load)
        n_wins, d_wins = bool(row["wins"]), bool(row["wins_d"])
        if not n_wins and not d_wins:
            choice, reason = (
                "plain",
                "neither wins under the decision rule ("
                + (
                    row["reason"]
                    if row["reason"] == row["reason_d"]
                    else f"n-gram: {row['reason']}; draft: {row['reason_d']}"
                )
                + ")",
            )
        elif n_wins and not d_wins:
            choice, reason = "n-gram", f"only n-gram wins (draft model: {row['reason_d']})"
        elif d_wins and not n_wins:
            choice, reason = "draft model", f"only the draft model wins (n-gram: {row['reason']})"
        elif drawn and ratio is not None and ratio.low > 1.0:
            choice = "draft model"
            reason = (
                f"both win; the draft model is faster than n-gram by {ratio.estimate:.3g}x "
                f"[{ratio.low:.3g}, {ratio.high:.3g}]"
            )
        else:
            choice = "n-gram"
            shown = f"{ratio.estimate:.3g}x [{ratio.low:.3g}, {ratio.high:.3g}]" if drawn and ratio else "n/a"
            reason = (
                f"both win and the draft model's edge over n-gram ({shown}) is not significant: n-gram "
                "needs no draft weights and no KV-cache capacity"
            )
        estimates = (row["estimate"], row["estimate_d"])
        indicative = (
            "n/a"
            if None in estimates
            else ("draft model" if estimates[1] > estimates[0] else "n-gram")
            + f" has the higher point estimate ({max(estimates):.3g} vs {min(estimates):.3g})"
        )
        d_kv = kv.get(d_var)
        rows.append(
            {
                **load,
                "ngram_variant": n_var,
                "ngram_speedup": row["estimate"],
                "ngram_low": row["ci_low"],
                "ngram_high": row["ci_high"],
                "ngram_wins": n_wins,
                "draft_variant": d_var,
                "draft_speedup": row["estimate_d"],
                "draft_low": row["ci_low_d"],
                "draft_high": row["ci_high_d"],
                "draft_wins": d_wins,
                "draft_over_ngram": ratio.estimate if ratio else None,
                "draft_over_ngram_low": ratio.low if drawn and ratio else None,
                "draft_over_ngram_high": ratio.high if drawn and ratio else None,
                "n_repeats": ratio.n if ratio else 0,
                "interval": interval_label(ratio) if ratio else "no paired repeats",
                "kv_tokens_plain": plain_kv,
                "kv_tokens_ngram": kv.get(n_var),
                "kv_tokens_draft": d_kv,
                "draft_kv_loss": (1 - d_kv / plain_kv) if d_kv and plain_kv else None,
                "kv_usage_peak_ngram": n_peak,
                "kv_usage_peak_draft": d_peak,
                "preemptions_ngram": n_pre,
                "preemptions_draft": d_pre,
                "choice": choice,
                "reason": reason,
                "indicative": indicative,
            }
        )
    return pl.DataFrame(rows, schema=CHOICE_SCHEMA).sort(
        "workload", "load_mode", "concurrency", "rate", nulls_last=True
    )
