"""Adaptation confirmation: does a swapped-in head pay, and on which strata? (docs/adaptation.md)

Input: one row per cell of a confirmation (tasks.adapt): which head served (`old` | `new`), the repeat, the
stratum, the load and the cell's figures. All cells come from ONE deployment; a repeat is one pass over every
(head, stratum) block in a seeded random order, so drift over time falls on both heads alike. Each metric is
paired by repeat: per repeat the ratio new / old on the same stratum and load (TPOT: old / new, so > 1
always means the new head is better), then the geometric mean of the ratios with the Student t interval of
their logs (analysis.stats.ratio_interval), exactly as a speedup against plain is taken (docs/analysis.md).

Mean acceptance length is the exception when the requests carry vLLM's per-request acceptance (request rows:
prompt_id, spec_steps, spec_accepted_tokens): under greedy decoding every repeat accepts the same, so the
per-repeat ratios are all equal and their t interval is degenerate ("no interval"). The spread that matters is
between prompts: the ratio new / old of the two heads' MAL (1 + sum accepted / sum steps) over the prompts both
served, all repeats pooled, with a paired bootstrap over those prompts (analysis.stats.
paired_cluster_ratio_interval). Without request rows for both heads it falls back to the per-repeat t.

The benefit rule mirrors analysis.decision: the new head is adopted for a stratum and load only when
  1. the interval of its gain (default the output-throughput ratio new / old) lies above 1 + min_effect
     (10% by default; one repeat gives no interval, hence no adoption);
  2. no other stratum regresses at that load: every other stratum's gain ESTIMATE is at least 1 - max_harm
     (5%): the head replaces the old one on the whole deployment, so a gain on one stratum that costs
     another more than that is not one;
  3. every cell the new head served succeeded (at least min_success_rate of its requests, pooled);
  4. the greedy-correctness gate taken with the new head serving passed (no verdict: no adoption).
The strata that pass are the ones that should get the adapted head.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import polars as pl

from analysis.decision import gain_shortfall, success_shortfall
from analysis.stats import (
    has_interval,
    interval_label,
    paired_cluster_ratio_interval,
    ratio_interval,
)
from experiments.adaptation import Rule

HEADS = ("old", "new")
METRICS: dict[str, tuple[str, bool]] = {
    # metric -> (cell column, higher is better)
    "mean_acceptance_length": ("mean_acceptance_length", True),
    "throughput": ("output_throughput_tok_s", True),
    "tpot_p50": ("tpot_p50_s", False),
}
CELL_SCHEMA: dict[str, Any] = {
    "cell_id": pl.String,
    "head": pl.String,
    "repeat": pl.Int64,
    "stratum": pl.String,
    "load_label": pl.String,
    "status": pl.String,
    "requests_ok": pl.Int64,
    "requests_total": pl.Int64,
    "mean_acceptance_length": pl.Float64,
    "output_throughput_tok_s": pl.Float64,
    "tpot_p50_s": pl.Float64,
    "drafter_sha256": pl.String,
}
# one row per measured, successful request with vLLM's per-request acceptance (tasks.adaptation.verdict.cell_rows)
REQUEST_ROW_SCHEMA: dict[str, Any] = {
    "cell_id": pl.String,
    "head": pl.String,
    "repeat": pl.Int64,
    "stratum": pl.String,
    "load_label": pl.String,
    "prompt_id": pl.String,
    "spec_steps": pl.Int64,
    "spec_accepted_tokens": pl.Int64,
}
ACCEPTANCE = "mean_acceptance_length"


def cells_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """The confirmation's cells as the frame the functions below read (missing columns are null)."""
    return pl.DataFrame([{k: r.get(k) for k in CELL_SCHEMA} for r in rows], schema=CELL_SCHEMA, orient="row")


def requests_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """The confirmation's request rows (REQUEST_ROW_SCHEMA; missing columns are null)."""
    return pl.DataFrame(
        [{k: r.get(k) for k in REQUEST_ROW_SCHEMA} for r in rows], schema=REQUEST_ROW_SCHEMA, orient="row"
    )


def _ok(cells: pl.DataFrame) -> pl.DataFrame:
    return cells.filter(pl.col("status") == "ok")


def _usable_requests(
    requests: pl.DataFrame | Sequence[dict[str, Any]] | None, ok: pl.DataFrame
) -> pl.DataFrame | None:
    """The request rows that can enter the paired acceptance ratio: of an ok cell, with steps > 0 and a count
    of accepted tokens. None without any."""
    if requests is None:
        return None
    frame = requests if isinstance(requests, pl.DataFrame) else requests_frame(requests)
    if frame.is_empty():
        return None
    frame = frame.filter(
        pl.col("cell_id").is_in(ok["cell_id"].drop_nulls().to_list())
        & (pl.col("spec_steps") > 0)
        & pl.col("spec_accepted_tokens").is_not_null()
        & pl.col("prompt_id").is_not_null()
    )
    return None if frame.is_empty() else frame


def _paired_acceptance(here: pl.DataFrame, confidence: float) -> dict[str, Any] | None:
    """The MAL comparison from one stratum and load's request rows: new / old over the prompts both heads
    served (every repeat pooled), with the paired bootstrap over those prompts. None (fall back to the
    per-repeat t) unless both heads have request rows on a shared prompt."""
    sides = {head: here.filter(pl.col("head") == head) for head in HEADS}
    if any(side.is_empty() for side in sides.values()):
        return None
    new, old = sides["new"], sides["old"]
    shared = set(new["prompt_id"].to_list()) & set(old["prompt_id"].to_list())
    if not shared:
        return None
    interval = paired_cluster_ratio_interval(
        new["spec_accepted_tokens"].cast(pl.Float64).to_list(),
        new["spec_steps"].cast(pl.Float64).to_list(),
        new["prompt_id"].to_list(),
        old["spec_accepted_tokens"].cast(pl.Float64).to_list(),
        old["spec_steps"].cast(pl.Float64).to_list(),
        old["prompt_id"].to_list(),
        offset=1.0,
        confidence=confidence,
    )
    if not math.isfinite(interval.estimate):
        return None

    def pooled(side: pl.DataFrame) -> float:
        mine = side.filter(pl.col("prompt_id").is_in(list(shared)))
        return 1.0 + float(mine["spec_accepted_tokens"].sum()) / float(mine["spec_steps"].sum())

    bounded = has_interval(interval)
    # the label names the prompts: "n=24, bootstrap over 24 prompts paired new/old, ..."
    return {
        "estimate": interval.estimate,
        "ci_low": interval.low if bounded else None,
        "ci_high": interval.high if bounded else None,
        "interval": interval_label(interval),
        "old_mean": pooled(old),
        "new_mean": pooled(new),
    }


def compare_heads(
    cells: pl.DataFrame,
    requests: pl.DataFrame | Sequence[dict[str, Any]] | None = None,
    *,
    confidence: float = 0.95,
) -> list[dict[str, Any]]:
    """New head against old per stratum, load and metric, paired by repeat (ok cells of both heads in that
    repeat; a repeat where either side failed or lacks the figure is left out and `repeats` shows which
    remained). Estimate: geometric mean of the per-repeat ratios; interval: t on their logs.

    Mean acceptance length, when `requests` (REQUEST_ROW_SCHEMA rows or frame; those of ok cells count) hold
    per-request acceptance for both heads at that stratum and load: estimate, interval and the two means are
    the requests' pooled MAL over the prompts both heads served (all repeats), with the paired bootstrap over
    those prompts (module docstring); `ratios`, `repeats` and `n_repeats` stay the cells' per-repeat figures,
    and the interval label names the prompts."""
    ok = _ok(cells)
    usable = _usable_requests(requests, ok)
    out: list[dict[str, Any]] = []
    keys = ok.select("stratum", "load_label").unique().sort("stratum", "load_label")
    for stratum, load in keys.iter_rows():
        here = ok.filter((pl.col("stratum") == stratum) & (pl.col("load_label") == load))
        for metric, (column, higher_better) in METRICS.items():
            sides = {
                head: {
                    r["repeat"]: r[column]
                    for r in here.filter(pl.col("head") == head).iter_rows(named=True)
                    if r[column] is not None and math.isfinite(r[column]) and r[column] > 0
                }
                for head in HEADS
            }
            repeats = sorted(set(sides["old"]) & set(sides["new"]))
            ratios = [
                sides["new"][r] / sides["old"][r] if higher_better else sides["old"][r] / sides["new"][r]
                for r in repeats
            ]
            row: dict[str, Any] = {
                "stratum": stratum,
                "load_label": load,
                "metric": metric,
                "ratios": ratios,
                "repeats": repeats,
                "n_repeats": len(ratios),
                "old_mean": _mean([sides["old"][r] for r in repeats]),
                "new_mean": _mean([sides["new"][r] for r in repeats]),
            }
            if ratios:
                interval = ratio_interval(ratios, confidence=confidence)
                bounded = has_interval(interval)
                row.update(
                    estimate=interval.estimate,
                    ci_low=interval.low if bounded else None,
                    ci_high=interval.high if bounded else None,
                    interval=interval_label(interval),
                )
            else:
                row.update(estimate=None, ci_low=None, ci_high=None, interval="no paired repeats")
            if metric == ACCEPTANCE and usable is not None:
                paired = _paired_acceptance(
                    usable.filter((pl.col("stratum") == stratum) & (pl.col("load_label") == load)), confidence
                )
                if paired is not None:
                    row.update(paired)
            out.append(row)
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def new_head_success(cells: pl.DataFrame) -> dict[tuple[str, str], float | None]:
    """(stratum, load) -> the new head's pooled success rate over its cells (a failed cell counts with the
    requests it made; a cell that made none counts as 0 of 1, so it cannot vanish)."""
    new = cells.filter(pl.col("head") == "new")
    out: dict[tuple[str, str], float | None] = {}
    for (stratum, load), group in new.group_by(["stratum", "load_label"], maintain_order=True):
        ok = total = 0
        for r in group.iter_rows(named=True):
            made = r["requests_total"] or 0
            ok += (r["requests_ok"] or 0) if r["status"] == "ok" else 0
            total += made if made else 1
        out[(str(stratum), str(load))] = ok / total if total else None
    return out


def judge(
    comparisons: Sequence[dict[str, Any]],
    success: dict[tuple[str, str], float | None],
    *,
    target_stratum: str,
    gate_passed: bool | None,
    rule: Rule = Rule(),
) -> list[dict[str, Any]]:
    """The benefit rule on every stratum and load (module docstring). One row per stratum and load."""
    gains = {(c["stratum"], c["load_label"]): c for c in comparisons if c["metric"] == rule.gain_metric}
    threshold, floor = 1.0 + rule.min_effect, 1.0 - rule.max_harm
    strata = sorted({s for s, _ in gains} | {s for s, _ in success})
    loads = sorted({lo for _, lo in gains} | {lo for _, lo in success})
    rows = []
    for load in loads:
        for stratum in strata:
            if (stratum, load) not in gains and (stratum, load) not in success:
                continue
            g = gains.get((stratum, load), {})
            estimate, low, high = g.get("estimate"), g.get("ci_low"), g.get("ci_high")
            others = [
                (s, gains[(s, load)]["estimate"])
                for s in strata
                if s != stratum and (s, load) in gains and gains[(s, load)].get("estimate") is not None
            ]
            worst = min(others, key=lambda pair: pair[1]) if others else None
            harm_ok = worst is None or worst[1] >= floor
            rate = success.get((stratum, load))
            success_ok = rate is not None and rate >= rule.min_success_rate
            shortfall = gain_shortfall(estimate, low, high, g.get("interval"), threshold, "no paired repeats")
            reasons = [shortfall] if shortfall else []
            if not harm_ok:
                assert worst is not None
                reasons.append(f"{worst[0]} is worse with the new head ({worst[1]:.3g} < {floor:.2f})")
            if not success_ok:
                reasons.append(f"new head's {success_shortfall(rate, rule.min_success_rate)}")
            if gate_passed is None:
                reasons.append("no correctness verdict after the swap")
            elif not gate_passed:
                reasons.append("correctness gate after the swap failed")
            adopt = not reasons
            rows.append(
                {
                    "stratum": stratum,
                    "load_label": load,
                    "target": stratum == target_stratum,
                    "gain_metric": rule.gain_metric,
                    "estimate": estimate,
                    "ci_low": low,
                    "ci_high": high,
                    "n_repeats": int(g.get("n_repeats") or 0),
                    "harm_ok": harm_ok,
                    "worst_other": None if worst is None else f"{worst[0]} {worst[1]:.3g}",
                    "success_ok": success_ok,
                    "gate_passed": gate_passed,
                    "adopt": adopt,
                    "reason": (
                        f"adopt: {rule.gain_metric} ratio {estimate:.3g} [{low:.3g}, {high:.3g}] above "
                        f"{threshold:.2f}, no other stratum below {floor:.2f}, gate passed"
                        if adopt
                        else "; ".join(reasons)
                    ),
                }
            )
    return rows


def adopt_strata(verdicts: Sequence[dict[str, Any]]) -> list[str]:
    """The strata that should get the adapted head: adopted at every load measured for them."""
    by_stratum: dict[str, list[bool]] = {}
    for v in verdicts:
        by_stratum.setdefault(v["stratum"], []).append(bool(v["adopt"]))
    return sorted(s for s, flags in by_stratum.items() if flags and all(flags))


def summary_text(
    verdicts: Sequence[dict[str, Any]],
    comparisons: Sequence[dict[str, Any]],
    *,
    target_stratum: str,
    rule: Rule = Rule(),
) -> str:
    """One paragraph: which strata get the head, and the target stratum's acceptance and gain figures."""
    chosen = adopt_strata(verdicts)
    head = (
        f"adopt the adapted head for {', '.join(chosen)}"
        if chosen
        else "keep the old head: no stratum meets the benefit rule"
    )
    parts = [head]
    for c in comparisons:
        if c["stratum"] != target_stratum or c["metric"] not in ("mean_acceptance_length", rule.gain_metric):
            continue
        parts.append(f"{c['metric']} new/old on {target_stratum} at {c['load_label']}: {_ratio_text(c)}")
    for v in verdicts:
        if not v["adopt"]:
            parts.append(f"{v['stratum']} at {v['load_label']} keeps the old head ({v['reason']})")
    return "; ".join(parts)


def _ratio_text(c: dict[str, Any]) -> str:
    if c.get("estimate") is None:
        return "no paired repeats"
    if c.get("ci_low") is None:
        return f"{c['estimate']:.3g} ({c['interval']})"
    return f"{c['estimate']:.3g} [{c['ci_low']:.3g}, {c['ci_high']:.3g}] ({c['interval']})"


def confirm(
    cells: pl.DataFrame,
    *,
    target_stratum: str,
    gate_passed: bool | None,
    rule: Rule = Rule(),
    requests: pl.DataFrame | Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Everything the confirmation's document needs from its cells (and, for acceptance, its requests:
    compare_heads): comparisons, verdicts, the strata that should get the head and the summary."""
    comparisons = compare_heads(cells, requests, confidence=rule.confidence)
    verdicts = judge(
        comparisons,
        new_head_success(cells),
        target_stratum=target_stratum,
        gate_passed=gate_passed,
        rule=rule,
    )
    return {
        "comparisons": comparisons,
        "verdicts": verdicts,
        "adopt_strata": adopt_strata(verdicts),
        "summary": summary_text(verdicts, comparisons, target_stratum=target_stratum, rule=rule),
    }


# --- the report ------------------------------------------------------------------------------------------------


def adaptation_view(con: Any, campaign_id: str, adaptation_id: str | None = None) -> pl.DataFrame:
    """v_adaptation rows of one confirmation (default: the campaign's latest), ordered by load and stratum."""
    sql = "SELECT * FROM v_adaptation WHERE campaign_id = ?"
    params: list[Any] = [campaign_id]
    if adaptation_id is not None:
        sql += " AND adaptation_id = ?"
        params.append(adaptation_id)
    frame = con.sql(sql + " ORDER BY ended_utc DESC, adaptation_id, load_label, stratum", params=params).pl()
    if frame.is_empty() or adaptation_id is not None:
        return frame
    latest = frame["adaptation_id"][0]
    return frame.filter(pl.col("adaptation_id") == latest)


def write_adaptation_report(
    campaign_id: str,
    *,
    adaptation_id: str | None = None,
    db: Any = None,
    reports_dir: Any = None,
) -> Any:
    """The confirmation's page, SPECGAUGE_HOME/reports/<campaign_id>/index.html (self-contained like every
    report: the chart's spec and data inline, no request leaves the page), beside the chart as HTML and PNG.
    Returns the page's path."""
    from pathlib import Path

    from analysis import charts as ch
    from analysis.report import building, chart_block, render_page, vega_bundle, write_page
    from analysis.report_sections import adaptation_section
    from specgauge.settings import get_settings
    from warehouse.db import reader

    with reader(db) as con:
        view = adaptation_view(con, campaign_id, adaptation_id)
    if view.is_empty():
        raise ValueError(f"no adaptation confirmation of campaign {campaign_id!r} in the warehouse")
    first = view.row(0, named=True)
    folder = Path(reports_dir or get_settings().reports_dir) / campaign_id
    with building(folder) as build:
        chart = ch.adaptation_chart(view, first["min_effect"], first["max_harm"])
        chart_html = ""
        if chart is not None:
            saved = ch.save_chart(chart, build, "adaptation", "Adapted head against the old one")
            chart_html = chart_block(saved, chart.to_dict())
        title = f"specgauge adaptation: {campaign_id}"
        intro = (
            f'<p class="note">Adaptation confirmation <b>{first["adaptation_id"]}</b>: {first["variant"]}, '
            f"the old head against a new one on one hot-swap deployment. This page makes no network request.</p>"
        )
        page = render_page(title, intro, [adaptation_section(view, chart_html)], vega_bundle())
        write_page(build, page)
    return folder / "index.html"
