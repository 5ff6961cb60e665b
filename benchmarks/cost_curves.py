"""What orchestration costs as a campaign grows: plan, run overhead, ingest and analysis against its cells.

For each size (cells) and each launcher it runs a real campaign through the campaign flow (`campaign` in
flows/campaign.py, as `specgauge campaign run` does, each in a fresh process with its own Prefect API and
SPECGAUGE_HOME) with the smallest windows there are: one measured request per cell, no warm-up, one
completion token, plain only (no capture, gate, A/A arm or client calibration). The engine is the in-repo
emulator behind the stand-in that takes vLLM's command line (tests/reliability_support.py), started by the
local launcher ("emulator") or as a job of the repo's single-node SLURM over its sshd
(tests/services, tests/stand_ins/cluster.py: "slurm"). Then, in that process, it ingests the campaign and
analyses it.

Each phase is timed from the campaign's own records:
- plan: reading the spec, expanding the plan and writing campaign.json (timed around those calls);
- run overhead: the flow's wall time less every cell's measured window (summary.json `wall_s`) and every
  engine start (deployment.json `ready_s`): Prefect's task and flow runs, health gates, scrapes, gauge
  sampling, artifact writes, teardown (and the plan, which is subtracted);
- ingest: `ingest_raw` of the campaign into a fresh warehouse (as `specgauge ingest`);
- analysis: `analyze_campaign` (read, compute, store, charts, report) as `specgauge analyze`.

A size given with --synthetic (10,000 by default) is not run: its raw tree is generated
(tests/warehouse_fixtures.py, as benchmarks/warehouse_bench.py does, 2 requests per cell) and only plan,
ingest and analysis are measured; its run overhead is extrapolated from the per-cell overhead of the largest
real run of each launcher, and marked so.

    .venv/bin/python benchmarks/cost_curves.py [--sizes 10,100,1000] [--synthetic 10000]
        [--launchers emulator,slurm] [--chart docs/img/cost-curves.png] [--workdir DIR]

The slurm launcher needs the test cluster (tests/services/{sshd,slurm}.sh; started here when root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
LAUNCHERS = ("emulator", "slurm")
SSH_BLOCK, CLUSTER_BLOCK = "cost-curves-ssh", "cost-curves-slurm"
COLUMNS = (
    "launcher",
    "cells",
    "deployments",
    "plan s",
    "run overhead s",
    "per cell s",
    "ingest s",
    "analysis s",
    "source",
)


def shape(cells: int) -> tuple[int, int, int]:
    """(repeats, strata, loads) whose product is `cells`: a campaign grows in launches, workloads and loads
    together, as real sweeps do (10 = 1 x 2 x 5, 100 = 2 x 5 x 10, 1,000 = 4 x 10 x 25, 10,000 = 10 x 20 x 50)."""
    known = {3: (1, 1, 3), 10: (1, 2, 5), 100: (2, 5, 10), 1000: (4, 10, 25), 10000: (10, 20, 50)}
    if cells not in known:
        raise SystemExit(f"--sizes: {cells} cells has no campaign shape; use one of {sorted(known)}")
    return known[cells]


def strata_names(count: int) -> list[str]:
    return [f"s{i:02d}" for i in range(count)]


def write_campaign_spec(folder: Path, cells: int, launcher: str) -> Path:
    """A plain-only spec of `cells` cells with one-request windows, and its workload file."""
    repeats, strata, loads = shape(cells)
    workload = folder / "workload.jsonl"
    lines = [
        {"id": f"{s}-0", "workload": s, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        for s in strata_names(strata)
    ]
    workload.write_text("".join(json.dumps(line) + "\n" for line in lines))
    launch: dict[str, Any] = {"kind": "local", "ready_timeout_s": 120}
    if launcher == "slurm":
        launch = {"kind": "slurm", "cluster": CLUSTER_BLOCK, "ready_timeout_s": 300}
    spec = {
        "name": f"cost-{launcher}-{cells}",
        "target": {"model": "models/tiny-target", "served_model_name": "tiny"},
        "variants": [{"name": "plain"}],
        "workloads": [{"file": str(workload)}],
        "load": {
            "concurrencies": list(range(1, loads + 1)),
            "requests": 1,
            "warmup": 0,
            "allow_short_cells": True,  # the cost of starting a cell, not a load: one request each
            "request_timeout_s": 30,
        },
        "sampling": {"max_tokens": 1},
        "repeats": repeats,
        "capture": {"enabled": False},
        "validity": {"aa_control": False, "client_calibration": False},
        "launcher": launch,
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# ------------------------------------------------------------------------------- one size, in its own process


@dataclass
class Costs:
    launcher: str
    cells: int
    deployments: int
    plan_s: float | None  # None: not measured (a size only another launcher ran)
    run_overhead_s: float | None
    ingest_s: float | None
    analysis_s: float | None
    flow_s: float | None = None  # the campaign flow's wall time
    windows_s: float | None = None  # the cells' measured windows, summed
    engine_starts_s: float | None = None  # the deployments' ready_s, summed
    prefect_start_s: float | None = None  # the process's first (empty) flow run: Prefect's API starting
    source: str = "measured"

    @property
    def per_cell_s(self) -> float | None:
        return None if self.run_overhead_s is None else self.run_overhead_s / self.cells


def time_plan(spec_path: Path) -> tuple[float, Any]:
    """Seconds to read the spec, plan it and write campaign.json (the flow's plan step without Prefect)."""
    from experiments.plan import plan_campaign
    from experiments.spec import load_spec
    from tasks import campaign_state

    started = time.perf_counter()
    spec = load_spec(spec_path)
    plan = plan_campaign(spec)
    campaign_state.record_campaign(plan, spec)
    return time.perf_counter() - started, plan


def from_records(directory: Path) -> tuple[float, float, int]:
    """(measured windows, engine starts, cells) from the campaign's raw artifacts."""
    windows = 0.0
    cells = 0
    for summary in directory.glob("cells/*/summary.json"):
        windows += json.loads(summary.read_text()).get("wall_s") or 0.0
        cells += 1
    starts = sum(
        json.loads(p.read_text()).get("ready_s") or 0.0
        for p in directory.glob("deployments/*/deployment.json")
    )
    return windows, starts, cells


def ingest_and_analyse(campaign_dir: Path, db: Path) -> tuple[float, float]:
    from analysis.run import analyze_campaign
    from warehouse.ingest import ingest_raw

    started = time.perf_counter()
    report = ingest_raw(campaign_dir, db)
    ingest_s = time.perf_counter() - started
    if not report.ok:
        raise RuntimeError(f"ingest of {campaign_dir} failed: {report.as_dict()}")
    started = time.perf_counter()
    analyze_campaign(campaign_dir.name, db)
    return ingest_s, time.perf_counter() - started


def run_one(args: dict[str, Any]) -> Costs:
    """One real campaign (or a synthetic tree): runs in a child process whose SPECGAUGE_HOME is its own."""
    folder, cells, launcher = Path(args["folder"]), int(args["cells"]), args["launcher"]
    if args.get("synthetic"):
        return synthetic_costs(folder, cells)
    spec_path = write_campaign_spec(folder, cells, launcher)
    from flows.campaign import CampaignRequest, campaign  # first: it configures Prefect (the repo's profile)
    from specgauge import progress

    plan_s, plan = time_plan(spec_path)
    prefect_start_s = start_prefect()
    if launcher == "slurm":
        save_cluster_blocks(folder)
    with progress.reporting(progress.Reporter()):
        started = time.perf_counter()
        result = campaign(CampaignRequest(spec_path=str(spec_path), gate=False, analyze=False, ingest=False))
        flow_s = time.perf_counter() - started
    directory = Path(result["directory"])
    if result.get("failed_cells"):
        raise RuntimeError(f"{len(result['failed_cells'])} cells failed: {list(result['failed_cells'])[:3]}")
    windows, starts, done = from_records(directory)
    if done != cells:
        raise RuntimeError(f"{done} cell artifacts, {cells} planned")
    ingest_s, analysis_s = ingest_and_analyse(directory, folder / "home" / "w.duckdb")
    overhead = flow_s - windows - starts - plan_s
    return Costs(
        launcher,
        cells,
        len(plan.deployments),
        plan_s,
        overhead,
        ingest_s,
        analysis_s,
        flow_s,
        windows,
        starts,
        prefect_start_s,
    )


def start_prefect() -> float:
    """Seconds of the first flow run of the process (an empty one): Prefect starting its ephemeral API, paid
    once per `specgauge` command whatever the campaign's size, so kept out of the run overhead."""
    from prefect import flow

    @flow(name="cost-curves-start")
    def empty() -> None:
        return None

    started = time.perf_counter()
    empty()
    return time.perf_counter() - started


def synthetic_costs(folder: Path, cells: int) -> Costs:
    """Plan of the spec of `cells` cells; ingest and analysis of a generated raw tree of that campaign (one
    warm-up and one measured request per cell, one completion token, tests/warehouse_fixtures.py)."""
    sys.path.insert(0, str(TESTS))
    from warehouse_fixtures import RawBuilder

    spec_path = write_campaign_spec(folder, cells, "emulator")
    plan_s, plan = time_plan(spec_path)
    from experiments.spec import load_spec

    spec = load_spec(spec_path)
    spec = spec.model_copy(update={"load": spec.load.model_copy(update={"warmup": 1})})
    builder = RawBuilder(folder / "raw", spec=spec, completion_tokens=1, fast_frames=True)
    builder.write_all(captures=False)
    ingest_s, analysis_s = ingest_and_analyse(builder.campaign_dir, folder / "home" / "w.duckdb")
    return Costs(
        "synthetic", cells, len(plan.deployments), plan_s, None, ingest_s, analysis_s, source="synthetic"
    )


def save_cluster_blocks(folder: Path) -> None:
    """The test cluster as Prefect blocks (in this process's Prefect API): the stand-in as its engine."""
    sys.path.insert(0, str(TESTS))
    from stand_ins.cluster import save_cluster_blocks as save

    save(
        SSH_BLOCK,
        CLUSTER_BLOCK,
        engine_command=os.environ["SPECGAUGE_ENGINE_PYTHON"],
        remote_dir=folder / "cluster-home",
        time_limit="00:30:00",
    )


# --------------------------------------------------------------------------------------------- the driver


# The launchers record the engine Python's `pip freeze` (tasks/launch/provenance.py): the stand-in runs on
# this venv's Python, so that is what it answers, instead of starting an emulator that never exits.
PIP_PASSTHROUGH = """import os, sys
if sys.argv[1:3] == ["-m", "pip"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def standin_engine(folder: Path) -> Path:
    """The stand-in engine (vLLM's command line in, the emulator out) as an executable file."""
    sys.path.insert(0, str(TESTS))
    from reliability_support import STANDIN_SOURCE

    shebang, rest = STANDIN_SOURCE.format(python=sys.executable, repo=str(REPO)).split("\n", 1)
    path = folder / "standin-engine"
    path.write_text(f"{shebang}\n{PIP_PASSTHROUGH}{rest}")
    path.chmod(0o755)
    return path


def start_cluster() -> None:
    for service in ("sshd", "slurm"):
        script = REPO / "tests" / "services" / f"{service}.sh"
        if subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0:
            continue
        if os.geteuid() != 0:
            raise SystemExit(f"{service} is not running: run `sudo tests/services/{service}.sh start` first")
        subprocess.run(["bash", str(script), "start"], check=True, capture_output=True)


def measure(folder: Path, cells: int, launcher: str, standin: Path, synthetic: bool = False) -> Costs:
    """One size in a fresh process (its own SPECGAUGE_HOME, Prefect home and ephemeral API)."""
    folder.mkdir(parents=True)
    env = {
        **os.environ,
        "SPECGAUGE_HOME": str(folder / "home"),
        "SPECGAUGE_ENGINE_PYTHON": str(standin),
        "PREFECT_HOME": str(folder / "prefect"),
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    env.pop("PREFECT_API_URL", None)
    request = json.dumps(
        {"folder": str(folder), "cells": cells, "launcher": launcher, "synthetic": synthetic}
    )
    done = subprocess.run(
        [sys.executable, __file__, "--child", request], cwd=REPO, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{launcher} at {cells} cells failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    costs = json.loads(done.stdout.strip().splitlines()[-1])
    return Costs(**costs)


def extrapolated(measured: list[Costs], synthetic: Costs) -> list[Costs]:
    """The synthetic size's line per launcher: its plan, ingest and analysis measured, its run overhead
    extrapolated from that launcher's real runs: the least-squares line a + b x cells through them (a: what a
    campaign and its launches cost whatever their cells, b: each cell's), or, from one run, its per-cell
    overhead times the cells."""
    out = []
    for launcher in dict.fromkeys(c.launcher for c in measured):
        runs = sorted((c for c in measured if c.launcher == launcher), key=lambda c: c.cells)
        cells = [float(c.cells) for c in runs]
        overheads = [c.run_overhead_s or 0.0 for c in runs]
        if len(runs) > 1:
            slope, intercept = np.polyfit(cells, overheads, 1)
            overhead = float(intercept + slope * synthetic.cells)
            how = f"{intercept:.1f} s + {slope:.3f} s x cells, fitted to the runs at {_sizes(runs)} cells"
        else:
            overhead = overheads[0] / cells[0] * synthetic.cells
            how = f"the per-cell overhead at {runs[0].cells:,} cells"
        out.append(
            Costs(
                launcher,
                synthetic.cells,
                synthetic.deployments,
                synthetic.plan_s,
                overhead,
                synthetic.ingest_s,
                synthetic.analysis_s,
                source=f"generated tree; run overhead extrapolated: {how}",
            )
        )
    return out


def _sizes(runs: list[Costs]) -> str:
    return ", ".join(f"{c.cells:,}" for c in runs)


def table_rows(rows: list[Costs]) -> list[tuple[str, ...]]:
    def s(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    return [
        (
            r.launcher,
            f"{r.cells:,}",
            str(r.deployments),
            s(r.plan_s, 3),
            s(r.run_overhead_s, 1),
            s(r.per_cell_s, 3),
            s(r.ingest_s),
            s(r.analysis_s),
            r.source,
        )
        for r in rows
    ]


def draw_chart(rows: list[Costs], path: Path) -> None:
    """Seconds against cells, log-log, one line per phase (run overhead: per launcher); measured points
    filled, extrapolated ones hollow."""
    import altair as alt
    import polars as pl
    import vl_convert as vlc

    points = []
    for r in rows:
        phases = {
            "plan": r.plan_s,
            "run overhead": r.run_overhead_s,
            "ingest": r.ingest_s,
            "analysis": r.analysis_s,
        }
        for phase, seconds in phases.items():
            if seconds is None or seconds <= 0:
                continue
            guessed = phase == "run overhead" and r.source != "measured"
            points.append(
                {
                    "cells": r.cells,
                    "seconds": seconds,
                    "phase": phase,
                    "launcher": r.launcher,
                    "series": f"{phase} ({r.launcher})" if phase == "run overhead" else phase,
                    "how": "extrapolated" if guessed else "measured",
                }
            )
    frame = pl.DataFrame(points).unique(subset=["cells", "series"], keep="first").sort("cells")
    base = alt.Chart(alt.Data(values=frame.to_dicts())).encode(
        x=alt.X("cells:Q", scale=alt.Scale(type="log"), title="cells in the campaign"),
        y=alt.Y("seconds:Q", scale=alt.Scale(type="log"), title="seconds"),
        color=alt.Color("series:N", title="phase"),
    )
    chart = (
        base.mark_line(point=False)
        + base.mark_point(size=70, filled=True).transform_filter(alt.datum.how == "measured")
        + base.mark_point(size=70, filled=False, strokeWidth=2).transform_filter(alt.datum.how != "measured")
    ).properties(
        width=520,
        height=340,
        title=alt.Title(
            "What orchestration costs as a campaign grows",
            subtitle="filled: measured; hollow: run overhead extrapolated (benchmarks/cost_curves.py)",
        ),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(vlc.vegalite_to_png(chart.to_json(), scale=2))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,100,1000", help="cells of the real runs")
    parser.add_argument("--synthetic", default="10000", help="cells measured on a generated tree ('' none)")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--chart", type=Path, default=None, help="write the chart (PNG) here")
    parser.add_argument("--json", type=Path, default=None, help="keep the rows here, after each measurement")
    parser.add_argument(
        "--render", type=Path, default=None, help="no runs: the table (and chart) of a --json"
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asdict(run_one(json.loads(args.child)))))
        return
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        rows = [Costs(**r) for r in saved["rows"]]
        load_before, loads = saved["load_before"], saved["loads"]
    else:
        rows, load_before, loads = run_all(args)
    report(rows, load_before, loads)
    if args.chart is not None:
        draw_chart(with_extrapolation(rows), args.chart)
        print(f"chart: {args.chart}")


def run_all(args: argparse.Namespace) -> tuple[list[Costs], float, list[str]]:
    """The synthetic size first, then each real size on each launcher, smallest first (so that a run cut
    short still has the small sizes), the rows saved to --json after each."""
    launchers = [name for name in args.launchers.split(",") if name]
    unknown = set(launchers) - set(LAUNCHERS)
    if unknown:
        raise SystemExit(f"--launchers: unknown {sorted(unknown)}; known {list(LAUNCHERS)}")
    sizes = sorted(int(s) for s in args.sizes.split(",") if s)
    for cells in sizes:
        shape(cells)
    if "slurm" in launchers:
        start_cluster()
    work = Path(tempfile.mkdtemp(prefix="cost-curves-", dir=args.workdir))
    load_before = os.getloadavg()[0]
    print(
        f"{datetime.now().astimezone():%Y-%m-%d %H:%M:%S %Z}; load average before {load_before:.2f}",
        flush=True,
    )
    rows: list[Costs] = []
    loads: list[str] = []
    runs = [(int(args.synthetic), "emulator", True)] if args.synthetic else []
    runs += [(cells, launcher, False) for cells in sizes for launcher in launchers]
    try:
        standin = standin_engine(work)
        for cells, launcher, synthetic in runs:
            name = "synthetic" if synthetic else launcher
            rows.append(measure(work / f"{name}-{cells}", cells, launcher, standin, synthetic))
            loads.append(f"{name} {cells}: {os.getloadavg()[0]:.2f}")
            print(table_rows([rows[-1]])[0], flush=True)
            if args.json is not None:
                saved = {"rows": [asdict(r) for r in rows], "load_before": load_before, "loads": loads}
                args.json.write_text(json.dumps(saved, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return rows, load_before, loads


def with_extrapolation(rows: list[Costs]) -> list[Costs]:
    """The measured rows; the synthetic ones replaced by one line per launcher (see `extrapolated`); and a
    line for each size another launcher ran but this one did not (cut short): its run overhead extrapolated
    the same way, its other phases left out (not measured)."""
    measured = [r for r in rows if r.source == "measured"]
    out = list(measured)
    for synthetic in (r for r in rows if r.source == "synthetic"):
        out += extrapolated(measured, synthetic) if measured else [synthetic]
    for size in sorted({r.cells for r in measured}):
        missing = {r.launcher for r in measured} - {r.launcher for r in measured if r.cells == size}
        probe = Costs("", size, 0, None, None, None, None, source="synthetic")
        for line in extrapolated([r for r in measured if r.launcher in missing], probe):
            deployments = next(r.deployments for r in measured if r.cells == size)
            out.append(
                replace(
                    line, deployments=deployments, source=line.source.replace("generated tree", "not run")
                )
            )
    return sorted(out, key=lambda r: (r.launcher, r.cells))


def report(rows: list[Costs], load_before: float, loads: list[str]) -> None:
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for line in table_rows(with_extrapolation(rows)):
        print("| " + " | ".join(line) + " |")
    for r in rows:
        if r.flow_s is not None:
            print(
                f"{r.launcher} {r.cells}: flow {r.flow_s:.1f} s = windows {r.windows_s:.2f} + engine starts "
                f"{r.engine_starts_s:.1f} + plan {r.plan_s:.3f} + overhead {r.run_overhead_s:.1f}; before it, "
                f"Prefect's API start (an empty flow) {r.prefect_start_s:.1f} s"
            )
    print(
        f"{os.cpu_count()} CPUs; load average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
        f"after each size: {', '.join(loads)}"
    )


if __name__ == "__main__":
    main()
