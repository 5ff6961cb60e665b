"""How far two launches of the embedded engine differ, per launcher setting (an arm), and what each setting does
to speculation's speedup over plain.

Arms are LocalLaunchSpec settings (tasks/launch/cpu_runtime.py): the OpenMP runtime, its wait policy, where the
engine's threads run, huge pages. Every round launches each arm's plain target once, in a shuffled order (and
the speculative variant in the first `--spec-rounds` rounds), so the machine's drift hits every arm alike. Each
launch is warmed at every load it is measured at, then runs `--cells` closed-loop cells per load, loads
interleaved (C 1, 4, 16, 1, 4, 16): the spread of cells inside one launch (within-launch CV) and of the launches'
means (between-launch CV) come apart. A cell measures 4 x C requests after a warm-up of C.

Per arm and load: between-launch CV of plain's output throughput (sample standard deviation of the launch
means over their mean), within-launch CV (pooled), the mean, the speculative variant's speedup over plain
(ratio of the launch means' geometric means with a 95% Welch t interval on the logs), the cells' achieved
concurrency, the other processes' and the hypervisor's (steal) shares of the CPU, and the engine's huge pages.

    .venv/bin/python benchmarks/launch_spread.py --arms today,pin-intel --launches 6 [--loads 1,4,16]
        [--spec-variant ngram-k3 --spec-rounds 3 --spec-loads 1] [--max-tokens 32] [--cells 2]
    .venv/bin/python benchmarks/launch_spread.py --report /tmp/launch-spread-XXXX/launches.jsonl

The target is experiments/decision.yaml's (the cost twin, code stratum). Hold the machine quiet while it runs:
it measures the noise that everything else adds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy import stats

from experiments.plan import CellPlan
from experiments.spec import ExperimentSpec, LoadSpec, Variant, load_spec
from specgauge.settings import REPO_ROOT
from tasks.cell import run_cell
from tasks.health import wait_ready
from tasks.launch import deployed
from tasks.launch.local import LocalLauncher
from workloads.schema import load_corpus

# launcher settings per arm (LocalLaunchSpec fields); "today" is the launcher as it was before issue 40
ARMS: dict[str, dict[str, Any]] = {
    "today": {"openmp": "gnu", "omp_wait_policy": "runtime", "cpu_binding": "none", "huge_pages": False},
    "passive": {"openmp": "gnu", "omp_wait_policy": "passive", "cpu_binding": "none"},
    "intel": {"openmp": "intel", "omp_wait_policy": "runtime", "cpu_binding": "none"},
    "pin": {"openmp": "gnu", "omp_wait_policy": "runtime", "cpu_binding": "pin"},
    "pin-passive": {"openmp": "gnu", "omp_wait_policy": "passive", "cpu_binding": "pin"},
    "pin-intel": {"openmp": "intel", "omp_wait_policy": "runtime", "cpu_binding": "pin"},
    "vllm-bind": {"openmp": "gnu", "omp_wait_policy": "runtime", "cpu_binding": "vllm"},
    "vllm-intel": {"openmp": "intel", "omp_wait_policy": "runtime", "cpu_binding": "vllm"},
    "hugepages": {"openmp": "gnu", "omp_wait_policy": "runtime", "cpu_binding": "none", "huge_pages": True},
    "pin-intel-huge": {
        "openmp": "intel",
        "omp_wait_policy": "runtime",
        "cpu_binding": "pin",
        "huge_pages": True,
    },
}


@dataclass
class CellResult:
    load: int
    index: int  # the cell's place among this launch's cells at this load
    status: str
    throughput: float | None
    achieved_concurrency: float | None
    other_share: float | None
    steal_share: float | None


@dataclass
class LaunchResult:
    round: int
    arm: str
    variant: str
    ready_s: float
    cells: list[CellResult]
    runtime: dict[str, Any] = field(default_factory=dict)
    load_avg: float = 0.0


def short_corpus(spec: ExperimentSpec, stratum: str, max_tokens: int | None, work: Path) -> Path:
    """The spec's workload file, this stratum only, each prompt's max_tokens capped (shorter cells)."""
    source = REPO_ROOT / spec.workloads[0].file
    out = work / "workload.jsonl"
    with open(out, "w") as sink:
        for line in source.read_text().splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            item = json.loads(line)
            if item["workload"] != stratum:
                continue
            if max_tokens:
                item["max_tokens"] = min(int(item["max_tokens"]), max_tokens)
            sink.write(json.dumps(item) + "\n")
    return out


def one_launch(
    spec: ExperimentSpec, arm: str, variant: Variant, round_number: int, args: argparse.Namespace, work: Path
) -> LaunchResult:
    launcher = LocalLauncher(spec.launcher.model_copy(update=ARMS[arm]))
    directory = work / f"r{round_number}-{arm}-{variant.name}"
    corpus_file = work / "workload.jsonl"
    corpus = load_corpus(corpus_file)
    loads = args.spec_loads if variant.method != "none" else args.loads
    t0 = time.monotonic()
    cells: list[CellResult] = []
    with deployed(
        launcher, spec.target_of(variant), variant, deployment_id=directory.name, directory=directory
    ) as dep:
        wait_ready(dep, launcher, timeout_s=spec.launcher.ready_timeout_s)
        ready_s = time.monotonic() - t0
        launcher.collect_facts(dep)  # binds the threads (pin)
        for index in range(args.cells):
            for concurrency in loads:
                plan = CellPlan(
                    f"{variant.name}.r{round_number}.{args.stratum}.c{concurrency}",
                    args.stratum,
                    "closed",
                    concurrency,
                    None,
                    str(corpus_file),
                )
                # the first pass over the loads warms each one with a whole cell's worth of requests
                warmup = concurrency * (args.first_warmup if index == 0 else 1)
                outcome = run_cell(
                    dep,
                    plan,
                    campaign_id="launch-spread",
                    repeat=round_number,
                    corpus=corpus,
                    sampling=spec.sampling,
                    load=LoadSpec(
                        concurrencies=(concurrency,),
                        requests=4 * concurrency,
                        warmup=warmup,
                        request_timeout_s=spec.load.request_timeout_s,
                    ),
                    slo=spec.slo,
                    cells_dir=directory / "cells",
                )
                summary = outcome.summary
                host = summary.host
                fill = summary.achieved_concurrency  # tasks.metrics.summary's figure
                cells.append(
                    CellResult(
                        concurrency,
                        index,
                        summary.status,
                        summary.output_throughput_tok_s,
                        fill,
                        host.other_share if host else None,
                        host.steal_share if host else None,
                    )
                )
        runtime = dict(dep.extra.get("cpu_runtime") or {})
        if launcher.spec.huge_pages:
            from tasks.launch.cpu_runtime import huge_page_kib

            runtime["anon_huge_pages_kib_after"] = huge_page_kib(dep.pid) if dep.pid else None
    return LaunchResult(round_number, arm, variant.name, ready_s, cells, runtime, os.getloadavg()[0])


def load_results(path: Path) -> list[LaunchResult]:
    results = []
    for line in path.read_text().splitlines():
        if not line:
            continue
        data = json.loads(line)
        data["cells"] = [CellResult(**c) for c in data["cells"]]
        results.append(LaunchResult(**data))
    return results


# -- statistics ----------------------------------------------------------------------------------------------
def launch_means(results: list[LaunchResult], arm: str, variant: str, load: int) -> list[list[float]]:
    """Per launch of (arm, variant), the throughputs of its ok cells at this load."""
    out = []
    for r in results:
        if r.arm == arm and r.variant == variant:
            values = [c.throughput for c in r.cells if c.load == load and c.status == "ok" and c.throughput]
            if values:
                out.append(values)
    return out


def between_cv(per_launch: list[list[float]]) -> float | None:
    means = [float(np.mean(v)) for v in per_launch]
    return float(np.std(means, ddof=1) / np.mean(means)) if len(means) >= 2 else None


def within_cv(per_launch: list[list[float]]) -> float | None:
    """Pooled within-launch standard deviation over the grand mean."""
    groups = [v for v in per_launch if len(v) >= 2]
    if not groups:
        return None
    dof = sum(len(v) - 1 for v in groups)
    pooled = sum(float(np.var(v, ddof=1)) * (len(v) - 1) for v in groups) / dof
    return math.sqrt(pooled) / float(np.mean([x for v in per_launch for x in v]))


def speedup(
    spec_launches: list[list[float]], plain_launches: list[list[float]]
) -> tuple[float, float, float] | None:
    """Geometric-mean ratio of launch means with a 95% Welch t interval on the logs."""
    a = np.log([np.mean(v) for v in spec_launches])
    b = np.log([np.mean(v) for v in plain_launches])
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    diff, se = a.mean() - b.mean(), math.sqrt(va + vb)
    dof = (va + vb) ** 2 / ((va**2) / (len(a) - 1) + (vb**2) / (len(b) - 1)) if va + vb > 0 else 1.0
    t = float(stats.t.ppf(0.975, dof))
    return math.exp(diff), math.exp(diff - t * se), math.exp(diff + t * se)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def print_tables(results: list[LaunchResult], spec_variant: str | None, console: Console) -> None:
    arms = list(dict.fromkeys(r.arm for r in results))
    loads = sorted({c.load for r in results if r.variant == "plain" for c in r.cells})
    table = Table(title="launch spread: plain's output throughput per arm and load (tok/s)")
    for column in (
        "arm",
        "C",
        "launches",
        "between-launch CV",
        "within-launch CV",
        "mean tok/s",
        f"{spec_variant} speedup",
        "achieved C",
        "other CPU",
        "steal",
    ):
        table.add_column(column, justify="right")
    for arm in arms:
        for load in loads:
            plain = launch_means(results, arm, "plain", load)
            if not plain:
                continue
            cells = [
                c for r in results if r.arm == arm and r.variant == "plain" for c in r.cells if c.load == load
            ]
            ratio = None
            if spec_variant:
                spec_runs = launch_means(results, arm, spec_variant, load)
                ratio = speedup(spec_runs, plain) if spec_runs else None
            table.add_row(
                arm,
                str(load),
                str(len(plain)),
                _pct(between_cv(plain)),
                _pct(within_cv(plain)),
                f"{np.mean([np.mean(v) for v in plain]):.1f}",
                "-" if ratio is None else f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]",
                "-" if (a := _mean([c.achieved_concurrency for c in cells])) is None else f"{a:.2f}",
                _pct(_mean([c.other_share for c in cells])),
                _pct(_mean([c.steal_share for c in cells])),
            )
    console.print(table)
    launches = Table(title="each launch: ready s, plain or speculative tok/s per load (cells in order)")
    for column in ("round", "arm", "variant", "ready s", "tok/s per load", "load avg", "runtime"):
        launches.add_column(column)
    for r in results:
        per_load = "; ".join(
            f"C{load}: "
            + ", ".join(
                f"{c.throughput:.1f}" if c.throughput else c.status for c in r.cells if c.load == load
            )
            for load in sorted({c.load for c in r.cells})
        )
        bound = r.runtime.get("bound")
        launches.add_row(
            str(r.round),
            r.arm,
            r.variant,
            f"{r.ready_s:.0f}",
            per_load,
            f"{r.load_avg:.2f}",
            f"{r.runtime.get('label', '')}{' bound ' + json.dumps(bound) if bound else ''}",
        )
    console.print(launches)


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {os.cpu_count()} cores, load average {load}"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", default="today,pin-intel", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--launches", type=int, default=6, help="plain launches per arm (rounds)")
    parser.add_argument("--loads", type=_ints, default=[1, 4, 16])
    parser.add_argument("--cells", type=int, default=2, help="measured cells per load per launch")
    parser.add_argument(
        "--first-warmup", type=int, default=4, help="x C warm-up requests before the first cell"
    )
    parser.add_argument("--spec-variant", default="ngram-k3", help="a variant of the spec; '' for none")
    parser.add_argument(
        "--spec-rounds", type=int, default=3, help="rounds that also launch the speculative variant"
    )
    parser.add_argument("--spec-loads", type=_ints, default=[1])
    parser.add_argument("--stratum", default="code")
    parser.add_argument(
        "--max-tokens", type=int, default=32, help="cap each prompt's max_tokens (shorter cells)"
    )
    parser.add_argument("--spec", type=Path, default=REPO_ROOT / "experiments" / "decision.yaml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", type=Path, default=None, help="only print the tables of a launches.jsonl")
    args = parser.parse_args()
    console = Console(width=220)
    spec = load_spec(args.spec)
    if args.report:
        print_tables(load_results(args.report), args.spec_variant or None, console)
        return
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    arms = args.arms.split(",")
    variants = {v.name: v for v in spec.variants}
    plain = next(v for v in spec.variants if v.method == "none")
    chosen = variants.get(args.spec_variant) if args.spec_variant else None
    if args.spec_variant and chosen is None:
        raise SystemExit(
            f"--spec-variant {args.spec_variant!r} is not in {args.spec} ({', '.join(variants)})"
        )
    work = Path(mkdtemp(prefix="launch-spread-"))
    short_corpus(spec, args.stratum, args.max_tokens, work)
    console.print(f"machine: {machine_line()}; work dir {work}; arms {arms}; loads {args.loads}")
    rng = random.Random(args.seed)
    results: list[LaunchResult] = []
    for round_number in range(1, args.launches + 1):
        order = [(arm, plain) for arm in arms]
        if chosen is not None and round_number <= args.spec_rounds:
            order += [(arm, chosen) for arm in arms]
        rng.shuffle(order)
        for arm, variant in order:
            result = one_launch(spec, arm, variant, round_number, args, work)
            results.append(result)
            with open(work / "launches.jsonl", "a") as out:  # kept as it goes: a long run may be cut short
                out.write(json.dumps(asdict(result), default=str) + "\n")
            console.print(
                f"r{round_number} {arm} {variant.name}: ready {result.ready_s:.0f} s; "
                + ", ".join(
                    f"C{c.load} {c.throughput or 0:.1f} (fill {c.achieved_concurrency or 0:.2f})"
                    for c in result.cells
                )
            )
    print_tables(results, chosen.name if chosen else None, console)
    console.print(f"machine at the end: {machine_line()}; launches in {work / 'launches.jsonl'}")


if __name__ == "__main__":
    main()
