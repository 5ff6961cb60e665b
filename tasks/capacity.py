"""Capacity search (Q5): the highest open-loop request rate at which a deployment meets the spec's p99 TTFT and
TPOT limits, found by a ramp and then a bisection on the rate, each point judged with a stated confidence.

A point is a normal open-loop cell (seeded Poisson arrivals) at one rate. Its p99 is judged by order
statistics, as MLPerf's early-stopping rule does: with n latencies sorted, x(j) is an upper confidence bound
of the quantile q at confidence c when P(Binomial(n, q) <= j - 1) >= c, and x(i) a lower one when
P(Binomial(n, q) >= i) >= c. A point *meets* a limit when the upper bound is within it, *violates* it when the
lower bound is above it, and is *undecided* otherwise (too few requests, or a p99 too close to the limit);
an undecided point counts as not meeting the limits (capacity is claimed only with its confidence). A failed
request counts as an infinite latency. Each point runs at least `min_requests(q, c)` requests, the fewest
for which an upper bound exists (299 for p99 at 95%).

The search: from `start_rps`, multiply the rate by `growth` while points meet the limits (divide while they
do not, down to `min_rps`); then bisect (geometric midpoint) between the highest rate that met them and the
lowest that did not, until their ratio is within 1 + `precision` or `max_points` have run. Rates are rounded
to three significant figures, so a resumed search proposes the same points and reuses the cells it has.
The search is a plain function of the measured points (`run_search` takes the measurement as a callable);
`search_deployment` runs it on a deployment, each point a cell of the campaign.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl
from scipy.stats import binom

from artifacts import ids, layout
from artifacts.store import read_json, write_json_atomic
from experiments.plan import CellPlan, SearchPlan
from experiments.spec import CapacitySpec, ExperimentSpec
from specgauge.provenance import tool_facts, utc_now
from tasks.campaign_state import cell_done
from tasks.launch.base import Deployment
from workloads.schema import Corpus

Verdict = Literal["met", "violated", "undecided"]


def min_requests(quantile: float, confidence: float) -> int:
    """The fewest latencies for which the largest is an upper confidence bound of the quantile."""
    return math.ceil(math.log(1 - confidence) / math.log(quantile))


def order_statistic_bounds(n: int, quantile: float, confidence: float) -> tuple[int | None, int | None]:
    """1-based ranks (lower, upper) of the order statistics that bound the `quantile` of n samples at
    `confidence` each (one-sided); None where n is too small for that side."""
    if n <= 0:
        return None, None
    # B ~ Binomial(n, q) counts the samples below the quantile. binom.ppf(p) is the smallest k with
    # P(B <= k) >= p. upper: the smallest j with P(B <= j-1) >= c. lower: the largest i with P(B >= i) >= c,
    # i.e. P(B <= i-1) <= 1-c: one below the smallest k with P(B <= k) > 1-c.
    upper = int(binom.ppf(confidence, n, quantile)) + 1
    lower = int(binom.ppf(1 - confidence, n, quantile))
    if binom.cdf(lower, n, quantile) <= 1 - confidence:  # ppf's k sits exactly on 1-c: it is still below
        lower += 1
    return (lower if lower >= 1 else None), (upper if upper <= n else None)


@dataclass(frozen=True)
class Limits:
    ttft_s: float
    tpot_s: float
    quantile: float = 0.99
    confidence: float = 0.95


@dataclass(frozen=True)
class Bound:
    """One metric's quantile at a point: observed, its confidence bounds (None: not enough requests), verdict."""

    observed: float | None
    lower: float | None
    upper: float | None
    limit: float
    verdict: Verdict


def judge_metric(values: Sequence[float], failed: int, limit: float, limits: Limits) -> Bound:
    samples = sorted([*values, *([math.inf] * failed)])
    n = len(samples)
    if n == 0:
        return Bound(None, None, None, limit, "undecided")
    lower_rank, upper_rank = order_statistic_bounds(n, limits.quantile, limits.confidence)
    lower = samples[lower_rank - 1] if lower_rank else None
    upper = samples[upper_rank - 1] if upper_rank else None
    observed = samples[min(n - 1, max(0, math.ceil(limits.quantile * n) - 1))]
    if upper is not None and upper <= limit:
        verdict: Verdict = "met"
    elif lower is not None and lower > limit:
        verdict = "violated"
    else:
        verdict = "undecided"
    return Bound(
        None if math.isinf(observed) else observed,
        None if lower is None or math.isinf(lower) else lower,
        None if upper is None or math.isinf(upper) else upper,
        limit,
        verdict,
    )


@dataclass(frozen=True)
class Point:
    """One measured rate of a search."""

    rate: float
    cell_id: str
    requests: int
    failed: int
    achieved_rps: float | None
    goodput_rps: float | None
    ttft: Bound
    tpot: Bound
    status: str = "ok"  # the cell's status; a failed cell meets nothing

    @property
    def verdict(self) -> Verdict:
        verdicts = {self.ttft.verdict, self.tpot.verdict}
        if self.status != "ok" or "violated" in verdicts:
            return "violated"
        return "met" if verdicts == {"met"} else "undecided"

    @property
    def meets(self) -> bool:
        return self.verdict == "met"


def judge_point(
    rate: float,
    cell_id: str,
    ttft_s: Sequence[float],
    tpot_s: Sequence[float],
    failed: int,
    limits: Limits,
    *,
    achieved_rps: float | None = None,
    goodput_rps: float | None = None,
    status: str = "ok",
) -> Point:
    """A point from its successful requests' TTFTs and TPOTs (a request of one token has no TPOT) and its
    failed requests' count."""
    return Point(
        rate=rate,
        cell_id=cell_id,
        requests=len(ttft_s) + failed,
        failed=failed,
        achieved_rps=achieved_rps,
        goodput_rps=goodput_rps,
        ttft=judge_metric(ttft_s, failed, limits.ttft_s, limits),
        tpot=judge_metric(tpot_s, failed, limits.tpot_s, limits),
        status=status,
    )


@dataclass(frozen=True)
class SearchSettings:
    start_rps: float = 1.0
    min_rps: float = 0.05
    max_rps: float = 256.0
    growth: float = 2.0
    precision: float = 0.1
    max_points: int = 10


def round_rate(rate: float) -> float:
    """Three significant figures: the same search proposes the same rates, run after run."""
    return float(f"{rate:.3g}")


def bracket(points: Sequence[Point]) -> tuple[float | None, float | None]:
    """(highest rate that met the limits below every rate that did not, lowest rate that did not)."""
    failing = [p.rate for p in points if not p.meets]
    high = min(failing) if failing else None
    passing = [p.rate for p in points if p.meets and (high is None or p.rate < high)]
    return (max(passing) if passing else None), high


def next_rate(points: Sequence[Point], settings: SearchSettings) -> float | None:
    """The next rate to measure, or None when the search is over."""
    if not points:
        return round_rate(settings.start_rps)
    if len(points) >= settings.max_points:
        return None
    low, high = bracket(points)
    if high is None:  # everything met so far: ramp up
        if low is not None and low >= settings.max_rps:
            return None
        return round_rate(min(settings.max_rps, (low or settings.start_rps) * settings.growth))
    if low is None:  # nothing met yet: ramp down
        if high <= settings.min_rps:
            return None
        return round_rate(max(settings.min_rps, high / settings.growth))
    if high / low <= 1 + settings.precision:
        return None
    middle = round_rate(math.sqrt(low * high))
    if middle in (low, high):  # rounding leaves nothing between them
        return None
    return middle


@dataclass
class SearchResult:
    """What a search found: the capacity (the highest rate that met the limits with every rate below it that
    was measured), the lowest rate that did not, and every point in the order it ran."""

    limits: Limits
    settings: SearchSettings
    points: list[Point] = field(default_factory=list)

    @property
    def capacity_rps(self) -> float | None:
        return bracket(self.points)[0]

    @property
    def first_failing_rps(self) -> float | None:
        return bracket(self.points)[1]

    @property
    def converged(self) -> bool:
        low, high = bracket(self.points)
        return low is not None and high is not None and high / low <= 1 + self.settings.precision

    @property
    def stopped_because(self) -> str:
        low, high = bracket(self.points)
        if self.converged:
            return f"bracketed within {self.settings.precision:.0%}"
        if high is None and low is not None and low >= self.settings.max_rps:
            return f"met the limits up to max_rps ({self.settings.max_rps:g}): capacity is at least that"
        if low is None and high is not None and high <= self.settings.min_rps:
            return f"missed the limits down to min_rps ({self.settings.min_rps:g})"
        if len(self.points) >= self.settings.max_points:
            return f"max_points ({self.settings.max_points}) reached before the bracket closed"
        return "rounding left no rate between the bracket's ends"

    def as_dict(self) -> dict[str, Any]:
        return {
            "limits": asdict(self.limits),
            "settings": asdict(self.settings),
            "capacity_rps": self.capacity_rps,
            "first_failing_rps": self.first_failing_rps,
            "converged": self.converged,
            "stopped_because": self.stopped_because,
            "points": [{**asdict(p), "verdict": p.verdict} for p in self.points],
        }


def run_search(
    measure: Callable[[float], Point],
    limits: Limits,
    settings: SearchSettings,
    on_point: Callable[[Point], None] | None = None,
) -> SearchResult:
    """Measure points (`measure(rate)`) until `next_rate` says the search is over."""
    result = SearchResult(limits, settings)
    while (rate := next_rate(result.points, settings)) is not None:
        point = measure(rate)
        result.points.append(point)
        if on_point is not None:
            on_point(point)
    return result


# -- on a deployment: each point a cell of the campaign ----------------------------------------------------------
def point_from_cell(rate: float, cell_id: str, cell_dir: Path, limits: Limits) -> Point:
    """Judge a point from its cell's artifact (measured requests; the summary's rates)."""
    requests = pl.read_parquet(cell_dir / layout.REQUESTS).filter(pl.col("phase") == "measured")
    good = requests.filter(pl.col("ok"))
    summary = read_json(cell_dir / layout.SUMMARY)
    return judge_point(
        rate,
        cell_id,
        good["ttft_s"].drop_nulls().to_list(),
        good["tpot_s"].drop_nulls().to_list(),
        requests.height - good.height,
        limits,
        achieved_rps=summary.get("request_throughput_rps"),
        goodput_rps=(summary.get("goodput") or {}).get("rate_rps"),
        status=summary.get("status", "failed"),
    )


def limits_of(spec: ExperimentSpec) -> Limits:
    assert spec.capacity is not None
    return Limits(spec.slo.ttft_p99_s, spec.slo.tpot_p99_s, spec.capacity.quantile, spec.capacity.confidence)


def search_settings(capacity: CapacitySpec) -> SearchSettings:
    return SearchSettings(
        capacity.start_rps,
        capacity.min_rps,
        capacity.max_rps,
        capacity.growth,
        capacity.precision,
        capacity.max_points,
    )


class EngineGone(Exception):
    """The engine died during a point: the search stops unwritten, to resume on the next launch."""


def search_deployment(
    deployment: Deployment,
    search: SearchPlan,
    spec: ExperimentSpec,
    *,
    campaign_id: str,
    repeat: int,
    corpus: Corpus,
    directory: Path,
    alive: Callable[[], bool | None],
    on_point: Callable[[Point], None] | None = None,
) -> Path:
    """Run a deployment's capacity search (its points are the campaign's cells, reused when a run resumes)
    and write its immutable record, capacity/<search_id>.json. Raises EngineGone if the engine dies."""
    from tasks.cell import run_cell  # the load path; the search logic above imports none of it

    capacity = spec.capacity
    assert capacity is not None
    limits = limits_of(spec)
    n = capacity.requests or min_requests(capacity.quantile, capacity.confidence)
    load = spec.load.model_copy(update={"requests": n, "warmup": capacity.warmup})
    grid = set(spec.load.rates)
    cells = layout.cells_dir(directory)
    started = utc_now()

    def measure(rate: float) -> Point:
        if rate in grid:  # a rate-grid cell has the grid's request count: the search's point is its own
            rate = float(f"{rate * 1.001:.4g}")
        cell = CellPlan(
            ids.cell_id(deployment.variant.name, repeat, search.workload, ids.load_label("open", None, rate)),
            search.workload,
            "open",
            None,
            rate,
            search.corpus_file,
        )
        if not cell_done(directory, cell):  # a resumed search reuses the points it has
            outcome = run_cell(
                deployment,
                cell,
                campaign_id=campaign_id,
                repeat=repeat,
                corpus=corpus,
                sampling=spec.sampling_of(deployment.variant),
                load=load,
                slo=spec.slo,
                cells_dir=cells,
                seed=spec.seed,
            )
            if outcome.status != "ok" and alive() is False:
                raise EngineGone(f"the engine died during {cell.cell_id}")
        return point_from_cell(rate, cell.cell_id, layout.cell_attempts(cells, cell.cell_id)[-1], limits)

    result = run_search(measure, limits, search_settings(capacity), on_point)
    record = {
        "search_id": search.search_id,
        "campaign_id": campaign_id,
        "deployment_id": deployment.id,
        "variant": deployment.variant.model_dump(mode="json"),
        "repeat": repeat,
        "workload": {"file": search.corpus_file, "sha256": corpus.sha256, "stratum": search.workload},
        "sampling": spec.sampling_of(deployment.variant).model_dump(mode="json"),
        "requests_per_point": n,
        "warmup_per_point": capacity.warmup,
        **result.as_dict(),
        "tool": tool_facts(),
        "started_utc": started,
        "ended_utc": utc_now(),
    }
    path = layout.search_file(directory, search.search_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    return path
