"""What one analysis run computed for a campaign (`Results`): the analysis_* tables it stores and what only
its report shows. analysis.run computes it; analysis.report_sections renders it."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from analysis.data import AnalysisSettings
from analysis.recommend import Recommendation, Verdict
from analysis.simulate.store import TreeSim
from analysis.store import ANALYSIS_TABLES


@dataclass
class Results:
    settings: AnalysisSettings
    speedup: pl.DataFrame
    decisions: pl.DataFrame
    fits: pl.DataFrame
    depth: pl.DataFrame
    choice: pl.DataFrame
    capacity: pl.DataFrame
    crossover: pl.DataFrame
    per_position: pl.DataFrame
    step_points: pl.DataFrame
    notes: list[str] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)  # report only, not stored
    break_even: pl.DataFrame = field(default_factory=pl.DataFrame)  # synthetic runs; report only
    searches: pl.DataFrame = field(default_factory=pl.DataFrame)  # capacity searches; report only
    verdicts: list[Verdict] = field(default_factory=list)  # a verification campaign's; report only
    decision: pl.DataFrame = field(default_factory=pl.DataFrame)  # v_decision of this campaign; report only
    validity: pl.DataFrame = field(default_factory=pl.DataFrame)  # one row: A/A, spread, client error
    confounds: pl.DataFrame = field(default_factory=pl.DataFrame)  # engine settings beyond speculation
    acceptance: pl.DataFrame = field(default_factory=pl.DataFrame)  # per-prompt acceptance intervals
    tree_sim: TreeSim | None = None  # the latest simulation (analysis/simulate); report only
    sampling_check: pl.DataFrame = field(default_factory=pl.DataFrame)  # v_sampling_check; report only

    def tables(self) -> dict[str, pl.DataFrame]:
        return {key: getattr(self, key) for key in ANALYSIS_TABLES.values()}
