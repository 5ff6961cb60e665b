"""The report's sections: one function per question, each a `Section` (a heading and its HTML), which
analysis.report renders into the page through its template. `campaign_sections` lists a campaign's in reading
order; `adaptation_section` is an adaptation confirmation's page.
"""

from __future__ import annotations

import html
import json
from typing import Any

import polars as pl

from analysis.capacity import has_rate_sweep, q5_statement
from analysis.charts import ChartFiles
from analysis.data import AnalysisSettings, CampaignData
from analysis.decision import decision_rule, rule_text
from analysis.drafter_depth import drafter_depth_section, has_drafter_depths
from analysis.report import (
    Column,
    Section,
    chart_block,
    col,
    fmt_bool,
    fmt_interval,
    fmt_ms,
    fmt_num,
    fmt_pct,
    html_table,
)
from analysis.results import Results
from analysis.sampling_report import section_rows
from analysis.stats import percent

# name -> (its files, its Vega-Lite spec): the charts drawn for the page
EmbeddedCharts = dict[str, tuple[ChartFiles, dict[str, Any]]]


def chart_or_note(charts: EmbeddedCharts, name: str, missing: str) -> str:
    """The chart embedded in the page, or a note saying what the campaign lacks for it."""
    if name in charts:
        return chart_block(*charts[name])
    return f'<p class="empty">{html.escape(missing)}</p>'


def _load_cols() -> list[Column]:
    return [col("variant"), col("workload"), col("load_label", "load")]


def _interval_col(header: str) -> Column:
    return Column(
        header,
        lambda r: fmt_interval(r.get("estimate"), r.get("ci_low"), r.get("ci_high"), r.get("interval")),
    )


def search_html(searches: pl.DataFrame) -> str:
    """The capacity searches (tasks/capacity.py), when the spec had `capacity`."""
    if searches.is_empty():
        return ""
    return (
        "<h3>Capacity search</h3>"
        '<p class="note">Each deployment\'s highest open-loop rate at which the p99 TTFT and TPOT limits were met, '
        "judged per point by an order-statistic confidence bound (a ramp, then a bisection on the rate). The range "
        "runs from the lowest repeat's capacity to the highest repeat's first failing rate; the ratio's interval is "
        "the speculative range over plain's (same sampling and layout). The points are the open-loop cells of "
        "the curves above.</p>"
        + html_table(
            searches,
            [
                col("variant"),
                col("workload"),
                col("repeats"),
                col("capacity_rps", "capacity req/s", fmt_num()),
                Column(
                    "range req/s",
                    lambda r: fmt_interval(
                        r["capacity_rps"], r["capacity_low_rps"], r["capacity_high_rps"], "–"
                    ),
                ),
                Column(
                    "x plain",
                    lambda r: fmt_interval(
                        r["ratio_vs_plain"], r["ratio_low"], r["ratio_high"], "no interval"
                    ),
                ),
                col("points"),
                col("confidence"),
                col("verdict"),
            ],
            empty="no searches",
        )
    )


def verification_section(verdicts: list) -> Section:
    """A verification campaign's answer (analysis.recommend.verification): per load, whether the recommended
    schedule beats both plain and the best fixed depth, with intervals."""
    intro = (
        '<p class="note">This campaign launched a recommended depth schedule (variant <code>recommended</code>) '
        "beside plain and the best fixed depth, the same way. Per load: its throughput speedup over plain and its "
        "edge over the fixed depth (geometric means of per-repeat ratios, t intervals over repeats); it beats both "
        "where both intervals lie above 1.</p>"
    )
    items = "".join(f"<li>{html.escape(v.text())}</li>" for v in verdicts)
    return Section("verification", "Does the recommended schedule pay?", intro + f"<ul>{items}</ul>")


def decision_section(decision: pl.DataFrame) -> Section:
    """The decision this verification campaign holds (v_decision: analysis.verification): per batch-size range what to
    run, what the sweep measured, what the launch of the schedule measured, and the verdict, first in the
    report because it is the answer."""
    first = decision.row(0, named=True)
    config = first["speculative_config"]
    intro = (
        f"<p><b>{html.escape(first['outcome'].upper())}</b>: {html.escape(first['summary'])}</p>"
        '<p class="note">The sweep (campaign '
        f"<code>{html.escape(first['source_campaign_id'])}</code>) recommended a depth per batch-size range "
        "for one method (one deployment serves one method); this campaign launched that schedule beside plain "
        f"and the best fixed depth (k={first['fixed_k']}) the same way. Per load the schedule claims to beat "
        "plain by the benefit rule's minimum effect where it drafts and to be no worse than plain (within "
        f"{first['tolerance']:.0%}) where it is off. Verdicts read the interval of the throughput ratio over "
        "launches: confirmed when its low bound clears 1 + the minimum effect (off: 1 - the tolerance); "
        '"faster, below the minimum effect" when it clears 1 only; refuted when it lies wholly below 1 (off: '
        "below 1 - the tolerance); inconclusive otherwise, and always without an interval. An invalid "
        "verification campaign makes every load inconclusive.</p>"
    )
    validity = first.get("validity")
    intro += (
        f"<p>Validity of this verification campaign: <b>{html.escape(validity or 'not judged')}</b>"
        + (f" ({html.escape(first['validity_reasons'])})" if first.get("validity_reasons") else "")
        + "</p>"
    )
    if config:
        intro += (
            f"<p>Config to deploy (<code>--speculative-config</code>): <code>{html.escape(config)}</code></p>"
        )
    if first["approved"] is not None:
        intro += (
            f"<p>Sign-off: {'approved' if first['approved'] else 'refused'} by {html.escape(first['approver'])} "
            f"({first['promoted_utc']}).</p>"
        )
    table = html_table(
        decision,
        [
            Column("batch sizes", lambda r: f"{r['batch_from']}-{r['batch_to']} (C={r['concurrency']})"),
            Column("run", lambda r: f"k={r['k']}" if r["k"] else "off"),
            col("claim"),
            col("sweep_speedup", "sweep speedup"),
            Column(
                "launched: over plain",
                lambda r: fmt_interval(
                    r["over_plain"], r["over_plain_low"], r["over_plain_high"], r["over_plain_interval"]
                ),
            ),
            col("n_repeats", "n"),
            Column(
                "over fixed depth",
                lambda r: fmt_interval(r["over_fixed"], r["over_fixed_low"], r["over_fixed_high"], None),
            ),
            col("load_outcome", "verdict", str),
            col("reason", fmt=str),
        ],
        row_class=lambda r: "win" if r["load_outcome"] == "confirmed" else "",
        empty="no load measured",
    )
    caveats = json.loads(first["caveats"]) if first["caveats"] else []
    notes = "".join(f"<li>{html.escape(c)}</li>" for c in caveats)
    body = intro + table + (f"<ul>{notes}</ul>" if notes else "") + options_html(first)
    return Section("decision", "The decision", body)


def options_html(first: dict) -> str:
    """The whole deployment options of a decision (v_decision.options, analysis.options), weighed by traffic,
    and the choice; nothing for decisions written before them."""
    options = json.loads(first.get("options") or "[]")
    if not options:
        return ""
    frame = pl.DataFrame(
        [{key: o.get(key) for key in DEPLOYMENT_OPTION_COLUMNS} for o in options],
        schema=DEPLOYMENT_OPTION_COLUMNS,
    )
    worst = Column(
        "worst load",
        lambda r: (
            "–"
            if r["worst_concurrency"] is None
            else f"C={r['worst_concurrency']}: "
            + fmt_interval(r["worst"], r["worst_low"], r["worst_high"], None)
        ),
    )
    table = html_table(
        frame,
        [
            col("name", "option", str),
            col("description", "config", str),
            Column(
                "expected gain over plain",
                lambda r: fmt_interval(r["gain"], r["gain_low"], r["gain_high"], r["gain_interval"]),
            ),
            worst,
            Column("may be chosen", lambda r: ("yes: " if r["eligible"] else "no: ") + r["reason"]),
        ],
        row_class=lambda r: "win" if r["name"] == first.get("choice") else "",
        empty="no option",
    )
    return (
        "<h3>Deployment options, weighed by traffic</h3>"
        '<p class="note">One deployment serves every load: each option\'s expected gain is the traffic-weighted '
        "geometric mean of its throughput over plain, with its interval; it may be chosen when that interval "
        "clears 1 + the minimum effect and no load with traffic is refuted. Traffic: "
        f"{html.escape(first.get('traffic') or '')}.</p>"
        + table
        + f"<p><b>Deploy: {html.escape(first.get('choice') or '')}</b>. "
        f"{html.escape(first.get('choice_reason') or '')}</p>"
    )


DEPLOYMENT_OPTION_COLUMNS = {
    "name": pl.String,
    "description": pl.String,
    "gain": pl.Float64,
    "gain_low": pl.Float64,
    "gain_high": pl.Float64,
    "gain_interval": pl.String,
    "worst_concurrency": pl.Int64,
    "worst": pl.Float64,
    "worst_low": pl.Float64,
    "worst_high": pl.Float64,
    "eligible": pl.Boolean,
    "reason": pl.String,
}


def recommendation_section(recommendations: list) -> Section:
    """Which depth at which load (analysis.recommend): per drafter and workload, the schedule, the evidence
    behind each range and the --speculative-config to deploy."""
    intro = (
        '<p class="note">Per drafter and workload: at each closed-loop concurrency the depth with the highest '
        "throughput speedup over plain, off (k 0) where even it is below 1, and its edge over the runner-up "
        "depth (geometric mean of per-repeat ratios, t interval over repeats). Batch-size boundaries sit at the "
        "geometric mean of neighbouring loads. <code>specgauge recommend</code> prints the same.</p>"
    )
    if not recommendations:
        return Section(
            "recommend", "Which depth at which load", intro + '<p class="empty">no closed-loop speedups</p>'
        )
    body = [intro]
    for r in recommendations:
        rows = pl.DataFrame([c.__dict__ for c in r.choices])
        body.append(f"<h3>{html.escape(r.family)} on {html.escape(r.workload)}</h3>")
        body.append(
            html_table(
                rows,
                [
                    col("concurrency", "C"),
                    col("best_k", "best k"),
                    Column(
                        "speedup",
                        lambda row: fmt_interval(
                            row["speedup"], row["speedup_low"], row["speedup_high"], row["speedup_interval"]
                        ),
                    ),
                    Column(
                        "runner-up",
                        lambda row: "–" if row["runner_up_k"] is None else f"k={row['runner_up_k']}",
                    ),
                    Column(
                        "edge over it",
                        lambda row: (
                            "–"
                            if row["edge"] is None
                            else fmt_interval(
                                row["edge"], row["edge_low"], row["edge_high"], row["edge_interval"]
                            )
                        ),
                    ),
                    Column("run", lambda row: "off" if row["k"] == 0 else f"k={row['k']}"),
                ],
            )
        )
        config = (
            "none: speculation does not pay at any measured load"
            if r.config is None
            else json.dumps(r.config)
        )
        body.append(f"<p><b>--speculative-config</b> <code>{html.escape(config)}</code></p>")
        if r.caveats:
            body.append("<ul>" + "".join(f"<li>{html.escape(c)}</li>" for c in r.caveats) + "</ul>")
    return Section("recommend", "Which depth at which load", "".join(body))


def _ms(value: Any) -> str:
    return "–" if value is None else f"{fmt_ms(value)} ms"


def validity_section(validity: pl.DataFrame, confounds: pl.DataFrame) -> Section:
    """Can the campaign be trusted: its A/A gap, repeat spread, the client's own error, and the engine settings
    that differ from plain's beyond speculation (analysis/validity.py)."""
    if validity.is_empty():
        return Section("validity", "Validity", '<p class="empty">not judged</p>')
    v = validity.row(0, named=True)
    verdict = {
        "valid": "valid",
        "invalid": "INVALID: nothing is recommended from it",
        "inconclusive": "inconclusive: its recommendations stand on an unverified measurement",
    }.get(v.get("verdict") or ("valid" if v["valid"] else "invalid"), "not judged")
    rows = [
        (
            "A/A gap (a second plain arm / plain, output throughput)",
            "no A/A control (validity.aa_control: true adds one)"
            if v["aa_estimate"] is None
            else f"{fmt_interval(v['aa_estimate'], v['aa_low'], v['aa_high'], v['aa_interval'])}: gap "
            f"{v['aa_gap']:.1%} (limit {v['max_aa_gap']:.1%}; {v['aa_interval']})",
        ),
        (
            "repeat spread of plain (median over cells of (max - min) / mean throughput)",
            "fewer than 2 repeats"
            if v["repeat_spread"] is None
            else f"{v['repeat_spread']:.1%} over {v['repeat_spread_cells']} cells "
            f"(limit {v['max_repeat_spread']:.0%})",
        ),
        (
            "client error at the campaign's heaviest load (measured - injected, against the emulator)",
            "no calibration stored"
            if v["client_concurrency"] is None
            else f"C={v['client_concurrency']}: TTFT p50 {_ms(v['client_ttft_error_p50_s'])}, "
            f"p99 {_ms(v['client_ttft_error_p99_s'])}; TPOT p50 {_ms(v['client_tpot_error_p50_s'])}, "
            f"p99 {_ms(v['client_tpot_error_p99_s'])}; send lag p99 {_ms(v['client_send_lag_p99_s'])}",
        ),
        (
            "smallest latency difference reported (TTFT or TPOT p50, variant vs plain)",
            f"{_ms(v['smallest_latency_difference_s'])}"
            + (
                ""
                if v["client_error_ok"] is None
                else " (the client's p99 error is "
                + ("within" if v["client_error_ok"] else "ABOVE")
                + " a tenth of it)"
            ),
        ),
    ]
    table = (
        "<table>"
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(val)}</td></tr>" for k, val in rows)
        + "</table>"
    )
    confound_html = html_table(
        confounds,
        [
            col("variant", "variant", str),
            col("repeat", "repeat", str),
            col("baseline_variant", "against", str),
            Column(
                "settings beyond speculation that differ",
                lambda r: "; ".join(r["differences"]) if r["differences"] else "none",
            ),
            col("sources", "stated by (plain / speculative)", str),
        ],
        row_class=lambda r: "flag" if r["differences"] else "",
        empty="no effective engine configuration recorded",
    )
    return Section(
        "validity",
        "Validity",
        f"<p><b>The campaign is {html.escape(verdict)}.</b> {html.escape(v['reasons'] or '')}</p>"
        + table
        + '<p class="note">Effective engine configuration: what each engine stated it runs with (/server_info, '
        "its start-up log, /metrics info gauges), compared with plain's deployment of the same repeat. A "
        'difference beyond speculation is a confound: the speedup includes it. "not stated by plain" '
        "usually means vLLM announced a change for the speculative engine only.</p>" + confound_html,
    )


def tree_sim_section(tree_sim: Any, chart_html: str) -> Section:
    """ "Trees and drafter combinations (offline)": `tree_sim` is analysis.simulate.store.TreeSim (the
    campaign's latest simulation): validation, where an unserved shape would pay, every projection."""
    from analysis.simulate.cost import PAY_MARGIN, formula, pay_table

    run, projections, validation = tree_sim.run, tree_sim.projections, tree_sim.validation
    cost = json.loads(run["cost_model"]) if run.get("cost_model") else None
    if cost:
        coefficients = formula(
            cost["base_s"], cost["per_sequence_s"], cost["per_batch_token_s"], cost["per_pass_s"]
        )
        fitted = (
            f"The cost model is fitted on campaign <b>{html.escape(str(run['fitted_on']))}</b>'s "
            f"{run['fit_points']} measured closed-loop cells (plain, and each served chain at its verified width): "
            f"{html.escape(coefficients)}; relative residual rms {fmt_pct(run['fit_rms_residual'])}, max "
            f"{fmt_pct(run['fit_max_residual'])}."
        )
    else:
        fitted = "No cost model: the warehouse held no measured cells to fit it on, so nothing is projected."
    limits = (
        "Limits: acceptance is replayed greedily on the outputs of "
        f"{html.escape(str(run.get('outputs_capture')))} (exact for the served chains, as the validation shows), whose "
        "prompts (the capture corpus) need not be the measured cells' workloads, so a stratum's simulated "
        "acceptance can differ from its cells'; the "
        "cost model is linear in batch tokens and drafting passes and extrapolates to widths the campaign never "
        "served (a tree verifying 9 tokens per sequence was not measured), it prices tree attention like chain "
        "verification and leaves prefill out, and suffix decoding is approximate. A projection is a screen for "
        "what to serve next, not a measurement."
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in run.get("notes") or [])
    per_position = Column(
        "per position served | simulated",
        lambda r: (
            " / ".join(f"{v:.2f}" for v in r["served_per_position"] or [])
            + " | "
            + " / ".join(f"{v:.2f}" for v in r["simulated_per_position"] or [])
        ),
    )
    return Section(
        "tree-sim",
        "Trees and drafter combinations (offline)",
        '<p class="note">The campaign\'s greedy captures replayed offline through speculative drafting '
        "(analysis/simulate, docs/simulate.md): how many tokens a chain, a tree, a graft of one drafter's "
        "candidates onto another's, or two drafters together would have accepted on this traffic, and what "
        f"that would cost at each measured load. Simulation {html.escape(str(run['simulation_id']))}, "
        f"{run['created_utc']:%Y-%m-%d %H:%M} UTC, specgauge {html.escape(str(run.get('specgauge_version')))}. "
        f"{fitted}</p>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + "<h3>Simulated against served (vLLM's counters over the same requests)</h3>"
        + html_table(
            validation,
            [
                Column("capture", lambda r: r["capture_id"] + ("" if r["exact_mirror"] else " (approx.)")),
                col("k"),
                col("served_mean_acceptance_length", "served mean acc. len"),
                col("simulated_mean_acceptance_length", "simulated"),
                Column(
                    "rel. error",
                    lambda r: "–" if r["relative_error"] is None else f"{r['relative_error']:+.2%}",
                ),
                col("within_target", "within 5%", fmt_bool),
                per_position,
            ],
            row_class=lambda r: "flag" if r["within_target"] is False else "",
            empty="no speculative capture with counters to validate against",
        )
        + "<h3>Where a tree, a graft or two drafters would pay</h3>"
        + f'<p class="note">Per workload and load: the best served chain against the best simulated shape by '
        f"projected throughput speedup over plain (a gain under {PAY_MARGIN:.0%} is within the model's error). "
        "Measured: what the served chain really did.</p>"
        + html_table(
            pay_table(projections),
            [
                col("stratum", "workload"),
                col("load_label", "load"),
                col("served_shape", "served chain"),
                col("served_projected", "projected"),
                col("served_measured", "measured"),
                col("best_shape", "best shape"),
                col("best_mean_acceptance_length", "mean acc. len"),
                col("best_verified_tokens_per_step", "verified / step"),
                col("best_projected", "projected speedup"),
                col("verdict"),
            ],
            row_class=lambda r: "win" if r["verdict"].startswith("pays") else "",
            empty="no projection",
        )
        + chart_html
        + "<h3>Every projection</h3>"
        + html_table(
            projections,
            [
                col("shape"),
                col("stratum", "workload"),
                col("load_label", "load"),
                col("mean_acceptance_length", "mean acc. len"),
                col("tokens_per_step", "tokens / step"),
                col("verified_tokens_per_step", "verified / step"),
                col("batch_tokens", "batch tokens"),
                col("projected_step_s", "step ms", fmt_ms),
                col("projected_tpot_s", "TPOT ms", fmt_ms),
                col("projected_throughput_tok_s", "tok/s"),
                col("projected_speedup", "projected speedup"),
                col("measured_speedup", "measured (served)"),
            ],
            row_class=lambda r: "flag" if (r["projected_speedup"] or 0) < 1 else "",
            empty="no projection",
        )
        + f'<p class="note">{limits}</p>',
    )


def verdict_section(data: CampaignData, results: Results) -> Section:
    """Which cells win under the decision rule (analysis.decision), the rule itself and what to know first."""
    settings = results.settings
    decisions = results.decisions
    wins = decisions.filter(pl.col("wins")) if not decisions.is_empty() else decisions
    summary = (
        f"{wins.height} of {decisions.height} variant x workload x load cells win under the rule."
        if decisions.height
        else "No speculative cells to judge."
    )
    winners = "".join(
        f"<li><b>{html.escape(r['variant'])}</b> on {html.escape(r['workload'])} at {html.escape(r['load_label'])}: "
        f"{html.escape(r['reason'])}</li>"
        for r in wins.iter_rows(named=True)
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in results.notes)
    return Section(
        "verdict",
        "Verdict and decision rule",
        f'<p class="rule"><b>Decision rule.</b> {html.escape(rule_text(settings, decision_rule(data)))}</p>'
        f"<p>{html.escape(summary)}</p>"
        + (f"<ul>{winners}</ul>" if winners else "")
        + (f"<p><b>Notes</b></p><ul>{notes}</ul>" if notes else "")
        + html_table(
            decisions,
            [
                *_load_cols(),
                _interval_col(f"{settings.gain_metric} speedup"),
                col("success_rate", "success", fmt_pct),
                col("worst_other_workload", "worst other workload", lambda v: v or "–"),
                col("gate_passed", "gate passed", fmt_bool),
                col("confounded", "confounded", fmt_bool),
                col("wins", "wins", fmt_bool),
                col("reason"),
            ],
            row_class=lambda r: "win" if r["wins"] else "",
            empty="no speculative cells",
        ),
    )


def _speedup_pivot(speedup: pl.DataFrame) -> pl.DataFrame:
    """One row per variant, workload and load with each metric's speedup as text (flag: throughput below 1)."""
    pivot_rows = []
    if not speedup.is_empty():
        keys = ["variant", "workload", "load_mode", "load_label", "concurrency", "rate"]
        for key, group in speedup.group_by(keys, maintain_order=True):
            row = dict(zip(keys, key, strict=True))
            for r in group.iter_rows(named=True):
                row[r["metric"]] = fmt_interval(r["estimate"], r["ci_low"], r["ci_high"], r["interval"])
                row["n"] = r["n_repeats"]
                row["flag"] = row.get("flag", False) or (r["metric"] == "throughput" and r["below_one"])
            pivot_rows.append(row)
    return pl.DataFrame(pivot_rows) if pivot_rows else pl.DataFrame()


def speedup_section(results: Results, charts: EmbeddedCharts) -> Section:
    """Q1 (analysis.speedup, analysis.crossover): the speedup of every variant by workload and load, and the
    load above which a variant stops paying."""
    settings = results.settings
    pivot = _speedup_pivot(results.speedup)
    metric_cols = [
        Column(m.replace("_", " "), lambda r, m=m: r.get(m) or "–")
        for m in ("throughput", "ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95")
    ]
    return Section(
        "q1",
        "Q1. Speedup by workload and load",
        '<p class="note">Ratios against plain launched the same way (>1: faster), paired by workload, load and '
        "repeat (repeat r of every variant is launched in one block of the campaign); estimate = geometric mean "
        f"of the per-repeat ratios, [interval] = {percent(settings.confidence)} Student t interval over repeats on "
        "the log scale (its coverage holds at every n: docs/analysis.md; two repeats give a wide one). With "
        "one repeat there is no interval. Red rows: throughput speedup below 1.</p>"
        + html_table(
            pivot,
            [*_load_cols(), *metric_cols, col("n", "repeats")],
            row_class=lambda r: "flag" if r.get("flag") else "",
            empty="no paired cells",
        )
        + chart_or_note(charts, "speedup_closed", "no closed-loop cells")
        + (chart_or_note(charts, "speedup_open", "") if "speedup_open" in charts else "")
        + "<h3>Crossover: the load above which a variant stops paying</h3>"
        + html_table(
            results.crossover,
            [
                col("variant"),
                col("workload"),
                col("load_mode", "mode"),
                col("metric"),
                col("status"),
                col("crossover", "crossover load"),
                col("interval"),
                Column(
                    "speedups by load",
                    lambda r: ", ".join(
                        f"{load:g}: {s:.3g}" for load, s in zip(r["loads"], r["speedups"], strict=True)
                    ),
                ),
            ],
            empty="no variant has two loads",
        ),
    )


def _fit_columns() -> list[Column]:
    """A least-squares fit's columns (Q2 and Q3's tables of analysis.acceptance and analysis.depth fits)."""
    return [
        col("method"),
        col("predictor"),
        col("response"),
        col("n"),
        col("n_deployments", "deployments"),
        Column("slope [CI]", lambda r: fmt_interval(r["slope"], r["slope_low"], r["slope_high"], r["note"])),
        Column(
            "intercept [CI]",
            lambda r: fmt_interval(r["intercept"], r["intercept_low"], r["intercept_high"], r["note"]),
        ),
        col("r2", "R²"),
        col("p_value", "p"),
        col("note"),
    ]


def _question_fits(fits: pl.DataFrame, question: str) -> pl.DataFrame:
    """The fits (Results.fits: Q2's and Q3's together) of one question."""
    return fits.filter(pl.col("question") == question) if not fits.is_empty() else fits


def _acceptance_interval_cols() -> list[Column]:
    """Mean acceptance length and acceptance rate with their bootstrap intervals (analysis.acceptance)."""
    return [
        Column(
            "mean acc. len [CI]",
            lambda r: fmt_interval(
                r["mean_acceptance_length"],
                r["mean_acceptance_length_low"],
                r["mean_acceptance_length_high"],
                r["acceptance_interval"],
            ),
        ),
        Column(
            "acceptance rate [CI]",
            lambda r: fmt_interval(
                r["acceptance_rate"], r["acceptance_rate_low"], r["acceptance_rate_high"], None
            ),
        ),
    ]


def acceptance_section(results: Results, charts: EmbeddedCharts) -> Section:
    """Q2 (analysis.acceptance): how well acceptance predicts speed, and acceptance with its interval."""
    return Section(
        "q2",
        "Q2. How well acceptance predicts speed",
        '<p class="note">Per method, each cell is a point: x = acceptance rate or mean acceptance length '
        "(vLLM's, bonus token included), y = its speedup against the paired plain cell. Least-squares fits "
        "(scipy linregress) with t intervals. Cells of one deployment are not independent replicates.</p>"
        + html_table(
            _question_fits(results.fits, "Q2"),
            _fit_columns(),
            empty="no speculative cells with acceptance figures",
        )
        + "<p class=\"note\">Acceptance with its interval: from each request's own acceptance (vLLM's "
        "per-request block), a bootstrap over prompts, so one greedy launch has one; beside it the cells' "
        "counter figure, which the requests' sums must match.</p>"
        + html_table(
            results.acceptance,
            [
                col("variant"),
                col("workload"),
                col("load_label", "load"),
                *_acceptance_interval_cols(),
                col("counters_mean_acceptance_length", "counters' mean acc. len"),
                col("prompts"),
                col("launches"),
                col("acceptance_interval", "interval"),
            ],
            empty="no speculative cells",
        )
        + chart_or_note(charts, "acceptance_positions", "no per-position acceptance counters"),
    )


def context_length_section(results: Results, charts: EmbeddedCharts) -> Section | None:
    """Acceptance and speedup per prompt-length bucket (analysis.context_length), and the simulator's
    projections for those buckets when the campaign has a simulation; None without bucketed strata."""
    from analysis.context_length import bucket_projections, context_length_table

    table = context_length_table(results.acceptance, results.speedup)
    if table.is_empty():
        return None
    body = (
        '<p class="note">Strata named <code>&lt;stratum&gt;-len-&lt;lower edge&gt;</code> are prompt-length '
        "buckets (workloads/length_buckets.py: prompts counted by the target's tokenizer with its chat template). "
        "Acceptance from each request's own acceptance, bootstrap over prompts; speedup: output throughput over "
        "plain of the same bucket and load, per repeat. The warehouse's <code>v_context_length</code> has the "
        "counters' figures per bucket.</p>"
        + chart_or_note(charts, "context_length", "no acceptance figures for the buckets")
        + html_table(
            table,
            [
                col("variant"),
                col("bucket_tokens", "bucket from (tokens)"),
                col("load_label", "load"),
                *_acceptance_interval_cols(),
                col("prompts"),
                Column(
                    "throughput x plain [CI]",
                    lambda r: fmt_interval(
                        r["throughput_speedup"], r["speedup_low"], r["speedup_high"], r["speedup_interval"]
                    ),
                ),
            ],
        )
    )
    projections = bucket_projections(results.tree_sim.projections if results.tree_sim else None)
    if not projections.is_empty():
        body += "<h3>The simulator's replay per bucket</h3>" + html_table(
            projections,
            [
                col("shape"),
                col("bucket_tokens", "bucket from (tokens)"),
                col("load_label", "load"),
                col("mean_acceptance_length", "projected mean acc. len"),
                col("projected_speedup", "projected x plain"),
                col("measured_speedup", "measured x plain"),
            ],
        )
    return Section("context-length", "Acceptance against context length", body)


def depth_section(results: Results, charts: EmbeddedCharts) -> Section:
    """Q3 (analysis.depth): step time against depth and the break-even tokens per step."""
    # one predictor (k) and one response (relative step time): per method and per method and workload
    fit_cols = [col("method"), col("workload"), *_fit_columns()[3:]]
    return Section(
        "q3",
        "Q3. Depth, step time and break-even",
        '<p class="note">L = tokens per decode step = T / (T - accepted); step_k = TPOT_mean x L; '
        "break-even L* = step_k / step_plain (plain's step is its TPOT). Speculation pays per token when L > L*. "
        "Best = the highest throughput speedup among the depths of its method; red: speedup below 1.</p>"
        + html_table(
            results.depth,
            [
                col("variant"),
                col("k"),
                col("workload"),
                col("load_label", "load"),
                Column(
                    "step time ms [CI]",
                    lambda r: fmt_interval(
                        r["step_time_s"] * 1000 if r["step_time_s"] is not None else None,
                        r["step_time_low"] * 1000 if r["step_time_low"] is not None else None,
                        r["step_time_high"] * 1000 if r["step_time_high"] is not None else None,
                        r["interval"],
                    ),
                ),
                col("plain_step_time_s", "plain step ms", fmt_ms),
                col("tokens_per_step", "L"),
                col("break_even_tokens_per_step", "L*"),
                col("mean_acceptance_length", "vLLM mean acc. len"),
                col("throughput_speedup", "throughput speedup"),
                col("tpot_p50_speedup", "TPOT p50 speedup"),
                col("pays_per_token", "L > L*", fmt_bool),
                col("best", "best depth", fmt_bool),
            ],
            row_class=lambda r: "flag" if r["below_one"] else ("win" if r["best"] else ""),
            empty="no speculative cells with step times",
        )
        + "<h3>Relative step time against k</h3>"
        + html_table(_question_fits(results.fits, "Q3"), fit_cols, empty="no fits")
        + chart_or_note(charts, "step_time", "no speculative cells with step times"),
    )


def choice_section(results: Results) -> Section:
    """Q4 (analysis.choice): per workload and load, n-gram or a draft model."""
    return Section(
        "q4",
        "Q4. N-gram or draft model?",
        '<p class="note">Per workload and load, the best n-gram and the best draft-model depth under the '
        "decision rule; the draft model is chosen over n-gram only when its own gain over n-gram is significant "
        "(paired per repeat); KV-cache tokens as each deployment reported at start-up.</p>"
        + html_table(
            results.choice,
            [
                col("workload"),
                col("load_label", "load"),
                col("choice"),
                Column(
                    "n-gram",
                    lambda r: (
                        f"{r['ngram_variant']}: "
                        + fmt_interval(r["ngram_speedup"], r["ngram_low"], r["ngram_high"], "no interval")
                    ),
                ),
                Column(
                    "draft model",
                    lambda r: (
                        f"{r['draft_variant']}: "
                        + fmt_interval(r["draft_speedup"], r["draft_low"], r["draft_high"], "no interval")
                    ),
                ),
                Column(
                    "draft / n-gram",
                    lambda r: fmt_interval(
                        r["draft_over_ngram"],
                        r["draft_over_ngram_low"],
                        r["draft_over_ngram_high"],
                        r["interval"],
                    ),
                ),
                col("kv_tokens_plain", "KV tokens plain"),
                col("kv_tokens_ngram", "KV n-gram"),
                col("kv_tokens_draft", "KV draft"),
                col("draft_kv_loss", "draft KV loss", fmt_pct),
                col("kv_usage_peak_draft", "peak KV use (draft)", fmt_pct),
                col("preemptions_draft", "preemptions (draft)"),
                col("reason"),
                col("indicative"),
            ],
            empty="the campaign does not have both an n-gram and a draft-model variant",
        ),
    )


def break_even_section(break_even: pl.DataFrame) -> Section:
    """Break-even acceptance measured by synthetic-acceptance runs (analysis.breakeven)."""
    return Section(
        "break-even",
        "Break-even acceptance, measured",
        '<p class="note">From synthetic-acceptance runs (the drafter and verification run for real, drafts '
        "accepted at a named mean acceptance length L): the throughput speedup over plain against L, fitted "
        "by least squares, crosses 1 at the break-even L* [t interval of the repeats' own crossings]; beside it the "
        "break-even Q3 infers from the real runs of the same depth (s_k / s_0).</p>"
        + html_table(
            break_even,
            [
                col("family"),
                col("k"),
                col("workload"),
                col("concurrency", "C"),
                Column("lengths", lambda r: ", ".join(f"{v:g}" for v in r["lengths"])),
                Column(
                    "break-even L*",
                    lambda r: fmt_interval(
                        r["break_even"], r["break_even_low"], r["break_even_high"], "no interval"
                    ),
                ),
                col("inferred_break_even", "inferred from real runs", fmt_num()),
                col("note"),
            ],
        ),
    )


def capacity_section(data: CampaignData, results: Results, charts: EmbeddedCharts) -> Section:
    """Q5 (analysis.capacity): the sustainable load under the SLO, and the capacity searches."""
    mode = "open" if has_rate_sweep(data) else "closed"
    return Section(
        "q5",
        "Q5. Sustainable rate under the SLO",
        f"<p>{html.escape(q5_statement(data, results.capacity))}</p>"
        f'<p class="note">SLO: p99 TTFT &lt;= {data.slo[0]} s, p99 TPOT &lt;= {data.slo[1]} s (campaign spec).</p>'
        + html_table(
            results.capacity,
            [
                col("variant"),
                col("workload"),
                col("load_mode", "mode"),
                col("sustainable_load", "sustainable"),
                col("first_violation_load", "first violation"),
                col("goodput_rps_at_sustainable", "goodput rps"),
                col("ttft_p99_s_at_sustainable", "TTFT p99 s"),
                col("tpot_p99_s_at_sustainable", "TPOT p99 s"),
                col("gain_vs_plain", "x plain"),
                col("kv_cache_tokens", "KV tokens"),
                col("kv_loss_vs_plain", "KV loss", fmt_pct),
                col("verdict"),
            ],
            empty="no capacity rows",
        )
        + chart_or_note(charts, f"capacity_{mode}", "no capacity data")
        + search_html(results.searches),
    )


def latency_section(charts: EmbeddedCharts) -> Section:
    """Latency distributions and the throughput-latency trade-off (charts only)."""
    return Section(
        "latency",
        "Latency distributions and the throughput-latency trade-off",
        chart_or_note(charts, "latency", "no request rows")
        + chart_or_note(charts, "itl", "no streamed chunks")
        + chart_or_note(charts, "pareto", "no cells"),
    )


def gates_section(gates: pl.DataFrame) -> Section:
    """The greedy-correctness gate's latest verdict per variant (v_gate)."""
    return Section(
        "gates",
        "Correctness gate verdicts",
        html_table(
            gates,
            [
                col("treatment_variant", "variant"),
                col("passed", "passed", fmt_bool),
                col("outcome"),
                col("n_prompts", "prompts"),
                col("exact_match_rate", "exact match", fmt_pct),
                col("envelope_exact_match_min", "control envelope min", fmt_pct),
                col("verdict"),
                col("verdict_id", "verdict id"),
            ],
            row_class=lambda r: "win" if r["passed"] else "flag",
            empty="no gate verdicts in the warehouse for this campaign: no variant can win",
        ),
    )


def sampling_check_section(view: pl.DataFrame, chart_html: str) -> Section:
    """Correctness under sampling (v_sampling_check): each treatment's verdict, and TV per position."""
    table = html_table(
        pl.DataFrame(section_rows(view)),
        [
            col("treatment_variant", "variant"),
            col("outcome", "verdict"),
            col("temperature", "T"),
            col("n_prompts", "prompts"),
            col("samples", "samples"),
            col("tokens", "tokens"),
            col("rejected_prompts", "prompts differing"),
            col("null_rejected_prompts", "plain vs plain differing"),
            col("claim"),
        ],
        row_class=lambda r: "win" if r["passed"] else "flag",
        empty="no sampling check",
    )
    note = (
        '<p class="note">Per prompt: N samples of the first m tokens from plain, the variant and a second plain '
        "launch at the same temperature; total-variation distance per position and of the whole prefix, "
        'permutation p-values, Holm over prompts (docs/gate.md, "Under sampling").</p>'
    )
    return Section("sampling", "Correctness under sampling", note + table + chart_html)


def _provenance_table(data: CampaignData, settings: AnalysisSettings, analysis: dict[str, Any]) -> str:
    """What was measured with what, and what analysed it: a two-column table."""
    campaign = data.campaign
    host = campaign.get("host") or {}
    return (
        "<table>"
        + "".join(
            f"<tr><th>{html.escape(k)}</th><td>{html.escape('–' if v is None else str(v))}</td></tr>"
            for k, v in (
                ("campaign", campaign["campaign_id"]),
                ("spec name", campaign.get("spec_name")),
                ("status", campaign.get("status")),
                ("created (UTC)", campaign.get("created_utc")),
                ("last run (UTC)", campaign.get("last_run_utc")),
                (
                    "measured with specgauge",
                    f"{campaign.get('specgauge_version')} @ {campaign.get('git_revision')}",
                ),
                ("host", ", ".join(f"{k}={v}" for k, v in host.items()) or campaign.get("hostname")),
                (
                    "engine versions",
                    ", ".join(sorted({str(v) for v in data.deployments["engine_version"].to_list()}))
                    if not data.deployments.is_empty()
                    else "–",
                ),
                ("analysis", f"{analysis['analysis_id']} at {analysis['created_utc']}"),
                ("analysed with specgauge", f"{analysis['specgauge_version']} @ {analysis['git_revision']}"),
                (
                    "analysis settings",
                    f"confidence {percent(settings.confidence)}, Student t intervals over repeats (log "
                    f"scale for ratios), gain = {settings.gain_metric} speedup",
                ),
            )
        )
        + "</table>"
    )


def provenance_section(data: CampaignData, settings: AnalysisSettings, analysis: dict[str, Any]) -> Section:
    """Provenance: the campaign, the analysis, every deployment and the spec."""
    deployments = (
        data.deployments.with_columns(pl.col("engine_command").list.join(" ").alias("command"))
        if not data.deployments.is_empty()
        else data.deployments
    )
    return Section(
        "provenance",
        "Provenance",
        _provenance_table(data, settings, analysis)
        + "<h3>Deployments</h3>"
        + html_table(
            deployments,
            [
                col("deployment_id", "deployment"),
                col("variant"),
                col("repeat"),
                col("launcher"),
                col("engine_version", "engine"),
                col("kv_cache_tokens", "KV tokens"),
                col("ready_s", "ready s"),
                col("status"),
                col("command", "engine command", str),
            ],
            empty="no deployments",
        )
        + "<h3>Spec</h3><pre>"
        + html.escape(json.dumps(data.spec, indent=2, sort_keys=True))
        + "</pre>",
    )


def gpu_telemetry_section(telemetry: pl.DataFrame) -> Section:
    """GPU telemetry per cell (v_gpu_telemetry, tasks/metrics/gpu_telemetry.py): energy, energy per output
    token, power, peak memory, utilization and SM clock per GPU over each measured window where GPUs were
    read; "absent (why)" for the cells where none were, never zeros."""
    title = "GPU telemetry (energy and memory per cell)"
    if telemetry.is_empty():
        return Section("gpu-telemetry", title, '<p class="empty">no cells with a telemetry record</p>')
    measured = telemetry.filter(pl.col("gpu_index").is_not_null())
    without = telemetry.filter(pl.col("gpu_index").is_null()).group_by("telemetry_status").len()
    notes = "".join(
        f"<li>{r['len']} cell{'s' if r['len'] != 1 else ''}: {html.escape(_absent_words(r['telemetry_status']))}</li>"
        for r in without.sort("telemetry_status").iter_rows(named=True)
    )
    table = (
        html_table(
            measured,
            [
                *_load_cols(),
                Column("GPU", lambda r: f"{r['gpu_index']}: {r['gpu_name'] or '?'}"),
                col("telemetry_source", "source", str),
                col("telemetry_window_s", "window s"),
                col("energy_j", "energy J"),
                col("energy_counter_j", "NVML counter J"),
                Column("mJ / output token", lambda r: fmt_num()(_milli(r["energy_per_output_token_j"]))),
                col("mean_power_w", "mean W"),
                col("max_power_w", "max W"),
                Column("peak memory GiB", lambda r: fmt_num()(_gib(r["peak_memory_mib"]))),
                col("mean_utilization_pct", "mean util %"),
                col("mean_sm_clock_mhz", "mean SM MHz"),
            ],
        )
        if not measured.is_empty()
        else ""
    )
    return Section(
        "gpu-telemetry",
        title,
        table
        + (f"<p>Without GPU telemetry:</p><ul>{notes}</ul>" if notes else "")
        + '<p class="note">Energy: power integrated over the measured window (docs/telemetry.md); per output '
        "token over the cell's completion tokens. Absent figures are absent, not zero.</p>",
    )


def _absent_words(status: str) -> str:
    """'absent: why' as 'absent (why)'; 'not recorded (...)' and 'failed: why' likewise."""
    state, _, why = status.partition(": ")
    return f"{state} ({why})" if why else status


def _milli(value: Any) -> float | None:
    return None if value is None else value * 1000


def _gib(mib: Any) -> float | None:
    return None if mib is None else mib / 1024


def campaign_sections(
    data: CampaignData, results: Results, charts: EmbeddedCharts, analysis: dict[str, Any]
) -> list[Section]:
    """The report's sections, in reading order. `data`: analysis.data.CampaignData; `results`:
    analysis.results.Results; `charts`: name -> (files, Vega-Lite spec); `analysis`: the analysis_runs row."""
    sections = [decision_section(results.decision)] if not results.decision.is_empty() else []
    sections += [
        verdict_section(data, results),
        validity_section(results.validity, results.confounds),
        speedup_section(results, charts),
        acceptance_section(results, charts),
        *filter(None, [context_length_section(results, charts)]),  # only with prompt-length buckets
        depth_section(results, charts),
        choice_section(results),
    ]
    if results.verdicts:
        sections.append(verification_section(results.verdicts))
    sections.append(recommendation_section(results.recommendations))
    if not results.break_even.is_empty():
        sections.append(break_even_section(results.break_even))
    if has_drafter_depths(data):  # shallow drafters (analysis/drafter_depth.py)
        chart = chart_or_note(charts, "drafter_depth", "no load where two drafter depths ran")
        sections.append(drafter_depth_section(data, results.speedup, chart))
    sections += [capacity_section(data, results, charts), latency_section(charts)]
    sections.append(gpu_telemetry_section(data.gpu_telemetry))  # per GPU, or absent and why
    if "waste" in charts:
        sections.append(
            Section("waste", "Where engine time went (profiles)", chart_or_note(charts, "waste", ""))
        )
    if getattr(results, "tree_sim", None) is not None:
        tree_chart = chart_or_note(charts, "tree_sim", "no projection to draw")
        sections.append(tree_sim_section(results.tree_sim, tree_chart))
    sections.append(gates_section(data.gates))
    if not results.sampling_check.is_empty():
        chart = chart_or_note(charts, "sampling_check", "no sampling check to draw")
        sections.append(sampling_check_section(results.sampling_check, chart))
    sections.append(provenance_section(data, results.settings, analysis))
    return sections


# ------------------------------------------------------------------------------------ adaptation confirmation


def adaptation_section(view: pl.DataFrame, chart_html: str) -> Section:
    """ "Adapted head": a confirmation's verdict (v_adaptation rows of one adaptation): which strata should get
    the adapted head, the rule per stratum and load, and the ratios new / old with their intervals."""
    if view.is_empty():
        return Section("adaptation", "Adapted head", '<p class="empty">no adaptation confirmation</p>')
    first = view.row(0, named=True)
    adopted = sorted({r["stratum"] for r in view.iter_rows(named=True) if r["adopt"]})
    kept = sorted({r["stratum"] for r in view.iter_rows(named=True) if r["stratum"]} - set(adopted))
    view = view.filter(pl.col("stratum").is_not_null())
    verdict = (
        f"Strata that should get the adapted head: {', '.join(adopted)}."
        if adopted
        else "No stratum should get the adapted head: keep the old one."
    )
    if adopted and kept:
        verdict += f" Keep the old head for {', '.join(kept)}."
    gate = (
        "no gate verdict"
        if first["gate_verdict_id"] is None
        else f"gate after the swap {first['gate_outcome']} ({first['gate_verdict_id']})"
    )
    if first["status"] != "ok":
        verdict += f" The confirmation FAILED: {first['error']}"
    facts = (
        f"<p><b>{html.escape(verdict)}</b></p>"
        f'<p class="note">Confirmation {html.escape(first["adaptation_id"])} on deployment '
        f"{html.escape(first['deployment_id'])}: old head {html.escape(str(first['old_sha256'])[:12])}, new head "
        f"{html.escape(str(first['new_sha256'])[:12])} ({html.escape(str(first['new_path']))}), target stratum "
        f"{html.escape(first['target_stratum'])}; {html.escape(gate)}; the old head "
        f"{'served again at the end' if first['swapped_back'] else 'was NOT swapped back'}. Rule: gain "
        f"({html.escape(first['gain_metric'])} new / old) interval above {1 + first['min_effect']:.2f}, no other "
        f"stratum below {1 - first['max_harm']:.2f}, the new head's requests succeeded, the gate passed. "
        "Intervals: Student t over repeats (blocks of one deployment in a seeded random order).</p>"
    )
    table = html_table(
        view,
        [
            col("stratum", "stratum", str),
            col("load_label", "load", str),
            Column("target", lambda r: "target" if r["target"] else ""),
            Column("MAL old → new", lambda r: f"{fmt_num()(r['mal_old'])} → {fmt_num()(r['mal_new'])}"),
            Column(
                "MAL new / old", lambda r: fmt_interval(r["mal_ratio"], r["mal_low"], r["mal_high"], None)
            ),
            Column(
                "throughput new / old",
                lambda r: fmt_interval(
                    r["throughput_ratio"], r["throughput_low"], r["throughput_high"], None
                ),
            ),
            Column(
                "TPOT p50 old / new",
                lambda r: fmt_interval(r["tpot_ratio"], r["tpot_low"], r["tpot_high"], None),
            ),
            col("n_repeats", "repeats", str),
            Column("verdict", lambda r: "adopt" if r["adopt"] else "keep old"),
            col("reason", "why", str),
        ],
        row_class=lambda r: "win" if r["adopt"] else "",
        empty="no strata",
    )
    return Section("adaptation", "Adapted head", facts + table + chart_html)
