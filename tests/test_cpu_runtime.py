"""The local launcher's CPU runtime settings (tasks/launch/cpu_runtime.py): the environment each setting gives
the engine, the binding of a running process group's threads, and the label that keeps campaigns launched
differently apart (analysis.history, the effective configuration)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from analysis.history import launch_class
from experiments.spec import LocalLaunchSpec, TargetSpec, Variant, runtime_label
from specgauge.errors import LaunchError
from tasks.launch.cpu_runtime import (
    bind_after_ready,
    bind_client,
    cpu_split,
    release_client,
    runtime_env,
    runtime_record,
)
from tasks.launch.local import LocalLauncher


def bare(**settings: object) -> LocalLaunchSpec:
    """The launcher with every CPU setting as it was before them (unbound, libgomp's own wait), then these."""
    return LocalLaunchSpec.model_validate(
        {"openmp": "gnu", "omp_wait_policy": "runtime", "cpu_binding": "none", **settings}
    )


def fake_engine_python(tmp_path: Path, with_iomp: bool = True) -> Path:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    if with_iomp:
        (tmp_path / "venv" / "lib").mkdir()
        (tmp_path / "venv" / "lib" / "libiomp5.so").touch()
    return python


def test_the_cpus_split_into_frontend_and_engine() -> None:
    spec = LocalLaunchSpec(cpu_binding="pin")
    assert cpu_split(spec, [0, 1]) == ([0], [1])
    assert cpu_split(spec, [3, 0, 2, 1]) == ([0], [1, 2, 3])
    assert cpu_split(spec.model_copy(update={"frontend_cpus": 2}), [0, 1, 2, 3]) == ([0, 1], [2, 3])
    assert cpu_split(spec, [5]) == ([5], [5])  # one CPU: shared, never an empty engine


def test_each_setting_gives_its_environment(tmp_path: Path) -> None:
    python = fake_engine_python(tmp_path)
    assert runtime_env(bare(openmp="gnu"), python, {}, [0, 1]) == {}
    intel = runtime_env(bare(openmp="intel"), python, {"LD_PRELOAD": "/x/libfoo.so"}, [0, 1])
    assert intel["LD_PRELOAD"] == f"{tmp_path}/venv/lib/libiomp5.so:/x/libfoo.so"  # ours first, theirs kept
    assert intel["KMP_BLOCKTIME"] == "1"
    passive = runtime_env(bare(openmp="intel", omp_wait_policy="passive"), python, {}, [0, 1])
    assert passive["OMP_WAIT_POLICY"] == "PASSIVE" and passive["KMP_BLOCKTIME"] == "0"
    assert runtime_env(bare(cpu_binding="pin"), python, {}, [0, 1, 2]) == {"OMP_NUM_THREADS": "2"}
    vllm = runtime_env(bare(cpu_binding="vllm"), python, {}, [0, 1, 2])
    assert vllm == {"VLLM_CPU_OMP_THREADS_BIND": "1,2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    huge = runtime_env(bare(huge_pages=True), python, {}, [0, 1])
    assert huge == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "THP_MEM_ALLOC_ENABLE": "1"}


def test_intel_openmp_without_its_library_is_refused_before_launch(tmp_path: Path) -> None:
    python = fake_engine_python(tmp_path, with_iomp=False)
    with pytest.raises(LaunchError, match=r"libiomp5\.so is missing"):
        runtime_env(bare(openmp="intel"), python, {}, [0, 1])


def test_vllm_binding_runs_the_multiprocess_executor(tmp_path: Path) -> None:
    target = TargetSpec(model="models/tiny-target")
    plain = Variant(name="plain", method="none")
    python = fake_engine_python(tmp_path)
    uni = LocalLauncher(bare(), engine_python=python).command(target, plain, 8000)
    assert "--distributed-executor-backend" in uni
    bound = LocalLauncher(bare(cpu_binding="vllm"), engine_python=python).command(target, plain, 8000)
    assert "--distributed-executor-backend" not in bound  # vLLM binds only when it spawns the worker


def test_the_label_separates_launch_classes_and_reads_old_specs_as_the_old_launcher() -> None:
    old = {"kind": "local", "kv_cache_gib": 1}  # a campaign stored before the settings existed
    assert runtime_label(old) == "openmp gnu, wait runtime, bind none, 4k pages"
    new = bare(openmp="intel", cpu_binding="pin").model_dump(mode="json")
    assert runtime_label(new) == "openmp intel, wait runtime, bind pin, 4k pages"
    host = {"hostname": "h", "cpus": 2}
    assert launch_class({"spec": {"launcher": old}, "host": host}) != launch_class(
        {"spec": {"launcher": new}, "host": host}
    )
    same = LocalLaunchSpec().model_dump(mode="json")
    assert launch_class({"spec": {"launcher": same}, "host": host}) == launch_class(
        {"spec": {"launcher": dict(same)}, "host": host}
    )


def test_the_record_names_what_was_applied(tmp_path: Path) -> None:
    spec = bare(openmp="intel", cpu_binding="pin")
    env = runtime_env(spec, fake_engine_python(tmp_path), {}, [0, 1])
    record = runtime_record(spec, env, [0, 1])
    assert record["label"] == runtime_label(spec.model_dump())
    assert record["engine_cpus"] == [1] and record["frontend_cpus"] == [0]
    assert record["env"]["OMP_NUM_THREADS"] == "1" and "libiomp5" in record["env"]["LD_PRELOAD"]


def _allowed(pid: int) -> set[tuple[int, ...]]:
    """The CPUs each thread of a process may run on."""
    return {tuple(sorted(os.sched_getaffinity(int(tid)))) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs"
)
def test_pin_binds_the_engine_core_and_the_frontend_apart() -> None:
    """A process group like vLLM's (an API server whose child is the engine core, with threads of its own):
    every engine thread lands on the engine CPUs, the server's on the frontend's, this process's too."""
    cpus = sorted(os.sched_getaffinity(0))
    # the engine core titles itself as vLLM's does (prctl PR_SET_NAME), then starts threads of its own
    threads = (
        "import ctypes, threading, time; ctypes.CDLL(None).prctl(15, b'VLLM::EngineCore'); "
        "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]; time.sleep(60)"
    )
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {threads!r}]); "
            "time.sleep(60)",
        ],
        start_new_session=True,
    )
    before = sorted(os.sched_getaffinity(0))
    try:
        time.sleep(1.5)  # the child and its threads exist
        (engine,) = psutil.Process(server.pid).children()
        assert len(os.listdir(f"/proc/{engine.pid}/task")) >= 4
        bound = bind_after_ready(LocalLaunchSpec(cpu_binding="pin"), server.pid, client="planted")
        frontend, engine_cpus = cpu_split(LocalLaunchSpec(cpu_binding="pin"), cpus)
        assert _allowed(engine.pid) == {tuple(engine_cpus)}
        assert _allowed(server.pid) == {tuple(frontend)}
        assert sorted(os.sched_getaffinity(0)) == frontend
        assert bound["engine_threads"] >= 4 and bound["frontend_threads"] >= 1
        release_client("planted")
        assert sorted(os.sched_getaffinity(0)) == before  # the client's CPUs back with no pinned engine left
    finally:
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), before)
        os.killpg(server.pid, 9)
        server.wait()


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs"
)
def test_the_client_stays_bound_until_the_last_pinned_engine_goes() -> None:
    """Two launchers each pin an engine (a test session's pool): the client is released after the second."""
    before = sorted(os.sched_getaffinity(0))
    try:
        bind_client("a", before[:1])
        bind_client("b", before[:1])
        release_client("a")
        assert sorted(os.sched_getaffinity(0)) == before[:1]
        release_client("b")
        assert sorted(os.sched_getaffinity(0)) == before
    finally:
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), before)


def test_the_default_launcher_pins_the_engine_with_passive_waits(tmp_path: Path) -> None:
    """The adopted default (docs/performance.md, "Launch spread"): one engine thread bound apart, libgomp
    threads that sleep instead of spinning."""
    env = runtime_env(LocalLaunchSpec(), fake_engine_python(tmp_path), {}, [0, 1])
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs"
)
def test_an_engine_without_vllms_process_titles_is_bound_whole() -> None:
    """A custom engine command (or the tests' stand-in): the whole group goes to the engine CPUs, said so."""
    before = sorted(os.sched_getaffinity(0))
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        time.sleep(0.5)
        bound = bind_after_ready(LocalLaunchSpec(cpu_binding="pin"), server.pid)
        _, engine_cpus = cpu_split(LocalLaunchSpec(cpu_binding="pin"), before)
        assert _allowed(server.pid) == {tuple(engine_cpus)}
        assert bound["frontend_threads"] == 0 and "whole process group" in bound["note"]
        assert sorted(os.sched_getaffinity(0)) == before  # no client named: this process left alone
    finally:
        os.killpg(server.pid, 9)
        server.wait()


def test_the_effective_configuration_states_the_runtime_so_a_mixed_comparison_is_a_confound(
    tmp_path: Path,
) -> None:
    """observe_engine_config takes the launcher's label beside what the engine states (here nothing answers),
    and two deployments launched differently differ in it: the confound check lists it."""
    from artifacts.documents import EffectiveEngineConfig
    from tasks.launch.base import Deployment
    from tasks.metrics.engine_config import observe_engine_config

    def deployed(spec: LocalLaunchSpec) -> EffectiveEngineConfig:
        deployment = Deployment(
            id="d",
            launcher="local",
            variant=Variant(name="plain", method="none"),
            served_model_name="m",
            base_url="http://127.0.0.1:9",  # nothing listens: only the launcher's statement is read
            metrics_url="http://127.0.0.1:9/metrics",
            directory=tmp_path,
            extra={"cpu_runtime": runtime_record(spec, {}, [0, 1])},
        )
        return EffectiveEngineConfig.model_validate(observe_engine_config(deployment))

    pinned, unbound = deployed(LocalLaunchSpec()), deployed(bare())
    assert (
        pinned.cpu_runtime == "openmp gnu, wait passive, bind pin, 4k pages" and "launcher" in pinned.sources
    )
    assert pinned.differences(unbound) == [
        "cpu_runtime: openmp gnu, wait passive, bind pin, 4k pages -> openmp gnu, wait runtime, bind none, 4k pages"
    ]
