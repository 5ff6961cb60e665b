"""What a campaign plan will cost before it runs: launches, cells, requests, and a time estimate taken from
the warehouse's own past runs on the same kind of launcher (never from constants: with no history there is
no estimate, and `specgauge campaign plan` says so).

The estimate is start-ups plus requests: each launch costs the median readiness time of past launches;
each cell costs its requests (warm-up included) times the median seconds per request of past cells at the
nearest concurrency (open-loop cells: at concurrency 1, a rate's requests arrive one by one at best); each
capture costs its prompts at concurrency 1. It ignores what changes with the method and the workload, and
leaves out a cold compile cache, the profiler's trace writing, ingest and the report, so it reads as "about"
and the plan prints the history it came from. Checked against two campaigns on this 2-core machine
(2026-12-01, history: the fresh-clone demo's own warehouse, 9 launches, median start 54 s): the demo
estimated 19 min, took 25.5 min from a fresh clone (cold compile cache); the tests' campaign estimated 10 min,
took 12.4-13.9 min; experiments/depth-load.yaml estimated 25 min, took 27 min 14 s (2026-12-02, warm
compile cache) and, as the n-gram sweep of today, 25 min 39 s. Real campaigns ran 1.03-1.35x the estimate."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from experiments.plan import CampaignPlan
from experiments.spec import ExperimentSpec


@dataclass(frozen=True)
class PlanSize:
    launches: int  # every deployment, plus the profiled one
    arm_launches: int
    control_launches: int
    profiled_launches: int
    cells: int
    requests: int  # measured, over all cells
    warmup: int
    captures: int
    capture_prompts: int  # over all captures


@dataclass(frozen=True)
class History:
    """Past runs on one launcher kind, from the warehouse."""

    launcher: str
    launches: int
    start_s: float | None  # median readiness time
    cells: int
    request_s: dict[int, float]  # concurrency -> median of a cell's measured wall time per measured request


def plan_size(plan: CampaignPlan, spec: ExperimentSpec) -> PlanSize:
    cells = plan.cells()
    prompts = 0
    if plan.gate is not None:
        corpus = plan.corpora.get(spec.capture.corpus)
        n = len(corpus.prompts) if corpus is not None else 0
        prompts = min(n, spec.capture.limit) if spec.capture.limit else n
    captures = sum(len(d.captures) for d in plan.deployments)
    profiled = 1 if spec.profile is not None else 0
    return PlanSize(
        launches=len(plan.deployments) + profiled,
        arm_launches=sum(d.role == "arm" for d in plan.deployments),
        control_launches=sum(d.role == "control" for d in plan.deployments),
        profiled_launches=profiled,
        cells=len(cells),
        requests=sum(spec.load.requests_at(c.concurrency) for _, c in cells),
        warmup=sum(spec.load.warmup_at(c.concurrency) for _, c in cells),
        captures=captures,
        capture_prompts=captures * prompts,
    )


def history_from(con: Any, launcher: str) -> History:
    """Past launches and ok cells of this launcher kind in a warehouse (a DuckDB connection)."""
    launches, start_s = con.execute(
        "SELECT count(*), median(ready_s) FROM deployments WHERE launcher = ? AND ready_s IS NOT NULL",
        [launcher],
    ).fetchone()
    rows = con.execute(
        "SELECT concurrency, median(wall_s / requests_total), count(*) "
        "FROM v_cells WHERE launcher = ? AND load_mode = 'closed' AND wall_s > 0 AND requests_total > 0 "
        "GROUP BY concurrency",
        [launcher],
    ).fetchall()
    return History(
        launcher=launcher,
        launches=int(launches or 0),
        start_s=float(start_s) if start_s is not None else None,
        cells=sum(int(n) for _, _, n in rows),
        request_s={int(c): float(s) for c, s, _ in rows if c is not None and s is not None},
    )


def _per_request(history: History, concurrency: int | None) -> float:
    """Seconds per request at the past concurrency nearest to this one (in log scale)."""
    target = concurrency or 1
    nearest = min(history.request_s, key=lambda c: abs(math.log(c) - math.log(target)))
    return history.request_s[nearest]


def estimate_seconds(plan: CampaignPlan, spec: ExperimentSpec, history: History) -> float | None:
    """About how long the plan takes on this launcher, or None without the history to say."""
    if history.start_s is None or not history.request_s:
        return None
    size = plan_size(plan, spec)
    seconds = size.launches * history.start_s
    for _, cell in plan.cells():
        per_cell = spec.load.requests_at(cell.concurrency) + spec.load.warmup_at(cell.concurrency)
        seconds += per_cell * _per_request(history, cell.concurrency)
    seconds += size.capture_prompts * _per_request(history, 1)
    if spec.profile is not None:
        seconds += (spec.profile.requests + spec.profile.warmup) * _per_request(
            history, spec.profile.concurrency
        )
    return seconds
