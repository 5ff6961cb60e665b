"""Shared by the reliability and bad-input suites (tests/test_reliability*.py, tests/test_bad_input.py).

- `standin`: a stand-in engine for the launchers. It takes vLLM's command line (`-m
  vllm.entrypoints.openai.api_server --served-model-name N --host H --port P ...`) and serves the emulator
  there, or, with `--never-ready` among its extra arguments, a server whose /health answers 503 forever
  (with a child process in its group, as vLLM's engine core, so teardown must reach the whole group).
  Extra arguments come from the file named by SPECGAUGE_STANDIN_ARGS_FILE (read at each start, so a test
  can change what the next launch does) and from SPECGAUGE_STANDIN_ARGS.
- `observe`: records what each test did and saw as one JSON line in the observations file
  (SPECGAUGE_RELIABILITY_OBSERVATIONS, default `<pytest basetemp>/reliability-observations.jsonl`);
  `python tests/reliability_support.py OBSERVATIONS [JUNIT_XML ...]` renders docs/reliability.md from it.
- the checks every fault ends with: no process left in an engine's group, nothing left in the ledger,
  no temporary (half-written) artifact, every cell attempt complete, the warehouse consistent with the raw
  tree, and how many request records were planned but not persisted.

Not a test module (no `test_` prefix): pytest does not collect it; test modules load it with `pytest_plugins`.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import pytest
import yaml

from experiments.plan import CellPlan, plan_campaign
from experiments.spec import SLO, LoadSpec, Sampling, load_spec
from specgauge import progress
from specgauge.settings import get_settings
from tasks import campaign_state
from tasks.cell import CellOutcome, run_cell
from tasks.launch.base import Deployment
from tasks.launch.local import live_group_members
from tasks.load.records import RequestRecord
from workloads.schema import load_corpus

REPO = Path(__file__).resolve().parent.parent
OBSERVATIONS_ENV = "SPECGAUGE_RELIABILITY_OBSERVATIONS"
CELL_FILES = ("meta.json", "summary.json", "requests.parquet", "gauges.parquet")

STANDIN_SOURCE = '''#!{python}
"""specgauge test stand-in engine: vLLM's command line in, the emulator (or a never-ready server) out."""
import http.server, os, shlex, subprocess, sys
sys.path.insert(0, {repo!r})
args = sys.argv[1:]


def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default


extra = []
path = os.environ.get("SPECGAUGE_STANDIN_ARGS_FILE")
if path and os.path.exists(path):
    extra += shlex.split(open(path).read())
extra += shlex.split(os.environ.get("SPECGAUGE_STANDIN_ARGS", ""))
host, port = opt("--host", "127.0.0.1"), int(opt("--port", "8000"))
model = opt("--served-model-name", "emulated")
print(f"stand-in engine pid {{os.getpid()}} on {{host}}:{{port}} serving {{model}}; extra {{extra}}", flush=True)
if "--never-ready" in extra:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # like vLLM's engine core

    class Loading(http.server.BaseHTTPRequestHandler):
        def answer(self):
            body = b"still loading"
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *a):
            pass

    http.server.ThreadingHTTPServer((host, port), Loading).serve_forever()
else:
    from emulator.launch import main

    main(["--host", host, "--port", str(port), "--model", model, *extra])
'''


# -- the stand-in engine ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An executable stand-in engine (see the module docstring); use it as the engine python."""
    path = tmp_path_factory.mktemp("standin") / "standin-engine"
    path.write_text(STANDIN_SOURCE.format(python=sys.executable, repo=str(REPO)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def standin_engine(standin: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The local launcher runs the stand-in instead of vLLM; returns the file of its extra arguments."""
    from specgauge.settings import get_settings

    args_file = home.parent / "standin-args"
    args_file.write_text("")
    monkeypatch.setenv("SPECGAUGE_ENGINE_PYTHON", str(standin))
    monkeypatch.setenv("SPECGAUGE_STANDIN_ARGS_FILE", str(args_file))
    get_settings.cache_clear()
    yield args_file
    get_settings.cache_clear()


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def corpus(path: Path, prompts: list[tuple[str, str, str, int]]) -> Path:
    """A workload file of (id, stratum, user message, max_tokens)."""
    lines = [
        json.dumps({"id": i, "workload": w, "messages": [{"role": "user", "content": text}], "max_tokens": n})
        for i, w, text, n in prompts
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def emulator_spec(name: str, workload_file: Path, **changes: Any) -> dict[str, Any]:
    """A small spec for the stand-in engine through the local launcher: plain only, no capture."""
    spec: dict[str, Any] = {
        "name": name,
        "target": {"model": "models/tiny-target", "served_model_name": "tiny"},
        "variants": [{"name": "plain"}],
        "workloads": [{"file": str(workload_file)}],
        "load": {
            "concurrencies": [1],
            "requests": 4,
            "warmup": 1,
            "allow_short_cells": True,
            "request_timeout_s": 10,
        },
        "sampling": {"max_tokens": 8},
        "capture": {"enabled": False},
        "validity": {"aa_control": False},  # plain only: no A/A arm
        "launcher": {"kind": "local", "ready_timeout_s": 30},
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def one_prompt_cell(
    tmp_path: Path,
    deployment: Deployment,
    *,
    workload_name: str,
    campaign_id: str,
    load: LoadSpec,
    on_record: Callable[[RequestRecord], None] | None = None,
    cells_dir: Path | None = None,
) -> CellOutcome:
    """The cell plain.r0.code.c1 of one code prompt (workload file tmp_path/workload_name), run by `run_cell`
    against `deployment` and written under `cells_dir` (tmp_path/cells unless given): a fault shown one level
    below the campaign."""
    work = load_corpus(corpus(tmp_path / workload_name, [("ok-0", "code", "def add(a, b):", 8)]))
    return run_cell(
        deployment,
        CellPlan("plain.r0.code.c1", "code", "closed", 1, None, workload_name),
        campaign_id=campaign_id,
        repeat=0,
        corpus=work,
        sampling=Sampling(max_tokens=8),
        load=load,
        slo=SLO(),
        cells_dir=cells_dir or tmp_path / "cells",
        on_record=on_record,
    )


# -- hooks into a running campaign ------------------------------------------------------------------------
@dataclass
class Hooks(progress.Reporter):
    """A progress reporter that lets a test act at a chosen moment of a campaign run in this process: at a
    cell's start, or after its n-th request record (1-based, warm-up included)."""

    on_cell_started: Callable[[str], None] | None = None
    on_record: Callable[[str, int], None] | None = None
    cell: str = ""
    records: int = 0
    seen_cells: list[str] = field(default_factory=list)

    def cell_started(self, cell_id: str, requests: int) -> None:
        self.cell, self.records = cell_id, 0
        self.seen_cells.append(cell_id)
        if self.on_cell_started is not None:
            self.on_cell_started(cell_id)

    def request_done(self) -> None:
        self.records += 1
        if self.on_record is not None:
            self.on_record(self.cell, self.records)


def latest_deployment(campaign_dir: Path) -> dict[str, Any]:
    """deployment.json of the campaign's most recent launch."""
    found = sorted(campaign_dir.glob("deployments/*/deployment.json"), key=lambda p: p.stat().st_mtime_ns)
    assert found, f"no deployment under {campaign_dir}"
    return json.loads(found[-1].read_text())


# -- the Prefect API ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prefect_api(prefect_harness: None) -> Iterator[str]:
    """The session's Prefect test server (tests/conftest.py `prefect_harness`, tuned as the Prefect facts
    say); yields its URL (for subprocesses). One server per session: with a second harness started inside
    the first (this module's own, until 2026-12-01), the outer server's warehouse writer slot stayed taken
    and the next flow here waited for it forever, Prefect's events worker failing meanwhile (seen once the
    suite ran in another order: the analyze flow, the regression flow, then these)."""
    from prefect.settings import PREFECT_API_URL

    yield str(PREFECT_API_URL.value())


Polled = TypeVar("Polled")


def poll_until(condition: Callable[[], Polled], timeout_s: float, what: str, poll_s: float = 0.3) -> Polled:
    """The first truthy value of condition(), asked every poll_s; AssertionError naming `what` after
    timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def serve_env(prefect_api: str, home: Path, spec_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a process serving the campaign flow on the test's API and home."""
    return {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "SPECGAUGE_HOME": str(home),
        "SPECGAUGE_SPEC_DIRS": str(spec_dir),  # a deployment's run reads specs only from its spec folders
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        **extra,
    }


@contextmanager
def serving_campaign(name: str, env: dict[str, str], log_path: Path) -> Iterator[None]:
    """The campaign flow served as deployment `campaign/<name>` (one run at a time, `flow.serve`) by a
    process of its own session, its output in log_path; terminated on exit, its group killed after 30 s."""
    code = f"from flows.campaign import campaign\ncampaign.serve(name={name!r}, limit=1)\n"
    with open(log_path, "w") as log:
        serve = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        serve.terminate()
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            kill_groups([serve.pid])


def submit_served(name: str, spec_path: Path, poll_s: float = 0.3) -> Any:
    """The flow run of `spec_path` (no ingest, gate or analysis) submitted to the served deployment
    `campaign/<name>` as soon as it is registered (within 120 s)."""
    from prefect.deployments import run_deployment

    def submitted() -> Any:
        try:
            return run_deployment(
                f"campaign/{name}",
                parameters={
                    "request": {"spec_path": str(spec_path), "ingest": False, "gate": False, "analyze": False}
                },
                timeout=0,
            )
        except Exception:  # the deployment is not registered yet
            return None

    return poll_until(submitted, 120, "the served deployment", poll_s)


# -- checks ------------------------------------------------------------------------------------------------
def group_members(pgid: int) -> list[int]:
    return [proc.pid for proc in live_group_members(pgid)]


def wait_gone(pgids: list[int], timeout_s: float = 30.0) -> list[int]:
    """Processes still alive in any of these groups after up to timeout_s (the leak count)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pgid in pgids for pid in group_members(pgid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.3)


def kill_groups(pgids: list[int]) -> None:
    """Last resort after a failed test: never leave a stand-in or engine running."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def ledger_ids() -> list[str]:
    from tasks.launch import ledger

    return [entry["id"] for entry in ledger.entries()]


def launched_pgids(campaign_dir: Path) -> list[int]:
    """The process group of every local launch of a campaign (the launcher starts each in its own)."""
    pids = []
    for path in campaign_dir.glob("deployments/*/deployment.json"):
        pid = json.loads(path.read_text()).get("pid")
        if pid:
            pids.append(int(pid))
    return pids


def temporaries(root: Path) -> list[Path]:
    """Half-written artifacts: atomic_dir's and write_json_atomic's temporary names."""
    return sorted(p for p in root.rglob(".tmp-*")) if root.exists() else []


def incomplete_attempts(campaign_dir: Path) -> list[str]:
    cells = campaign_dir / "cells"
    if not cells.exists():
        return []
    return [d.name for d in cells.iterdir() if not all((d / f).exists() for f in CELL_FILES)]


def attempts(campaign_dir: Path) -> dict[str, dict[str, Any]]:
    """Every cell attempt on disk: its summary's status, error, request counts and records persisted."""
    out = {}
    for d in sorted((campaign_dir / "cells").glob("*.a*")):
        summary = json.loads((d / "summary.json").read_text())
        meta = json.loads((d / "meta.json").read_text())
        frame = pl.read_parquet(d / "requests.parquet")
        out[d.name] = {
            "status": summary["status"],
            "error": summary["error"],
            "requests": summary["requests"],
            "server_problem": summary.get("server_problem"),
            "planned": meta["load"]["requests"] + meta["load"]["warmup"],
            "persisted": frame.height,
            "deployment_id": meta["deployment_id"],
            "frame": frame,
        }
    return out


def records_lost(campaign_dir: Path) -> int:
    """Request records a written cell attempt planned but did not persist (its requests.parquet rows)."""
    return sum(max(a["planned"] - a["persisted"], 0) for a in attempts(campaign_dir).values())


def warehouse_problems(raw_dir: Path, db: Path, campaign_id: str) -> list[str]:
    """Ingest (idempotent) and compare the warehouse with the raw tree of one campaign: one row per cell
    attempt, the request rows of each, nothing quarantined. Returns what disagrees (empty: consistent)."""
    from warehouse.db import reader
    from warehouse.ingest import ingest_raw

    report = ingest_raw(raw_dir, db)
    problems = [o.message for o in report.quarantined] + [o.message for o in report.errors]
    on_disk = {a: v["persisted"] for a, v in attempts(raw_dir / campaign_id).items()}
    with reader(db) as con:
        in_db = dict(
            con.execute(
                "SELECT c.cell_id || '.a' || c.attempt, count(r.cell_key) FROM cells c "
                "LEFT JOIN requests r USING (cell_key) WHERE c.campaign_id = ? GROUP BY 1",
                [campaign_id],
            ).fetchall()
        )
    if in_db != on_disk:
        problems.append(f"warehouse cells/requests {in_db} != raw tree {on_disk}")
    return problems


def campaign_dir(spec_path: Path) -> Path:
    plan = plan_campaign(load_spec(spec_path))
    return campaign_state.campaign_dir(plan.campaign_id)


def run_records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((directory / "runs").glob("*.json"))]


def end_state(directory: Path) -> dict[str, Any]:
    """The checks every fault ends with, as numbers."""
    raw = get_settings().raw_dir
    pgids = launched_pgids(directory)
    leaked = wait_gone(pgids)
    if leaked:
        kill_groups(pgids)
    return {
        "leaked_processes": leaked,
        "ledger": ledger_ids(),
        "temporaries": [str(p) for p in temporaries(raw)],
        "incomplete": incomplete_attempts(directory),
        "records_lost": records_lost(directory),
        "warehouse": warehouse_problems(raw, get_settings().warehouse_path, directory.name),
    }


def assert_clean(state: dict[str, Any]) -> None:
    assert state["leaked_processes"] == [], "processes survived the teardown"
    assert state["ledger"] == [], "the ledger still lists deployments"
    assert state["temporaries"] == [] and state["incomplete"] == []
    assert state["records_lost"] == 0
    assert state["warehouse"] == []


def leaks(state: dict[str, Any]) -> int:
    return len(state["leaked_processes"]) + len(state["ledger"])


def live_slurm_jobs() -> set[str]:
    from stand_ins.cluster import live_job_ids

    return live_job_ids()


# -- observations --------------------------------------------------------------------------------------------
def observations_path(config: pytest.Config) -> Path:
    configured = os.environ.get(OBSERVATIONS_ENV)
    if configured:
        return Path(configured)
    base = Path(config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    if os.environ.get(
        "PYTEST_XDIST_WORKER"
    ):  # each worker's basetemp is a folder of the run's: one file for all
        base = base.parent
    return base / "reliability-observations.jsonl"


@pytest.fixture
def observe(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """`observe(row, done=, expected=, observed=, records_lost=, leaked=)`: one line of the observations
    file (and printed), tagged with this test's node id. Values must be what the test measured."""
    path = observations_path(request.config)

    def record(row: str, **fields: Any) -> dict[str, Any]:
        assert row in ROWS, f"unknown row {row!r}: add it to ROWS"
        test = request.node.nodeid.removesuffix("@serial")  # pytest-xdist's group suffix (conftest.py)
        entry = {"row": row, "test": test, **fields}
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")
        print("OBSERVED", json.dumps(entry, default=str))
        return entry

    return record


# The table's rows, in order: (kind, what). Every fault and bad input of issue 10.
ROWS: dict[str, str] = {
    "engine killed mid-cell": "fault",
    "stream cut mid-response": "fault",
    "burst of 5xx": "fault",
    "stall longer than the request timeout": "fault",
    "/metrics returns garbage": "fault",
    "/metrics unreachable": "fault",
    "readiness timeout": "fault",
    "SSH connection dropped mid-campaign": "fault",
    "SLURM job cancelled from outside (readiness)": "fault",
    "SLURM job cancelled from outside (cell)": "fault",
    "campaign cancelled through the Prefect API": "fault",
    "crash during warehouse ingest": "fault",
    "disk full while writing an artifact": "fault",
    "two campaigns writing one warehouse": "fault",
    "malformed JSONL": "input",
    "wrong types": "input",
    "duplicate ids": "input",
    "empty messages": "input",
    "non-UTF-8 bytes": "input",
    "prompt longer than the model's context": "input",
    "invalid or unknown fields in experiment specs": "input",
    "unknown speculative method": "input",
    "impossible speculative settings (k <= 0, ...)": "input",
    "draft model with another vocabulary": "input",
    "names with shell metacharacters": "input",
    "bad /metrics text": "input",
    "unreachable endpoint": "input",
    # issue 34: hostile input and concurrent writers
    "names from data that would become paths": "input",
    "two writers of one campaign or one import": "fault",
    "secrets in endpoint URLs, engine env and engine flags": "input",
    "the warehouse attacked through its own commands": "input",
    "specs made to hang (alias bomb, huge counts) or to mislead (bools, duplicate keys)": "input",
    "inputs that raised a traceback": "input",
    "silent wrongs (every launch failed, bad port, a foreign file as spec)": "input",
    "litter after a kill; a hostile report-server client": "fault",
    "fuzzed arguments and files to every command": "input",
}

# Existing tests that show a row's behaviour too (reused, not duplicated); their outcome comes from the run's
# JUnit XML when the doc is rendered.
ALSO_SHOWN_BY: dict[str, list[str]] = {
    "stream cut mid-response": ["tests/test_client.py::test_fault_gives_classified_failure"],
    "burst of 5xx": ["tests/test_runner.py::test_faulty_requests_inside_a_cell_are_recorded_not_lost"],
    "stall longer than the request timeout": ["tests/test_client.py::test_fault_gives_classified_failure"],
    "SSH connection dropped mid-campaign": [
        "tests/test_ssh.py::test_dropped_connection_is_reestablished_on_the_next_call",
        "tests/test_ssh.py::test_tunnel_reaches_a_cluster_side_port_and_survives_a_reconnect",
    ],
    "crash during warehouse ingest": [
        "tests/test_warehouse.py::test_exception_inside_the_cell_transaction_leaves_no_partial_cell",
        "tests/test_warehouse_concurrency.py::test_sigkill_mid_ingest_leaves_no_partial_cell",
    ],
    "two campaigns writing one warehouse": [
        "tests/test_warehouse_concurrency.py::test_second_writer_waits_says_who_holds_the_lock_then_both_succeed"
    ],
    "malformed JSONL": ["tests/test_workloads.py::test_each_problem_names_file_line_and_field"],
    "wrong types": ["tests/test_workloads.py::test_each_problem_names_file_line_and_field"],
    "duplicate ids": ["tests/test_workloads.py::test_every_problem_is_reported_not_just_the_first"],
    "empty messages": ["tests/test_workloads.py::test_each_problem_names_file_line_and_field"],
    "non-UTF-8 bytes": ["tests/test_workloads.py::test_every_problem_is_reported_not_just_the_first"],
    "invalid or unknown fields in experiment specs": ["tests/test_spec.py::test_errors_name_the_field"],
    "unknown speculative method": ["tests/test_spec.py::test_errors_name_the_field"],
    "impossible speculative settings (k <= 0, ...)": ["tests/test_spec.py::test_errors_name_the_field"],
    "names with shell metacharacters": [
        "tests/test_spec.py::test_errors_name_the_field",
        "tests/test_slurm.py::test_script_quotes_every_value_that_reaches_the_shell",
    ],
    "bad /metrics text": ["tests/test_prometheus.py::test_unparsable_text_names_the_problem"],
    "unreachable endpoint": ["tests/test_client.py::test_connect_failure_is_classified"],
}


def _junit_outcomes(junits: list[Path]) -> dict[str, str]:
    """nodeid (file::name, parameters dropped) -> passed/failed/skipped, from JUnit XML reports."""
    outcomes: dict[str, str] = {}
    cases = [
        case for junit in junits if junit.exists() for case in ET.parse(junit).getroot().iter("testcase")
    ]
    for case in cases:
        module = case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "").removesuffix("@serial").split("[")[0]  # xdist's group (conftest.py)
        outcome = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        for key in (f"{module}::{name}", module):
            if outcomes.get(key) != "failed":  # one failing parametrisation fails the test
                outcomes[key] = outcome if outcomes.get(key) in (None, outcome) else "failed"
    return outcomes


def _cell(value: Any) -> str:
    text = str(value) if value is not None else ""
    return text.replace("|", "\\|").replace("\n", " ")


def render(observations: list[dict[str, Any]], junits: list[Path] | None = None) -> str:
    """docs/reliability.md's table from the observations of one run (and the JUnit outcomes of the reused
    tests). Rows without an observation say so."""
    outcomes = _junit_outcomes(junits or [])
    by_row: dict[str, list[dict[str, Any]]] = {}
    for entry in observations:
        by_row.setdefault(entry["row"], []).append(entry)
    lines = [
        "| # | fault or input | what was done | expected | observed | records lost | processes/jobs "
        "leaked | shown by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    totals = {"rows": 0, "observed": 0, "lost": 0, "leaked": 0, "reused_passed": 0, "reused": 0}
    for number, (row, kind) in enumerate(ROWS.items(), start=1):
        totals["rows"] += 1
        entries = by_row.get(row, [])
        reused = []
        for nodeid in ALSO_SHOWN_BY.get(row, []):
            outcome = outcomes.get(nodeid, "not run")
            totals["reused"] += 1
            totals["reused_passed"] += outcome == "passed"
            reused.append(f"`{nodeid}` ({outcome})")
        if not entries:
            lines.append(
                f"| {number} | {kind}: {_cell(row)} | | | not observed in this run | | | "
                + "<br>".join(reused)
                + " |"
            )
            continue
        totals["observed"] += 1
        for entry in entries:
            totals["lost"] += int(entry.get("records_lost") or 0)
            totals["leaked"] += int(entry.get("leaked") or 0)
            shown = [f"`{entry['test']}`", *reused]
            lines.append(
                f"| {number} | {kind}: {_cell(row)} | {_cell(entry.get('done'))} | "
                f"{_cell(entry.get('expected'))} | {_cell(entry.get('observed'))} | "
                f"{_cell(entry.get('records_lost'))} | {_cell(entry.get('leaked'))} | "
                + "<br>".join(shown)
                + " |"
            )
    lines += [
        "",
        f"**Totals**: {totals['rows']} faults and inputs, {totals['observed']} observed in this run; "
        f"{totals['lost']} request records lost in total; {totals['leaked']} processes or jobs leaked in "
        f"total; reused tests: {totals['reused_passed']} of {totals['reused']} passed.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python tests/reliability_support.py OBSERVATIONS.jsonl [JUNIT.xml ...]
    entries = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
    print(render(entries, [Path(a) for a in sys.argv[2:]]), end="")
