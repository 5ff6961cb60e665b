"""How the embedded engine's CPU threads run: the OpenMP runtime, its wait policy, where the threads are bound,
and huge pages (experiments/spec.py LocalLaunchSpec: openmp, omp_wait_policy, cpu_binding, huge_pages).

Why a launcher setting and not the engine's business: with the uniprocess executor vLLM skips its CPU thread
binding ("UniProc is not supported as it is not possible to set the OMP environment correctly",
vllm/platforms/cpu.py), so the engine ran unbound, spinning libgomp threads on the same cores as the API
server, the load client and Prefect; and vLLM warns that speculation without Intel OpenMP loses a lot, which
handicaps the speculative arms against plain. benchmarks/launch_spread.py measures every setting side by side
(docs/performance.md, "Launch spread"); the spec's defaults are the winner.

- `runtime_env`: the environment a launch gets (plain and every speculative arm alike).
- `bind_after_ready`: for `cpu_binding: pin`, once the engine serves, every thread of its engine core (and of
  any worker process) goes to the engine's CPUs, the API server's and this process's to the frontend's.
- `runtime_record`: what was applied, stored in deployment.json (`extra.cpu_runtime`) and in the effective
  configuration, so that deployments launched differently are never compared or pooled as if alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil

from experiments.spec import LocalLaunchSpec, runtime_label
from specgauge.errors import LaunchError

# The process titles vLLM gives its engine core and worker processes (setproctitle sets the command line and
# the 15-character name psutil reads): what `pin` moves onto the engine's CPUs.
ENGINE_TITLES = ("VLLM::EngineCor", "VLLM::Worker")


def cpu_split(spec: LocalLaunchSpec, cpus: list[int] | None = None) -> tuple[list[int], list[int]]:
    """(frontend CPUs, engine CPUs) of this machine: the first `frontend_cpus` CPUs this process may use for
    the API server, the client and Prefect, the rest for the engine. One CPU: both share it."""
    allowed = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(allowed) <= spec.frontend_cpus:
        return allowed, allowed
    return allowed[: spec.frontend_cpus], allowed[spec.frontend_cpus :]


def iomp_library(engine_python: Path | str) -> Path:
    """The Intel OpenMP runtime the engine venv ships (the intel-openmp wheel puts it in <venv>/lib)."""
    return Path(engine_python).parent.parent / "lib" / "libiomp5.so"


def runtime_env(
    spec: LocalLaunchSpec, engine_python: Path | str, environ: dict[str, str], cpus: list[int] | None = None
) -> dict[str, str]:
    """The variables a launch sets for the spec's CPU runtime (the caller's and the target's env win)."""
    env: dict[str, str] = {}
    frontend, engine = cpu_split(spec, cpus)
    if spec.openmp == "intel":
        library = iomp_library(engine_python)
        if not library.exists():
            raise LaunchError(
                f"launcher.openmp is intel but {library} is missing: the engine venv's intel-openmp package "
                "ships it (`make engine`), or set launcher.openmp: gnu"
            )
        preload = environ.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = ":".join(p for p in (str(library), preload) if p)
        # how long a thread spins after a parallel region before it sleeps: 1 ms hands the core back to the
        # API server between steps (vLLM's own binding uses 5)
        env["KMP_BLOCKTIME"] = "0" if spec.omp_wait_policy == "passive" else "1"
    if spec.omp_wait_policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    if spec.cpu_binding == "pin":
        env["OMP_NUM_THREADS"] = str(len(engine))
    elif spec.cpu_binding == "vllm":
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in engine)
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(len(frontend))
    if spec.huge_pages:
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    return env


def needs_multiprocess_executor(spec: LocalLaunchSpec) -> bool:
    """vLLM binds its threads only when its multiprocess executor spawns the worker."""
    return spec.cpu_binding == "vllm"


def runtime_record(
    spec: LocalLaunchSpec, env: dict[str, str], cpus: list[int] | None = None
) -> dict[str, Any]:
    """What a deployment ran with, for deployment.json and the effective configuration."""
    frontend, engine = cpu_split(spec, cpus)
    record: dict[str, Any] = {
        "openmp": spec.openmp,
        "omp_wait_policy": spec.omp_wait_policy,
        "cpu_binding": spec.cpu_binding,
        "huge_pages": spec.huge_pages,
        "frontend_cpus": frontend if spec.cpu_binding != "none" else None,
        "engine_cpus": engine if spec.cpu_binding != "none" else None,
    }
    record["label"] = runtime_label(record)
    names = ("LD_PRELOAD", "KMP_BLOCKTIME", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GLIBC_TUNABLES")
    record["env"] = {name: env[name] for name in (*names, "VLLM_CPU_OMP_THREADS_BIND") if name in env}
    return record


def _engine_processes(group: list[psutil.Process]) -> list[psutil.Process]:
    found = []
    for proc in group:
        try:
            title = (proc.cmdline() or [""])[0]
            if proc.name().startswith(ENGINE_TITLES) or title.startswith(ENGINE_TITLES):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _bind_threads(pid: int, cpus: list[int]) -> int:
    """Every thread of a process onto `cpus` (sched_setaffinity binds one thread; threads that exist keep
    their own mask); the number of threads moved."""
    moved = 0
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return 0
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            moved += 1
        except OSError:  # the thread ended meanwhile
            continue
    return moved


# This process's CPUs before the first pinned deployment bound it, and the deployments that keep it bound: one
# record for the whole process, since several launchers (a test session's engine pool) may pin at once.
_CLIENT_CPUS: list[int] | None = None
_PINNED: set[str] = set()


def bind_client(deployment_id: str, cpus: list[int]) -> int:
    """This process's threads (the load client) onto `cpus` while `deployment_id` is up; threads moved."""
    global _CLIENT_CPUS
    if _CLIENT_CPUS is None:
        _CLIENT_CPUS = sorted(os.sched_getaffinity(0))
    _PINNED.add(deployment_id)
    return _bind_threads(os.getpid(), cpus)


def release_client(deployment_id: str) -> None:
    """The client's CPUs back to what they were once no pinned deployment is left."""
    global _CLIENT_CPUS
    _PINNED.discard(deployment_id)
    if _PINNED or _CLIENT_CPUS is None:
        return
    _bind_threads(os.getpid(), _CLIENT_CPUS)
    _CLIENT_CPUS = None


def bind_after_ready(
    spec: LocalLaunchSpec, leader_pid: int, cpus: list[int] | None = None, *, client: str | None = None
) -> dict[str, Any]:
    """`cpu_binding: pin`: the engine core's (and workers') threads onto the engine CPUs; the API server's, and
    this process's (the load client, whose workers inherit it; `client`: the deployment id that holds it there
    until release_client) onto the frontend CPUs. An engine command without vLLM's process titles (a custom
    engine, the tests' stand-in) is bound whole to the engine CPUs, and the record says so. Returns what was
    bound."""
    frontend, engine = cpu_split(spec, cpus)
    try:
        leader = psutil.Process(leader_pid)
        group = [leader, *leader.children(recursive=True)]
    except psutil.Error as exc:
        raise LaunchError(f"cannot bind the engine's threads: process {leader_pid} is gone ({exc})") from None
    engines = _engine_processes(group)
    whole = not engines
    if whole:
        engines = group
    engine_pids = {p.pid for p in engines}
    bound: dict[str, Any] = {"engine_threads": 0, "frontend_threads": 0}
    if whole:
        bound["note"] = "no vLLM engine core process: the whole process group bound to the engine CPUs"
    for proc in group:
        on_engine = proc.pid in engine_pids
        count = _bind_threads(proc.pid, engine if on_engine else frontend)
        bound["engine_threads" if on_engine else "frontend_threads"] += count
    if client is not None:
        bound["client_threads"] = bind_client(client, frontend)
    return bound


def huge_page_kib(pid: int) -> int | None:
    """AnonHugePages of a process tree in KiB (smaps_rollup), or None where unreadable."""
    total, seen = 0, False
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return None
    for proc in procs:
        try:
            text = Path(f"/proc/{proc.pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("AnonHugePages:"):
                total += int(line.split()[1])
                seen = True
    return total if seen else None
