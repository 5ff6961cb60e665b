"""Where the embedded engine's start-up goes, per variant and launcher setting, and what each setting does
to the step time once it serves.

Launches every variant of experiments/demo.yaml (and `eagle3-k3` when models/tiny-eagle3 or --eagle-head exists) through
specgauge's own local launcher, once per arm (a way of starting the engine) per round, interleaved: round 1
runs every (arm, variant) once, round 2 again, and so on, so that the machine's drift (15-30% within
minutes on a shared 2-core machine) hits every arm alike. Each start's engine.log is cut into phases by its
own timestamps: process start -> banner -> engine init -> model loaded -> compile/warm-up (and whether the
compile cache was hit) -> KV cache sized -> ready (the readiness check passed). With `--cells`, every start
then runs specgauge's cells (C=1 and C=4, closed loop, on one stratum of the smoke corpus), so an arm that
starts faster but steps slower shows it in the same rounds.

Arms (comma-separated, `--arms`):
  compiled    launcher.compilation "vllm": vLLM's default (on the CPU one Dynamo trace, then Inductor), with
              the compile cache in a directory shared by every start of this run (fresh per run unless
              --cache-root is given: round 1 shows a fresh machine, later rounds a warm cache)
  cached      launcher.compilation "cached": the same compilation, vLLM's AOT cache off, Inductor's cache
              in the run's compile cache directory
  eager       launcher.compilation "eager": --enforce-eager, no torch.compile at all
  apart       "cached" with the worker in a process of its own (launcher.uniprocess_executor off: vLLM's
              default on the CPU, and what every start did before the launcher set
              VLLM_ENABLE_V1_MULTIPROCESSING=0 with "uni")
  configured  the demo's launcher settings as they are, the compile cache where the environment puts it

    .venv/bin/python benchmarks/engine_start.py [--arms compiled,eager] [--variants plain,ngram-k3,draft-k3]
        [--rounds 2] [--cells] [--stratum code] [--requests 8]
    .venv/bin/python benchmarks/engine_start.py --parse var/.../engine.log   # phases of any engine log

Every start takes about a minute on 2 cores; hold /tmp/specgauge-engine.lock if other engine users run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from tempfile import mkdtemp
from typing import Any

from rich.console import Console
from rich.table import Table

from experiments.plan import CellPlan
from experiments.spec import ExperimentSpec, LoadSpec, Variant, load_spec
from specgauge.settings import REPO_ROOT
from tasks.cell import run_cell
from tasks.health import wait_ready
from tasks.launch import deployed
from tasks.launch.local import LocalLauncher
from workloads.schema import load_corpus

# vLLM log lines: "(EngineCore pid=12) INFO 12-01 14:03:07.123 [file.py:12] message" (milliseconds optional).
_STAMP = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR)\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?\s")

# Phase markers, in start-up order: the first line matching each ends that phase (vLLM 0.32 wording).
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("banner", re.compile(r"non-default args")),  # imports done, arguments parsed
    ("engine init", re.compile(r"Initializing a V1 LLM engine")),  # the engine-core process is up
    ("worker up", re.compile(r"Starting to load model")),  # the worker process is up
    ("model loaded", re.compile(r"Loading weights took|Model loading took")),
    ("compiled", re.compile(r"saved AOT compiled function|Directly load AOT compilation")),
    ("warm-up done", re.compile(r"Warming up done")),
    ("KV cache", re.compile(r"KV cache size")),
    ("engine ready", re.compile(r"init engine .*took")),
    ("server up", re.compile(r"Starting vLLM server on|Application startup complete")),
)
_CACHE_HIT = re.compile(r"Directly load AOT compilation")
_CACHE_MISS = re.compile(r"saved AOT compiled function")
_RELOAD_FAILED = re.compile(r"Compiling model again due to a load failure")
_INDUCTOR = re.compile(r"Warming up model for the compilation")  # compiled without an AOT line


@dataclass
class StartPhases:
    """Seconds from process start to the end of each phase (None: the marker never appeared)."""

    marks: dict[str, float | None]
    ready_s: float | None  # the readiness check passed (what a campaign waits for)
    compile_cache: str  # "hit", "miss", "none" (nothing compiled), or "1 hit, 1 miss"

    def durations(self) -> dict[str, float | None]:
        """Each phase's own length: from the previous phase seen to this one."""
        out: dict[str, float | None] = {}
        previous = 0.0
        for name, _ in PHASES:
            at = self.marks.get(name)
            out[name] = None if at is None else max(at - previous, 0.0)
            previous = at if at is not None else previous
        out["readiness check"] = None if self.ready_s is None else max(self.ready_s - previous, 0.0)
        return out


def _stamp(line: str, year: int) -> dt.datetime | None:
    found = _STAMP.search(line)
    if not found:
        return None
    month, day, hour, minute, second, frac = found.groups()
    micro = int((frac or "0").ljust(6, "0")[:6])
    return dt.datetime(year, int(month), int(day), int(hour), int(minute), int(second), micro)


def parse_phases(log_text: str, started: dt.datetime | None, ready_s: float | None = None) -> StartPhases:
    """Cut an engine log into start-up phases. `started` is the process start in local time (what vLLM
    stamps its lines with); without it, the first stamped line counts as 0."""
    year = (started or dt.datetime.now()).year
    origin = started
    marks: dict[str, float | None] = {name: None for name, _ in PHASES}
    for line in log_text.splitlines():
        when = _stamp(line, year)
        if when is None:
            continue
        if origin is None:
            origin = when
        for name, pattern in PHASES:
            if marks[name] is None and pattern.search(line):
                marks[name] = (when - origin).total_seconds()
    hits, misses = len(_CACHE_HIT.findall(log_text)), len(_CACHE_MISS.findall(log_text))
    # Each compiled model (the target, a draft model) is loaded from vLLM's AOT cache or compiled and saved;
    # without AOT, Inductor's own cache is not logged (one_start looks at its directory instead).
    if hits + misses:
        cache = "hit" if not misses else "miss" if not hits else f"{hits} hit, {misses} miss"
        if _RELOAD_FAILED.search(log_text):
            cache += " (found, reload failed)"
    else:
        cache = "inductor" if _INDUCTOR.search(log_text) else "none"
    return StartPhases(marks=marks, ready_s=ready_s, compile_cache=cache)


@dataclass
class Arm:
    name: str
    extra_args: list[str] = field(default_factory=list)  # engine arguments this arm adds
    launcher_update: dict[str, Any] = field(default_factory=dict)  # local launcher settings it changes
    env: dict[str, str] = field(default_factory=dict)


def arms_for(names: list[str], cache_root: Path) -> list[Arm]:
    cache = {"VLLM_CACHE_ROOT": str(cache_root)}
    known = {
        "compiled": Arm("compiled", launcher_update={"compilation": "vllm"}, env=cache),
        "cached": Arm("cached", launcher_update={"compilation": "cached"}, env=cache),
        "eager": Arm("eager", launcher_update={"compilation": "eager"}, env=cache),
        "apart": Arm(
            "apart", launcher_update={"compilation": "cached", "uniprocess_executor": False}, env=cache
        ),
        "configured": Arm("configured"),
    }
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; known: {sorted(known)}")
    return [known[n] for n in names]


def variants_for(spec: ExperimentSpec, names: list[str] | None, head: Path) -> list[Variant]:
    variants = list(spec.variants)
    if (head / "config.json").exists() and not any(v.method == "eagle3" for v in variants):
        variants.append(
            Variant.model_validate({"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": str(head)})
        )
    if names:
        variants = [v for v in variants if v.name in names]
    return variants


@dataclass
class StartResult:
    round: int
    arm: str
    variant: str
    phases: StartPhases
    cells: dict[int, dict[str, Any]]  # concurrency -> cell summary
    load_avg: float


def load_result(line: str) -> StartResult:
    data = json.loads(line)
    data["phases"] = StartPhases(**data["phases"])
    data["cells"] = {int(c): s for c, s in data["cells"].items()}
    return StartResult(**data)


def one_start(
    spec: ExperimentSpec,
    arm: Arm,
    variant: Variant,
    round_number: int,
    *,
    cells: bool,
    stratum: str,
    requests: int,
    work: Path,
) -> StartResult:
    target = spec.target.model_copy(
        update={
            "extra_args": [*spec.target.extra_args, *arm.extra_args],
            "env": {**spec.target.env, **arm.env},
        }
    )
    launcher = LocalLauncher(spec.launcher.model_copy(update=arm.launcher_update))
    directory = work / f"r{round_number}-{arm.name}-{variant.name}"
    inductor_cache = Path(arm.env.get("VLLM_CACHE_ROOT", "/nonexistent")) / "torchinductor" / "fxgraph"
    graphs_before = len(list(inductor_cache.rglob("*"))) if inductor_cache.exists() else 0
    started = dt.datetime.now()  # local time, as vLLM stamps its log
    t0 = time.monotonic()
    summaries: dict[int, dict[str, Any]] = {}
    with deployed(launcher, target, variant, deployment_id=directory.name, directory=directory) as dep:
        wait_ready(dep, launcher, timeout_s=spec.launcher.ready_timeout_s)
        ready_s = time.monotonic() - t0
        if cells:
            corpus = load_corpus(REPO_ROOT / spec.workloads[0].file)
            for concurrency in (1, 4):
                plan = CellPlan(
                    f"{variant.name}.r{round_number}.{stratum}.c{concurrency}",
                    stratum,
                    "closed",
                    concurrency,
                    None,
                    spec.workloads[0].file,
                )
                outcome = run_cell(
                    dep,
                    plan,
                    campaign_id="engine-start",
                    repeat=round_number,
                    corpus=corpus,
                    sampling=spec.sampling,
                    load=LoadSpec(
                        concurrencies=(concurrency,),
                        requests=requests,
                        warmup=2,
                        allow_short_cells=True,  # the first cells after a start, sized as always
                        request_timeout_s=spec.load.request_timeout_s,
                    ),
                    slo=spec.slo,
                    cells_dir=directory / "cells",
                )
                summaries[concurrency] = outcome.summary.model_dump(mode="json")  # as summary.json has it
    log_text = (directory / "engine.log").read_text(errors="replace")
    phases = parse_phases(log_text, started, ready_s)
    if phases.compile_cache == "inductor" and inductor_cache.exists():
        new_graphs = len(list(inductor_cache.rglob("*"))) - graphs_before
        phases.compile_cache = f"inductor miss ({new_graphs} new entries)" if new_graphs else "inductor hit"
    return StartResult(round_number, arm.name, variant.name, phases, summaries, os.getloadavg()[0])


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def print_tables(results: list[StartResult], console: Console) -> None:
    names = [name for name, _ in PHASES] + ["readiness check"]
    starts = Table(title="engine start: seconds in each phase (from the engine log's own timestamps)")
    for column in ("round", "arm", "variant", *names, "ready s", "compile cache", "load avg"):
        starts.add_column(column, justify="right")
    for r in results:
        d = r.phases.durations()
        starts.add_row(
            str(r.round),
            r.arm,
            r.variant,
            *(_fmt(d[n]) for n in names),
            _fmt(r.phases.ready_s),
            r.phases.compile_cache,
            f"{r.load_avg:.1f}",
        )
    console.print(starts)

    groups: dict[tuple[str, str], list[StartResult]] = {}
    for r in results:
        groups.setdefault((r.arm, r.variant), []).append(r)
    medians = Table(title="engine start: median over rounds (s)")
    for column in ("arm", "variant", "n", *names, "ready s"):
        medians.add_column(column, justify="right")
    for (arm, variant), rows in groups.items():
        cols = []
        for n in names:
            vals = [v for r in rows if (v := r.phases.durations()[n]) is not None]
            cols.append(_fmt(median(vals)) if vals else "-")
        ready = [r.phases.ready_s for r in rows if r.phases.ready_s is not None]
        medians.add_row(arm, variant, str(len(rows)), *cols, _fmt(median(ready)) if ready else "-")
    console.print(medians)

    if not any(r.cells for r in results):
        return
    steps = Table(title="serving after the start: same cells, same rounds (TPOT and E2E p50 in ms)")
    for column in (
        "round",
        "arm",
        "variant",
        "C",
        "ok",
        "TPOT p50",
        "E2E p50",
        "tok/s",
        "accept len",
        "burst ok",
    ):
        steps.add_column(column, justify="right")
    for r in results:
        for concurrency, s in sorted(r.cells.items()):
            spec = s.get("speculation") or {}
            lat = s["latency_s"]
            steps.add_row(
                str(r.round),
                r.arm,
                r.variant,
                str(concurrency),
                f"{s['requests']['ok']}/{s['requests']['total']}",
                _fmt(lat["tpot"]["p50"], 1e3, 2),
                _fmt(lat["e2e"]["p50"], 1e3, 0),
                _fmt(s["output_throughput_tok_s"]),
                _fmt(spec.get("mean_acceptance_length"), 1, 2),
                str(s["cross_checks"]["streamed_token_by_token"].get("ok")),
            )
    console.print(steps)


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {os.cpu_count()} cores (nproc "
        f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()}), load average {load}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", default="compiled,eager")
    parser.add_argument("--variants", default=None, help="comma-separated; default: every demo variant")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cells", action="store_true", help="run C=1 and C=4 cells on every start")
    parser.add_argument("--stratum", default="code")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument(
        "--cache-root",
        type=Path,
        default=None,
        help="VLLM_CACHE_ROOT for the compiled and eager arms (default: fresh per run)",
    )
    parser.add_argument(
        "--eagle-head",
        type=Path,
        default=REPO_ROOT / "models" / "tiny-eagle3",
        help="adds eagle3-k3 if it exists",
    )
    parser.add_argument("--parse", type=Path, default=None, help="only print the phases of this engine.log")
    parser.add_argument(
        "--report", type=Path, default=None, help="only print the tables of a run's starts.jsonl"
    )
    args = parser.parse_args()
    console = Console(width=200)
    if args.parse:
        phases = parse_phases(args.parse.read_text(errors="replace"), None)
        console.print(phases.durations(), f"compile cache: {phases.compile_cache}")
        return
    if args.report:
        print_tables([load_result(line) for line in args.report.read_text().splitlines() if line], console)
        return
    spec = load_spec(REPO_ROOT / "experiments" / "demo.yaml")
    work = Path(mkdtemp(prefix="engine-start-"))
    cache_root = args.cache_root or work / "vllm-cache"
    arms = arms_for(args.arms.split(","), cache_root)
    variants = variants_for(spec, args.variants.split(",") if args.variants else None, args.eagle_head)
    console.print(f"machine: {machine_line()}; work dir {work}; compile cache {cache_root}")
    if not any(v.method == "eagle3" for v in variants) and not args.variants:
        console.print(f"no EAGLE-3 head at {args.eagle_head}: the eagle3-k3 variant is left out")
    results: list[StartResult] = []
    for round_number in range(1, args.rounds + 1):
        for variant in variants:
            for arm in arms:  # arms side by side within each variant, so drift hits them alike
                result = one_start(
                    spec,
                    arm,
                    variant,
                    round_number,
                    cells=args.cells,
                    stratum=args.stratum,
                    requests=args.requests,
                    work=work,
                )
                results.append(result)
                with open(work / "starts.jsonl", "a") as out:  # kept as it goes: a long run may be cut short
                    out.write(json.dumps(asdict(result), default=str) + "\n")
                console.print(
                    f"r{round_number} {arm.name} {variant.name}: ready after "
                    f"{_fmt(result.phases.ready_s)} s, compile cache {result.phases.compile_cache}"
                )
    print_tables(results, console)
    console.print(f"machine at the end: {machine_line()}")


if __name__ == "__main__":
    main()
