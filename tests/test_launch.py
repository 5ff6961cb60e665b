"""The local launcher and the readiness check, on the real embedded engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from experiments.spec import load_spec
from specgauge.errors import EngineDied
from tasks.health import wait_ready
from tasks.launch import ledger, reap_leftovers
from tasks.launch.base import startup_facts
from tasks.launch.local import LocalLauncher, live_group_members

REPO = Path(__file__).resolve().parent.parent
HOLD = [sys.executable, str(REPO / "tests" / "helpers" / "launch_and_hold.py")]

pytestmark = pytest.mark.engine


def engine_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def group_members(pgid: int) -> list[int]:
    return [proc.pid for proc in live_group_members(pgid)]


def start_holder(tmp_path: Path, then: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [*HOLD, "--dir", str(tmp_path / then), "--then", then],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=os.environ.copy(),
    )
    first = json.loads(proc.stdout.readline())
    return proc, first["pid"]


def wait_gone(pgid: int, timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return []
        time.sleep(0.5)
    return group_members(pgid)


@pytest.mark.parametrize("variant", ["plain", "draft-k3"])  # the pool's engines; the campaign serves them all
def test_each_variant_answers_a_streamed_chat_completion(engines, variant: str) -> None:
    deployment = engines.get(variant)
    assert deployment.status == "ready" and deployment.ready_s and deployment.ready_s > 0
    assert deployment.kv_cache_tokens and deployment.kv_cache_tokens > 1000
    assert deployment.engine_version == "0.32.0"
    assert deployment.max_model_len == 2048
    body = {
        "model": deployment.served_model_name,
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "messages": [{"role": "user", "content": "Write the Python function `add(a, b)`."}],
        "stream_options": {"include_usage": True},
    }
    chunks, usage = [], None
    with httpx.stream(
        "POST", f"{deployment.base_url}/v1/chat/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    chunks.append(choice["delta"]["content"])
    assert len(chunks) >= 2, "a streamed answer arrives in several chunks"
    assert usage and usage["completion_tokens"] > 0
    assert "".join(chunks).strip()
    command = (deployment.directory / "command.txt").read_text()
    assert ("--speculative-config" in command) == (variant != "plain")


def test_the_engine_runs_bound_apart_from_the_api_server_and_the_client(engines) -> None:
    """The default launcher (cpu_binding pin, passive libgomp): every thread of the real engine core on the
    last CPU, the API server's and this process's on the first, and the deployment says so."""
    deployment = engines.get("plain")
    runtime = deployment.extra["cpu_runtime"]
    assert runtime["label"] == "openmp gnu, wait passive, bind pin, 4k pages"
    assert runtime["env"] == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    assert runtime["bound"]["engine_threads"] > 1
    group = [psutil.Process(deployment.pid), *psutil.Process(deployment.pid).children(recursive=True)]
    masks = {
        p.pid: {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir(f"/proc/{p.pid}/task")}
        for p in group
    }
    (core,) = [p for p in group if p.name().startswith("VLLM::EngineCor")]  # psutil may give the full title
    assert masks[core.pid] == {tuple(runtime["engine_cpus"])}
    assert masks[deployment.pid] == {tuple(runtime["frontend_cpus"])}
    assert sorted(os.sched_getaffinity(0)) == runtime["frontend_cpus"]


def test_startup_facts_parse_the_engine_log(engines) -> None:
    deployment = engines.get("plain")
    facts = startup_facts(deployment.log_path.read_text())
    assert facts["kv_cache_tokens"] == deployment.kv_cache_tokens
    assert facts["max_concurrency_at_len"]["tokens"] == 2048


def test_a_killed_engine_fails_the_gate_within_seconds_with_its_log_tail(engine_lock, tmp_path: Path) -> None:
    spec = load_spec(REPO / "experiments" / "demo.yaml")
    launcher = LocalLauncher(spec.launcher)
    deployment = launcher.launch(
        spec.target, spec.plain, deployment_id="killed", directory=tmp_path / "killed"
    )
    try:
        deadline = time.monotonic() + 90
        while "non-default args" not in deployment.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)  # kill it once it has started logging, so there is a tail to show
        os.killpg(deployment.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(EngineDied) as info:
            wait_ready(deployment, launcher, timeout_s=600)
        waited = time.monotonic() - started
    finally:
        launcher.teardown(deployment)
    assert waited < 30, f"gate should fail fast on a dead engine, took {waited:.1f}s of a 600s timeout"
    assert "--- log tail ---" in str(info.value)
    assert info.value.log_tail  # the engine wrote something before it died
    assert not group_members(deployment.pid)


@pytest.mark.parametrize("then", ["raise", "sigint", "sigterm"])
def test_teardown_on_error_ctrl_c_and_sigterm_leaves_no_process(
    engine_lock, tmp_path: Path, then: str
) -> None:
    proc, pid = start_holder(tmp_path, "raise" if then == "raise" else "wait")
    try:
        if then != "raise":
            time.sleep(10)
            proc.send_signal(signal.SIGINT if then == "sigint" else signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert wait_gone(pid) == [], "engine processes survived the teardown"
    assert not any(e["id"].startswith("hold-") for e in ledger.entries())


def test_the_ledger_reaps_what_a_killed_run_left(engine_lock, tmp_path: Path) -> None:
    proc, pid = start_holder(tmp_path, "sleep")
    try:
        time.sleep(3)
        proc.kill()  # SIGKILL: no finally, no atexit; the engine is orphaned
        proc.wait(timeout=10)
        assert group_members(pid), "the orphaned engine should still run before reaping"
        done = reap_leftovers()
        assert [d["outcome"] for d in done if d["id"] == "hold-sleep"] in (
            ["terminated"],
            ["killed after SIGTERM grace"],
        )
        assert wait_gone(pid) == []
        assert not any(e["id"] == "hold-sleep" for e in ledger.entries())
    finally:
        for member in group_members(pid):
            os.kill(member, signal.SIGKILL)


def test_reaping_with_an_id_prefix_stops_only_that_campaigns_deployments(home: Path) -> None:
    # The cancellation hook reaps its own campaign only; the process may hold other live deployments.
    for deployment_id in ("camp-a.plain.r0", "camp-b.plain.r0"):
        ledger.record(deployment_id, "local", pid=None, marker=f"{deployment_id} gone")
    done = reap_leftovers(include_own=True, id_prefix="camp-a.")
    assert [d["id"] for d in done] == ["camp-a.plain.r0"]
    assert [e["id"] for e in ledger.entries()] == ["camp-b.plain.r0"]
