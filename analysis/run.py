"""One analysis of one campaign, end to end: read the warehouse, answer the questions, store the results in
the `analysis_*` tables, draw the charts and write the report.

    read (warehouse snapshot) -> compute (plain functions of frames) -> store (writer, one transaction)
    -> charts + report (built in a temporary folder, then moved into SPECGAUGE_HOME/reports/<campaign_id>/)

`analyze_campaign` is what the Prefect flow (flows/analyze.py) and `specgauge analyze` call.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from analysis import charts as ch
from analysis.acceptance import acceptance_fits, acceptance_intervals, per_position
from analysis.breakeven import break_even_table
from analysis.capacity import capacity_table, has_rate_sweep, search_table
from analysis.choice import choice_table
from analysis.context_length import context_length_chart, context_length_table
from analysis.crossover import crossover_table
from analysis.data import AnalysisSettings, CampaignData, latency_quantiles, load_campaign
from analysis.decision import decide, decision_rule, rule_text
from analysis.depth import depth_table, step_chart_points, step_time_fits
from analysis.drafter_depth import drafter_depth_chart
from analysis.recommend import is_verification, recommend, verification
from analysis.report import building, render_page, vega_bundle, write_page
from analysis.report_sections import campaign_sections
from analysis.results import Results
from analysis.sampling_report import load_sampling_checks, sampling_chart
from analysis.sequential_verification import report_confidence
from analysis.simulate.store import load_tree_sim
from analysis.speedup import speedup_table
from analysis.store import ANALYSIS_TABLES, RUNS_TABLE, store_results
from analysis.validity import confound_table, is_valid, validity_table, verdict_of
from specgauge.errors import SpecgaugeError
from specgauge.provenance import git_revision, specgauge_version, utc_stamp
from specgauge.settings import get_settings
from warehouse.db import default_path, reader, writer
from warehouse.lock import WaitCallback

PAIRING = (
    "per-repeat ratios against the plain cell of the same workload, load and repeat (repeat r of every variant "
    "is launched in one block, in a shuffled order); intervals: Student t over repeats, log scale for ratios, "
    "throughput's with plain's launch variance pooled from earlier campaigns launched the same way where there "
    "are some; acceptance: bootstrap over prompts"
)


class ReportError(SpecgaugeError):
    """The report page could not be written as a self-contained page."""


def compute(data: CampaignData, settings: AnalysisSettings | None = None) -> Results:
    """Every question's table from one campaign's frames. Pure: no I/O."""
    settings = settings or AnalysisSettings()
    speedup = speedup_table(data, settings)
    validity = validity_table(data, settings)
    decisions = decide(data, speedup, settings, campaign_valid=is_valid(validity))
    fits = pl.concat([acceptance_fits(data, settings), step_time_fits(data, settings)], how="vertical")
    results = Results(
        settings=settings,
        speedup=speedup,
        decisions=decisions,
        fits=fits,
        depth=depth_table(data, speedup, settings),
        choice=choice_table(data, speedup, decisions, settings),
        capacity=capacity_table(data),
        crossover=crossover_table(speedup, settings),
        per_position=per_position(data),
        step_points=step_chart_points(data),
        recommendations=recommend(data, settings, speedups=speedup),
        validity=validity,
        confounds=confound_table(data),
        acceptance=acceptance_intervals(data, settings),
    )
    results.break_even = break_even_table(data, speedup, results.depth, settings)
    results.searches = search_table(data)
    if is_verification(data):
        results.verdicts = verification(data, settings, speedups=speedup)
    results.notes = campaign_notes(data, results)
    return results


def campaign_notes(data: CampaignData, results: Results) -> list[str]:
    """What a reader must know before trusting the tables."""
    notes = []
    if data.cells.is_empty():
        notes.append("the campaign has no successful cells in the warehouse: nothing to analyse")
    if data.repeats == 1:
        notes.append(
            "one repeat (one deployment per variant): no interval can be drawn (n=1), so under the decision "
            "rule no variant can win; point estimates are shown for orientation only. Set `repeats: 3` or more."
        )
    validity = results.validity
    verdict = verdict_of(validity)
    if verdict == "invalid":
        notes.append(
            f"the campaign is INVALID ({validity['reasons'][0]}): nothing is recommended from it; rerun it on a "
            "quieter machine or with more repeats"
        )
    elif verdict == "inconclusive":
        notes.append(
            f"the campaign's validity is INCONCLUSIVE ({validity['reasons'][0]}): read its recommendations "
            "as unverified"
        )
    confounded = results.confounds.filter(pl.col("differences").list.len() > 0)
    if confounded.height:
        notes.append(
            f"{confounded.height} speculative deployment(s) ran with engine settings that differ from plain's "
            "beyond speculation (Validity: confounds); their speedups include that difference"
        )
    if data.repeats == 2:
        notes.append(
            "two repeats: each 95% interval rests on one degree of freedom (t = 12.7 standard errors), so "
            "intervals are wide and only a large, consistent effect clears the rule; 3-5 repeats make claims "
            "that a smaller effect can meet"
        )
    failed = data.campaign.get("failed_cells") or []
    if failed:
        notes.append(f"{len(failed)} cell(s) failed and are left out: {', '.join(failed[:10])}")
    if data.gates.is_empty() and not data.cells.filter(pl.col("method") != "none").is_empty():
        notes.append("no correctness-gate verdict in the warehouse: no variant can win until one passes")
    if not has_rate_sweep(data):
        notes.append("no open-loop rate sweep (`load.rates`): Q5's sustainable rate cannot be measured")
    bursts = data.cells.filter((pl.col("tpot_p50_s") == 0) | (pl.col("ttft_p50_s") == 0))
    if bursts.height:
        notes.append(
            f"{bursts.height} cell(s) have a median TPOT or TTFT of 0 s: most of their responses reached the "
            "client in one burst (the stream was not observed token by token, e.g. a starved or buffering "
            "client), so their ratios for that metric are left out: "
            + ", ".join(bursts["cell_id"].to_list()[:8])
        )
    unchecked = data.cells.filter(pl.col("check_tokens_per_chunk_ok") == False)  # noqa: E712
    if unchecked.height:
        notes.append(
            f"{unchecked.height} cell(s) failed the tokens-per-chunk cross-check (chunks are not decode steps): "
            + ", ".join(unchecked["cell_id"].to_list()[:6])
        )
    return notes


@dataclass
class AnalysisResult:
    campaign_id: str
    analysis_id: str
    db_path: Path
    report: Path | None
    charts: list[ch.ChartFiles]
    rows: dict[str, int]
    results: Results
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        decisions = self.results.decisions
        return {
            "campaign_id": self.campaign_id,
            "analysis_id": self.analysis_id,
            "db_path": str(self.db_path),
            "report": str(self.report) if self.report else None,
            "tables": [RUNS_TABLE, *ANALYSIS_TABLES],
            "rows": self.rows,
            "charts": {c.name: {"html": str(c.html), "png": str(c.png)} for c in self.charts},
            "winners": [
                f"{r['variant']} {r['workload']} {r['load_label']}"
                for r in decisions.filter(pl.col("wins")).iter_rows(named=True)
            ]
            if not decisions.is_empty()
            else [],
            "notes": self.results.notes,
            "valid": is_valid(self.results.validity) is not False,
            "validity": verdict_of(self.results.validity),
            "validity_reasons": None
            if self.results.validity.is_empty()
            else str(self.results.validity["reasons"][0]),
            "invalid_reasons": None
            if is_valid(self.results.validity) is not False
            else str(self.results.validity["reasons"][0]),
            "seconds": round(self.seconds, 3),
        }


def load_decision(con: duckdb.DuckDBPyConnection, campaign_id: str) -> pl.DataFrame:
    """The campaign's latest decision, one row per load (v_decision; empty when it holds none)."""
    return con.sql(
        "SELECT * FROM v_decision WHERE campaign_id = ? AND decision_id = (SELECT decision_id FROM decisions "
        "WHERE campaign_id = ? ORDER BY created_utc DESC, decision_id DESC LIMIT 1) ORDER BY concurrency",
        params=[campaign_id, campaign_id],
    ).pl()


def analyze_campaign(
    campaign_id: str | None = None,
    db_path: Path | str | None = None,
    *,
    settings: AnalysisSettings | None = None,
    reports_dir: Path | str | None = None,
    render: bool = True,
    lock_timeout_s: float | None = 300.0,
    on_wait: WaitCallback | None = None,
    write_guard: Callable[[], AbstractContextManager[Any]] | None = None,
) -> AnalysisResult:
    """Analyse a campaign (default: the latest in the warehouse); store its tables; write its report.

    `write_guard` wraps the warehouse write (the Prefect flow passes its global concurrency limit)."""
    started = time.monotonic()
    db = Path(db_path) if db_path is not None else default_path()
    with reader(db, on_wait=on_wait) as con:
        data = load_campaign(con, campaign_id)
        latencies = latency_quantiles(con, data.campaign_id)
        tree_sim = load_tree_sim(con, data.campaign_id)
        decision = load_decision(con, data.campaign_id)
        sampling = load_sampling_checks(con, data.campaign_id)
    # An adaptive campaign stopped on intervals at a corrected level: report those, so they keep coverage.
    settings = settings or AnalysisSettings(confidence=report_confidence(data.spec))
    results = compute(data, settings)
    results.tree_sim = tree_sim
    results.decision = decision
    results.sampling_check = sampling
    rule = decision_rule(data)
    analysis_id = f"{utc_stamp()}-{uuid.uuid4().hex[:8]}"
    folder = Path(reports_dir or get_settings().reports_dir) / data.campaign_id
    run = {
        "created_utc": datetime.now(UTC).replace(tzinfo=None),
        "confidence": settings.confidence,
        "resamples": None,  # bootstrap settings of analyses before the switch to t intervals (issue 18)
        "crossover_resamples": None,
        "seed": None,
        "gain_metric": settings.gain_metric,
        "min_success_rate": rule.min_success_rate,
        "min_effect": rule.min_effect,
        "guardrail": rule.guardrail,
        "repeats": data.repeats,
        "decision_rule": rule_text(settings, rule),
        "pairing": PAIRING,
        "specgauge_version": specgauge_version(),
        "git_revision": git_revision(),
        "report_path": str(folder / "index.html") if render else None,
        "notes": results.notes,
    }
    guard = write_guard() if write_guard else nullcontext()
    with guard, writer(db, timeout_s=lock_timeout_s, on_wait=on_wait) as con:
        run["seconds"] = time.monotonic() - started
        rows = store_results(con, data.campaign_id, analysis_id, run, results.tables())
    report, chart_files = None, []
    if render:
        report, chart_files = write_report(
            folder, data, results, latencies, {"analysis_id": analysis_id, **run}
        )
    return AnalysisResult(
        campaign_id=data.campaign_id,
        analysis_id=analysis_id,
        db_path=db,
        report=report,
        charts=chart_files,
        rows=rows,
        results=results,
        seconds=time.monotonic() - started,
    )


CHART_TITLES = {
    "speedup_closed": "Speedup against concurrency",
    "speedup_open": "Speedup against offered rate",
    "latency": "Request latency distributions",
    "itl": "Inter-token latency: chunk gap and ITL per token",
    "acceptance_positions": "Per-position acceptance",
    "context_length": "Acceptance against context length",
    "pareto": "Throughput against latency (Pareto)",
    "capacity_open": "Capacity curves (open loop)",
    "capacity_closed": "Capacity curves (closed loop)",
    "step_time": "Inferred step time against k",
    "waste": "Waste breakdown (profiles)",
    "tree_sim": "Trees and drafter combinations: projected speedup (offline)",
    "sampling_check": "Correctness under sampling: TV per position",
    "drafter_depth": "Shallow drafters: throughput over plain per drafter depth",
}


def build_charts(data: CampaignData, results: Results, latencies: pl.DataFrame) -> dict[str, Any]:
    """name -> Altair chart, for every chart this campaign has data for."""
    confidence = results.settings.confidence
    candidates = {
        "speedup_closed": ch.speedup_chart(results.speedup, "closed", confidence),
        "speedup_open": ch.speedup_chart(results.speedup, "open", confidence),
        "latency": ch.request_latency_chart(latencies),
        "itl": ch.itl_chart(latencies),
        "acceptance_positions": ch.position_chart(results.per_position),
        "context_length": context_length_chart(
            context_length_table(results.acceptance, results.speedup), confidence
        ),
        "pareto": ch.pareto_chart(data.cells),
        "capacity_open": ch.capacity_chart(data.capacity, "open"),
        "capacity_closed": ch.capacity_chart(data.capacity, "closed"),
        "step_time": ch.step_chart(results.step_points),
        "waste": ch.waste_chart(data.waste),
        "tree_sim": ch.tree_sim_chart(results.tree_sim.projections) if results.tree_sim else None,
        "sampling_check": sampling_chart(results.sampling_check),
        "drafter_depth": drafter_depth_chart(data, results.speedup),
    }
    return {name: chart for name, chart in candidates.items() if chart is not None}


def write_report(
    folder: Path, data: CampaignData, results: Results, latencies: pl.DataFrame, analysis: dict[str, Any]
) -> tuple[Path, list[ch.ChartFiles]]:
    """Charts (HTML + PNG) and index.html, built beside the final folder and moved into place at the end."""
    with building(folder) as build:
        embedded: dict[str, tuple[ch.ChartFiles, dict[str, Any]]] = {}
        files = []
        for name, chart in build_charts(data, results, latencies).items():
            saved = ch.save_chart(chart, build, name, CHART_TITLES[name])
            files.append(saved)
            embedded[name] = (saved, chart.to_dict())
        title = f"specgauge report: {data.campaign_id}"
        intro = (
            f'<p class="note">Campaign <b>{data.campaign_id}</b> ({data.campaign.get("spec_name")}), '
            f"{data.cells.height} measured cells over {data.repeats} repeat(s). Generated "
            f"{analysis['created_utc']:%Y-%m-%d %H:%M:%S} UTC by analysis {analysis['analysis_id']}. "
            "This page makes no network request; every chart is also beside it as HTML and PNG.</p>"
        )
        page = render_page(title, intro, campaign_sections(data, results, embedded, analysis), vega_bundle())
        write_page(build, page, ReportError)
    moved = [ch.ChartFiles(f.name, f.title, folder / f.html.name, folder / f.png.name) for f in files]
    return folder / "index.html", moved


def report_path(campaign_id: str, reports_dir: Path | str | None = None) -> Path:
    return Path(reports_dir or get_settings().reports_dir) / campaign_id / "index.html"
