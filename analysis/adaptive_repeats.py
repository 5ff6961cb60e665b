"""Adaptive repeats (issue 21): launch repeat blocks until every interval the campaign's decision needs is
narrow enough, or the budget is spent.

The decision (analysis.decision) needs, for every speculative variant, workload and load, the interval of its
gain over plain: the per-repeat ratio speculative_r / plain_r (paired within repeat block r, as v_speedup
pairs them) and the Student t interval of the log-ratios (analysis.stats.ratio_interval). After each repeat
block the campaign reads its finished cells from disk (`campaign_observations`, no warehouse needed) and asks
`repeat_decision` whether to launch another block:

- never before `min` repeat blocks, always stop at `max`;
- in between, stop when every comparison's interval has a halfwidth on the log scale (log(high / estimate),
  i.e. 0.05 is about +-5% of the speedup) at or under `target_halfwidth`.

Sequential looks bias naive intervals: a campaign that stops as soon as its 95% intervals look narrow stops
exactly when its sample spread came out small, and those intervals then cover the truth less often (down to
90.4% with one comparison and min 3, 88.2% with min 2: benchmarks/adaptive_repeats.py). The correction chosen by that
simulation: the rule's intervals, for stopping AND for reporting, spend half of the campaign's alpha
(`interval_confidence`: 97.5% t intervals for a 95% campaign), and min is at least 3. With it the reported
interval covers 94.5% or more of the time in every simulated scenario (docs/analysis.md, "Adaptive
repeats"). A campaign that stopped therefore has 97.5% intervals at or under the target; the analysis should
report such a campaign at `interval_confidence` (AnalysisSettings(confidence=...)); its plain 95% intervals
are narrower still but are not corrected for the looks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy import stats

from analysis.data import GAIN_METRICS
from analysis.stats import ratio_interval
from artifacts import ids, layout
from artifacts.documents import CellMeta, CellSummary
from artifacts.store import read_document
from warehouse.frames import short_hash
from warehouse.kinds.deployments import settings_of

ALPHA_SHARE = 0.5
"""The share of the campaign's alpha (1 - confidence) the adaptive rule's intervals may miss by: half, so a
95% campaign stops on (and reports) 97.5% intervals. Chosen by benchmarks/adaptive_repeats.py: the smallest
round correction whose coverage stays >= 93% in every scenario there, with min >= 3."""


def interval_confidence(confidence: float = 0.95) -> float:
    """The level of the rule's intervals: the campaign's confidence with ALPHA_SHARE of its alpha."""
    return 1.0 - (1.0 - confidence) * ALPHA_SHARE


def report_confidence(spec: Mapping[str, Any], confidence: float = 0.95) -> float:
    """The level a campaign's intervals should be reported at, from its recorded spec (CampaignData.spec):
    interval_confidence for an adaptive campaign (`repeats` a mapping of min, max, target_halfwidth), so the
    report's intervals are the ones the rule stopped on and keep their coverage; `confidence` otherwise."""
    return interval_confidence(confidence) if isinstance(spec.get("repeats"), Mapping) else confidence


class RepeatRule(Protocol):
    """What the rule reads of its settings: AdaptiveRepeats here, or the spec's own model of the same fields
    (experiments.spec), without converting one into the other."""

    @property
    def min(self) -> int: ...
    @property
    def max(self) -> int: ...
    @property
    def target_halfwidth(self) -> float: ...


class AdaptiveRepeats(BaseModel):
    """`repeats: {min, max, target_halfwidth}` in a spec: launch at least `min` and at most `max` repeat
    blocks; stop in between once every interval the decision needs has a log-scale halfwidth at or under
    `target_halfwidth` (0.05: the interval reaches about 5% either side of the speedup estimate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = Field(default=3, ge=3, description="repeat blocks before the first look (>= 3: see module)")
    max: int = Field(default=8, ge=3, description="repeat blocks at most")
    target_halfwidth: float = Field(
        gt=0, le=1, description="log(high / estimate) every decision interval must reach"
    )

    @model_validator(mode="after")
    def _max_at_least_min(self) -> AdaptiveRepeats:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be at least min ({self.min})")
        return self

    def interval_confidence(self, confidence: float = 0.95) -> float:
        """The level of the rule's intervals: the campaign's confidence with half its alpha spent."""
        return interval_confidence(confidence)


@dataclass(frozen=True, order=True)
class Comparison:
    """One interval the decision needs: a speculative variant against plain at one workload and load."""

    variant: str
    workload: str
    load: str  # load label, artifacts.ids.load_label


@dataclass(frozen=True)
class Observations:
    """What the rule reads: the repeat blocks with at least one finished ok cell, and each comparison's
    paired per-repeat ratios (repeat -> speedup, > 1 faster; empty: no pair yet)."""

    metric: str
    repeats: tuple[int, ...]
    ratios: Mapping[Comparison, Mapping[int, float]]

    @property
    def repeats_done(self) -> int:
        return len(self.repeats)

    def restricted_to(self, repeats: Iterable[int]) -> Observations:
        """Only these repeat blocks (the ones finished so far, or the first b of a finished campaign)."""
        keep = set(repeats)
        return Observations(
            metric=self.metric,
            repeats=tuple(r for r in self.repeats if r in keep),
            ratios={c: {r: v for r, v in by.items() if r in keep} for c, by in self.ratios.items()},
        )


@dataclass(frozen=True)
class ComparisonWidth:
    comparison: Comparison
    n: int  # paired repeats
    estimate: float | None  # geometric mean of the ratios (None: no pair)
    halfwidth: float  # log(high / estimate) at the rule's confidence; inf with fewer than 2 pairs


@dataclass(frozen=True)
class RepeatDecision:
    stop: bool
    repeats_done: int
    confidence: float  # the level of the intervals the rule judged (interval_confidence)
    widest: Comparison | None  # the comparison with the widest interval (None: no comparison)
    widest_halfwidth: float | None  # its log-scale halfwidth (inf: fewer than 2 pairs)
    reason: str
    widths: tuple[ComparisonWidth, ...]

    def record(self) -> dict[str, Any]:
        """The decision as the campaign's run record keeps it."""
        return {
            "repeats_done": self.repeats_done,
            "stop": self.stop,
            "confidence": self.confidence,
            "widest": None if self.widest is None else asdict(self.widest),
            "widest_halfwidth": self.widest_halfwidth,
            "reason": self.reason,
        }


def log_halfwidth(ratios: list[float], confidence: float) -> tuple[float | None, float]:
    """(estimate, log-scale halfwidth) of analysis.stats.ratio_interval at `confidence`: inf below 2 pairs,
    0 when every ratio is equal."""
    positive = [r for r in ratios if r > 0 and math.isfinite(r)]
    if not positive:
        return None, math.inf
    interval = ratio_interval(positive, confidence=confidence)
    if interval.n < 2:
        return interval.estimate, math.inf
    return interval.estimate, math.log(interval.high / interval.estimate)


def repeat_decision(
    observations: Observations, rule: RepeatRule, *, confidence: float = 0.95
) -> RepeatDecision:
    """Whether the campaign stops launching repeat blocks, after `observations.repeats_done` of them."""
    level = interval_confidence(confidence)
    widths = []
    for comparison in sorted(observations.ratios):
        by_repeat = observations.ratios[comparison]
        estimate, half = log_halfwidth([by_repeat[r] for r in sorted(by_repeat)], level)
        widths.append(ComparisonWidth(comparison, len(by_repeat), estimate, half))
    done = observations.repeats_done
    widest = max(widths, key=lambda w: w.halfwidth, default=None)
    widest_text = (
        "no comparison"
        if widest is None
        else (
            f"widest {_name(widest.comparison)}: "
            + ("fewer than 2 pairs" if math.isinf(widest.halfwidth) else f"halfwidth {widest.halfwidth:.3f}")
        )
    )

    def decided(stop: bool, reason: str) -> RepeatDecision:
        return RepeatDecision(
            stop=stop,
            repeats_done=done,
            confidence=level,
            widest=None if widest is None else widest.comparison,
            widest_halfwidth=None if widest is None else widest.halfwidth,
            reason=reason,
            widths=tuple(widths),
        )

    if done >= rule.max:
        return decided(True, f"{done} repeats: the maximum ({rule.max}) is reached; {widest_text}")
    if done < rule.min:
        return decided(False, f"{done} of at least {rule.min} repeats; {widest_text}")
    if widest is None:
        return decided(True, f"{done} repeats: no comparison the decision needs (no speculative cells)")
    if widest.halfwidth <= rule.target_halfwidth:
        return decided(
            True,
            f"{done} repeats: every {level:.1%} interval ({len(widths)}) is within the target halfwidth "
            f"{rule.target_halfwidth:g}; {widest_text}",
        )
    wide = sum(w.halfwidth > rule.target_halfwidth for w in widths)
    return decided(
        False,
        f"{done} repeats: {wide} of {len(widths)} {level:.1%} intervals wider than the target halfwidth "
        f"{rule.target_halfwidth:g}; {widest_text}",
    )


def _name(comparison: Comparison) -> str:
    return f"{comparison.variant} {comparison.workload} {comparison.load}"


# ------------------------------------------------------------------------------ reading a raw campaign dir


@dataclass(frozen=True)
class _Cell:
    cell_id: str
    meta: CellMeta
    summary: CellSummary | None  # the latest ok attempt's summary (None: no ok attempt)


def _metric_value(summary: CellSummary, metric: str) -> float | None:
    """The cell's figure behind a gain metric (analysis.data.GAIN_METRICS)."""
    if metric == "throughput":
        return summary.output_throughput_tok_s
    name, quantile = metric.split("_")
    latency = summary.latency_s
    distribution = getattr(latency, name, None) if latency is not None else None
    return getattr(distribution, quantile, None) if distribution is not None else None


def _latest_cells(directory: Path) -> list[_Cell]:
    """Every cell of the campaign with its latest attempt's meta and its latest ok attempt's summary, as
    v_cells chooses them; unreadable attempts and the store's temporaries are skipped."""
    attempts: dict[str, list[tuple[int, Path]]] = {}
    for path in layout.subdirs(layout.cells_dir(directory)):
        parsed = ids.parse_attempt_name(path.name)
        if parsed is not None:
            attempts.setdefault(parsed[0], []).append((parsed[1], path))
    cells = []
    for cell_id, found in sorted(attempts.items()):
        meta, summary = None, None
        for _, path in sorted(found, reverse=True):
            try:
                this_meta = read_document(path / layout.META, CellMeta)
                this_summary = read_document(path / layout.SUMMARY, CellSummary)
            except (OSError, ValueError):
                continue  # an attempt still being written or damaged: the ingest would quarantine it
            meta = meta or this_meta
            if this_summary.status == "ok":
                meta, summary = this_meta, this_summary
                break
        if meta is not None:
            cells.append(_Cell(cell_id, meta, summary))  # type: ignore[arg-type]
    return cells


def _pairing_key(meta: CellMeta) -> tuple:
    """What v_speedup requires equal between a speculative cell and its plain baseline, repeat aside."""
    load = meta.load
    sampling = meta.sampling.as_written() if meta.sampling is not None else {}
    return (
        meta.workload.stratum,
        meta.workload.sha256,
        load.mode,
        load.concurrency,
        load.rate,
        meta.endpoint,
        short_hash(sampling),
        short_hash(settings_of(meta.deployment, meta.variant)),
    )


def campaign_observations(directory: Path, *, metric: str = "throughput") -> Observations:
    """The paired per-repeat speedups of a campaign's finished cells, read from its raw directory
    (RAW/<campaign_id>/): each speculative cell's latest ok attempt against the plain cell (method none, not
    the A/A control) of the same workload, load, endpoint, sampling, engine settings and repeat. Every
    speculative variant x workload x load with a cell (even a failed one) is a comparison the decision needs.
    `metric` is a gain metric of analysis.data.GAIN_METRICS (throughput: spec / plain; latencies: plain /
    spec), so ratios > 1 mean faster, as in v_speedup."""
    if metric not in GAIN_METRICS:
        raise ValueError(f"metric must be one of {', '.join(GAIN_METRICS)}, got {metric!r}")
    cells = _latest_cells(Path(directory))
    baselines: dict[tuple, float] = {}
    repeats: set[int] = set()
    speculative: list[_Cell] = []
    for cell in cells:
        variant = cell.meta.variant
        if cell.summary is not None:
            repeats.add(cell.meta.repeat)
        if (variant.method or "none") == "none":
            if variant.as_written().get("aa_control") or cell.summary is None:
                continue
            value = _metric_value(cell.summary, metric)
            if value is not None and value > 0:
                baselines[(*_pairing_key(cell.meta), cell.meta.repeat)] = value
        else:
            speculative.append(cell)
    ratios: dict[Comparison, dict[int, float]] = {}
    for cell in speculative:
        meta = cell.meta
        load = ids.load_label(meta.load.mode, meta.load.concurrency, meta.load.rate)
        pairs = ratios.setdefault(Comparison(meta.variant.name, meta.workload.stratum, load), {})
        base = baselines.get((*_pairing_key(meta), meta.repeat))
        value = None if cell.summary is None else _metric_value(cell.summary, metric)
        if base is None or value is None or value <= 0:
            continue  # a failed cell, no plain pair, or a latency of 0 s (v_speedup leaves it out too)
        pairs[meta.repeat] = value / base if metric == "throughput" else base / value
    return Observations(metric=metric, repeats=tuple(sorted(repeats)), ratios=ratios)


# ------------------------------------------------------------------------------------ the rule, vectorised


def t_halfwidths(log_ratios: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """(means, halfwidths) of the t intervals of log_ratios[..., :n] for every n = 1..N along the last axis
    (halfwidth inf at n = 1): the same interval as ratio_interval, for many simulated campaigns at once."""
    n = np.arange(1, log_ratios.shape[-1] + 1)
    means = np.cumsum(log_ratios, axis=-1) / n
    squares = np.cumsum(log_ratios**2, axis=-1) - n * means**2
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = np.sqrt(np.maximum(squares, 0.0) / (n - 1))
        quantile = stats.t.ppf(0.5 + confidence / 2, np.maximum(n - 1, 1))
        half = np.where(n >= 2, quantile * sd / np.sqrt(n), np.inf)
    return means, half


def stopping_repeats(
    log_ratios: np.ndarray, rule: RepeatRule, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rule applied to simulated campaigns: log_ratios[campaign, comparison, repeat] (max repeats each).
    Returns (repeats used per campaign, each comparison's final mean log-ratio, its final halfwidth), with
    the intervals at `confidence` (pass rule.interval_confidence(c) for the chosen rule, c for the naive one)."""
    means, half = t_halfwidths(log_ratios[..., : rule.max], confidence)
    widest = half.max(axis=1)  # [campaign, repeat]
    looks = np.arange(1, rule.max + 1)
    narrow = (widest <= rule.target_halfwidth) & (looks >= rule.min)
    narrow[:, rule.max - 1] = True
    used = narrow.argmax(axis=1) + 1
    index = np.broadcast_to((used - 1)[:, None, None], (*log_ratios.shape[:2], 1))
    return used, np.take_along_axis(means, index, -1)[..., 0], np.take_along_axis(half, index, -1)[..., 0]
