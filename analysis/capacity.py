"""Q5: does a variant raise the sustainable request rate without unacceptable tail latency or KV-cache loss?

From v_capacity (per variant, workload and load, over repeats): a load meets the SLO when every repeat's
p99 TTFT and p99 TPOT are within the campaign's `slo` (campaigns.spec). The sustainable load of a variant
and workload is the highest offered load such that it and every lower measured load meet the SLO (a load
above a violation does not count: the curve must hold all the way up). Open-loop rate sweeps (`load.rates`)
give the sustainable request rate; closed-loop cells give only the highest concurrency meeting the SLO,
which is what Q5 can say when a campaign has no rate sweep.

Each speculative variant is compared with plain: gain = its sustainable load / plain's, its p99 latency at
plain's sustainable load, its KV-cache capacity against plain's (deployments.kv_cache_tokens), and the peak
KV-cache usage and preemptions at its sustainable load.
"""

from __future__ import annotations

import polars as pl

from analysis.choice import kv_capacity
from analysis.data import CampaignData
from analysis.stats import percent

CAPACITY_SCHEMA = {
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int32,
    "workload": pl.String,
    "load_mode": pl.String,
    "loads": pl.List(pl.Float64),
    "slo_met": pl.List(pl.Boolean),
    "goodput_rps": pl.List(pl.Float64),
    "sustainable_load": pl.Float64,
    "first_violation_load": pl.Float64,
    "goodput_rps_at_sustainable": pl.Float64,
    "achieved_rps_at_sustainable": pl.Float64,
    "ttft_p99_s_at_sustainable": pl.Float64,
    "tpot_p99_s_at_sustainable": pl.Float64,
    "slo_ttft_p99_s": pl.Float64,
    "slo_tpot_p99_s": pl.Float64,
    "plain_sustainable_load": pl.Float64,
    "gain_vs_plain": pl.Float64,
    "ttft_p99_s_at_plain_sustainable": pl.Float64,
    "tpot_p99_s_at_plain_sustainable": pl.Float64,
    "kv_cache_tokens": pl.Int64,
    "kv_loss_vs_plain": pl.Float64,
    "kv_usage_peak_at_sustainable": pl.Float64,
    "preemptions_at_sustainable": pl.Float64,
    "verdict": pl.String,
}


def has_rate_sweep(data: CampaignData) -> bool:
    return not data.capacity.filter(pl.col("load_mode") == "open").is_empty()


def _load_column(mode: str) -> str:
    return "offered_rate_rps" if mode == "open" else "concurrency"


def _curve(rows: pl.DataFrame, mode: str) -> dict:
    """Sustainable load of one variant x workload x mode (rows of v_capacity)."""
    column = _load_column(mode)
    rows = rows.filter(pl.col(column).is_not_null()).sort(column)
    loads = [float(x) for x in rows[column].to_list()]
    met = [m is True for m in rows["slo_met"].to_list()]
    sustainable_index = None
    for i, ok in enumerate(met):
        if not ok:
            break
        sustainable_index = i
    first_violation = next((loads[i] for i, ok in enumerate(met) if not ok), None)
    at = rows.row(sustainable_index, named=True) if sustainable_index is not None else None
    return {
        "loads": loads,
        "slo_met": met,
        "goodput_rps": rows["goodput_rps"].to_list(),
        "sustainable_load": loads[sustainable_index] if sustainable_index is not None else None,
        "first_violation_load": first_violation,
        "goodput_rps_at_sustainable": at["goodput_rps"] if at else None,
        "achieved_rps_at_sustainable": at["achieved_rps"] if at else None,
        "ttft_p99_s_at_sustainable": at["ttft_p99_s_worst"] if at else None,
        "tpot_p99_s_at_sustainable": at["tpot_p99_s_worst"] if at else None,
        "slo_ttft_p99_s": rows["slo_ttft_p99_s"][0] if rows.height else None,
        "slo_tpot_p99_s": rows["slo_tpot_p99_s"][0] if rows.height else None,
        "_rows": rows,
    }


def _describe_load(mode: str, value: float | None) -> str:
    if value is None:
        return "none"
    return f"{value:g} req/s" if mode == "open" else f"concurrency {value:g}"


def capacity_table(data: CampaignData) -> pl.DataFrame:
    """Per variant, workload and load mode (open loop first): the sustainable load and its comparison with
    plain. Closed-loop rows are there too: they are all Q5 has when the spec has no `load.rates`."""
    if data.capacity.is_empty():
        return pl.DataFrame(schema=CAPACITY_SCHEMA)
    kv = kv_capacity(data)
    variants = data.variants()
    # Each variant is compared with the plain variant of its own sampling and layout (a sweep has several).
    plain_of_setting = {
        data.setting_of(name): name for name in variants.filter(pl.col("method") == "none")["variant"]
    }
    gauges = data.cells.group_by("variant", "workload", "load_mode", "concurrency", "rate").agg(
        pl.col("gauge_kv_cache_usage_max").max().alias("peak"),
        pl.col("gauge_preemptions").sum().alias("preemptions"),
    )
    rows = []
    for (workload, mode), scope in data.capacity.group_by(["workload", "load_mode"], maintain_order=True):
        curves = {
            (variant, method, k): _curve(group, mode)
            for (variant, method, k), group in scope.group_by(["variant", "method", "k"], maintain_order=True)
        }
        for (variant, method, k), curve in curves.items():
            plain_name = plain_of_setting.get(data.setting_of(variant))
            plain = next((c for (v, _, _), c in curves.items() if v == plain_name), None)
            plain_load = plain["sustainable_load"] if plain else None
            plain_kv = kv.get(plain_name) if plain_name else None
            curve_rows = curve.pop("_rows")
            column = _load_column(mode)
            at_plain = (
                curve_rows.filter(pl.col(column) == plain_load)
                if plain_load is not None
                else curve_rows.head(0)
            )
            sustainable = curve["sustainable_load"]
            gauge_key = pl.col("rate") if mode == "open" else pl.col("concurrency")
            gauge = gauges.filter(
                pl.col("variant") == variant,
                pl.col("workload") == workload,
                pl.col("load_mode") == mode,
                gauge_key == sustainable if sustainable is not None else pl.lit(False),
            )
            peak = gauge["peak"][0] if gauge.height else None
            preemptions = gauge["preemptions"][0] if gauge.height else None
            variant_kv = kv.get(variant)
            kv_loss = (1 - variant_kv / plain_kv) if variant_kv and plain_kv else None
            gain_vs_plain = sustainable / plain_load if sustainable is not None and plain_load else None
            what = "sustainable rate" if mode == "open" else "highest concurrency meeting the SLO"
            if method == "none":
                verdict = f"baseline: {what} {_describe_load(mode, sustainable)}"
            elif sustainable is None:
                verdict = f"meets the SLO at no measured load (plain: {_describe_load(mode, plain_load)})"
            elif plain_load is None:
                verdict = (
                    f"raises the {what} to {_describe_load(mode, sustainable)}: plain meets the SLO nowhere"
                )
            elif sustainable > plain_load:
                verdict = (
                    f"raises the {what} from {_describe_load(mode, plain_load)} to "
                    f"{_describe_load(mode, sustainable)} ({gain_vs_plain:.2g}x)"
                )
            elif sustainable == plain_load:
                verdict = f"same {what} as plain ({_describe_load(mode, sustainable)})"
            else:
                verdict = (
                    f"lowers the {what} from {_describe_load(mode, plain_load)} to "
                    f"{_describe_load(mode, sustainable)}"
                )
            if method != "none" and sustainable is not None:
                troubles = []
                if preemptions:
                    troubles.append(f"{preemptions:g} preemptions at that load (KV cache exhausted)")
                if kv_loss is not None and kv_loss > 0:
                    troubles.append(f"KV-cache capacity {kv_loss:.0%} below plain's")
                verdict += "; " + ("; ".join(troubles) if troubles else "no preemptions, no KV-cache loss")
            rows.append(
                {
                    "variant": variant,
                    "method": method,
                    "k": k,
                    "workload": workload,
                    "load_mode": mode,
                    **curve,
                    "plain_sustainable_load": plain_load,
                    "gain_vs_plain": gain_vs_plain,
                    "ttft_p99_s_at_plain_sustainable": at_plain["ttft_p99_s_worst"][0]
                    if at_plain.height
                    else None,
                    "tpot_p99_s_at_plain_sustainable": at_plain["tpot_p99_s_worst"][0]
                    if at_plain.height
                    else None,
                    "kv_cache_tokens": variant_kv,
                    "kv_loss_vs_plain": kv_loss,
                    "kv_usage_peak_at_sustainable": peak,
                    "preemptions_at_sustainable": preemptions,
                    "verdict": verdict,
                }
            )
    return pl.DataFrame(rows, schema=CAPACITY_SCHEMA).sort(
        pl.col("load_mode") != "open",
        "workload",
        pl.col("method") != "none",
        "method",
        "k",
        "variant",
        nulls_last=True,
    )


def q5_statement(data: CampaignData, table: pl.DataFrame) -> str:
    """What Q5 can say about this campaign, in one paragraph."""
    if has_rate_sweep(data):
        return (
            "Sustainable request rate from the open-loop rate sweep: the highest offered rate at which it and "
            "every lower rate meet the p99 TTFT and TPOT SLOs in every repeat."
        )
    return (
        "Q5 needs an open-loop rate sweep: this campaign's spec has no `load.rates`, so there is no sustainable "
        "request rate to report. Add e.g. `load: {rates: [0.5, 1, 2, 4]}` to the spec. What closed-loop data "
        "allows is below: the highest concurrency at which every repeat meets the p99 SLOs, with the goodput "
        "and achieved request rate there."
    )


# -- capacity searches (tasks/capacity.py): the capacity under the limits, with the confidence of each point ---
SEARCH_SCHEMA = {
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int32,
    "workload": pl.String,
    "repeats": pl.Int32,
    "capacity_rps": pl.Float64,  # mean over repeats
    "capacity_low_rps": pl.Float64,  # the lowest repeat's capacity
    "capacity_high_rps": pl.Float64,  # the highest repeat's first failing rate (null: never failed)
    "plain_variant": pl.String,
    "ratio_vs_plain": pl.Float64,
    "ratio_low": pl.Float64,
    "ratio_high": pl.Float64,
    "points": pl.Int32,
    "converged": pl.Boolean,
    "confidence": pl.String,
    "verdict": pl.String,
}


def search_table(data: CampaignData) -> pl.DataFrame:
    """Per searched variant and workload, over repeats: the capacity (each repeat's highest rate that met the
    p99 limits with its stated confidence), the range the true capacity lies in (from the lowest repeat's
    capacity to the highest repeat's first failing rate), and its ratio to plain's (same sampling and layout)
    with the interval those ranges give: [low / plain's high, high / plain's low]."""
    if data.searches.is_empty():
        return pl.DataFrame(schema=SEARCH_SCHEMA)
    per = (
        data.searches.group_by("variant", "method", "k", "workload", maintain_order=True)
        .agg(
            pl.len().alias("repeats"),
            pl.col("capacity_rps").mean().alias("capacity_rps"),
            pl.col("capacity_rps").min().alias("capacity_low_rps"),
            pl.when(pl.col("first_failing_rps").is_null().any())
            .then(None)
            .otherwise(pl.col("first_failing_rps").max())
            .alias("capacity_high_rps"),
            pl.col("capacity_rps").is_null().any().alias("some_none"),
            pl.col("n_points").sum().alias("points"),
            pl.col("converged").all().alias("converged"),
            pl.col("quantile").first(),
            pl.col("confidence").first(),
            pl.col("requests_per_point").min().alias("requests"),
        )
        .to_dicts()
    )
    plains = {(data.setting_of(r["variant"]), r["workload"]): r for r in per if r["method"] == "none"}
    rows = []
    for r in per:
        plain = plains.get((data.setting_of(r["variant"]), r["workload"]))
        ratio = low = high = None
        if plain is not None and r["method"] != "none" and plain["capacity_rps"] and r["capacity_rps"]:
            ratio = r["capacity_rps"] / plain["capacity_rps"]
            if plain["capacity_high_rps"] and r["capacity_low_rps"]:
                low = r["capacity_low_rps"] / plain["capacity_high_rps"]
            if r["capacity_high_rps"] and plain["capacity_low_rps"]:
                high = r["capacity_high_rps"] / plain["capacity_low_rps"]
        confidence = (
            f"p{r['quantile'] * 100:g} within the limits at {percent(r['confidence'])} confidence per point "
            f"({r['requests']} requests a point)"
        )
        if r["capacity_rps"] is None or r["some_none"]:
            verdict = "met the limits at no measured rate (in some repeat)"
        elif r["method"] == "none":
            verdict = f"baseline: {r['capacity_rps']:.3g} req/s"
        elif ratio is None:
            verdict = "no plain capacity to compare with"
        elif min(r["repeats"], plain["repeats"]) < 2:
            # the range is the searches' brackets: it says nothing of how a second launch would differ
            verdict = (
                f"{ratio:.2f}x plain's capacity (n={min(r['repeats'], plain['repeats'])} repeat: the search "
                "brackets only, no launch-to-launch spread: no verdict)"
            )
        elif low is not None and low > 1:
            verdict = f"raises capacity {ratio:.2f}x (interval above 1)"
        elif high is not None and high < 1:
            verdict = f"lowers capacity to {ratio:.2f}x plain's (interval below 1)"
        else:
            verdict = f"{ratio:.2f}x plain's capacity, not separated from it"
        if not r["converged"]:
            verdict += "; a search did not close its bracket (see stopped_because)"
        rows.append(
            {
                **{k: r[k] for k in ("variant", "method", "k", "workload", "repeats", "points", "converged")},
                "capacity_rps": r["capacity_rps"],
                "capacity_low_rps": r["capacity_low_rps"],
                "capacity_high_rps": r["capacity_high_rps"],
                "plain_variant": plain["variant"] if plain else None,
                "ratio_vs_plain": ratio,
                "ratio_low": low,
                "ratio_high": high,
                "confidence": confidence,
                "verdict": verdict,
            }
        )
    return pl.DataFrame(rows, schema=SEARCH_SCHEMA).sort(
        "workload", pl.col("method") != "none", "method", "k", "variant", nulls_last=True
    )
