"""Running the emulator: in the foreground (the CLI), in a background thread, or as a child process.

Tests and benchmarks that time the client want the emulator in another process (`EmulatorProcess`), so
that the server's work never competes with the client for the GIL; `EmulatorThread` is for quick checks.
Both pick a free port (`port=0`) and expose `url`, and both reconfigure a running server through
`POST /emulator/config`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from emulator.config import EmulatorConfig, build_parser, config_from_args
from emulator.server import Emulator

READY_PREFIX = "emulator listening on "


def new_event_loop(kind: str = "uvloop") -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        try:
            import uvloop

            return uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio still works
            pass
    return asyncio.new_event_loop()


async def serve(
    config: EmulatorConfig,
    ready: threading.Event | None = None,
    stop: asyncio.Event | None = None,
    announce: bool = True,
) -> None:
    emulator = Emulator(config)
    port = await emulator.start()
    emulator.state.config = dataclasses.replace(emulator.config, port=port)
    if announce:
        print(f"{READY_PREFIX}http://{config.host}:{port}", flush=True)
    if ready is not None:
        ready.port = port  # type: ignore[attr-defined]
        ready.set()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await emulator.stop()


def main(argv: list[str] | None = None, prog: str = "python -m emulator") -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    loop_kind = "uvloop"
    if "--loop" in argv:  # not an emulator config field: how the process runs it
        at = argv.index("--loop")
        loop_kind = argv[at + 1] if at + 1 < len(argv) else ""
        del argv[at : at + 2]
        if loop_kind not in ("uvloop", "asyncio"):
            build_parser(prog).error("--loop takes uvloop or asyncio")
    if "-h" in argv or "--help" in argv:
        parser = build_parser(prog)
        parser.epilog = "--loop {uvloop,asyncio}: event loop (default uvloop)."
        parser.parse_args(["--help"])
    config = config_from_args(argv, prog)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a connection per concurrent stream
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    loop = new_event_loop(loop_kind)
    try:
        loop.run_until_complete(serve(config))
    except OSError as exc:  # the port is taken, the address is not this host's: one line, exit 2
        print(
            f"{prog}: error: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    finally:
        loop.close()


def config_args(config: EmulatorConfig) -> list[str]:
    """The command-line options that reproduce `config` (for a child process)."""
    args: list[str] = []
    for f in dataclasses.fields(EmulatorConfig):
        value = getattr(config, f.name)
        if value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, tuple):
            args += [flag, ",".join(repr(v) for v in value)]
        elif value is not None:
            args += [flag, str(value)]
    return args


class _Handle:
    url: str

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change fields of the running emulator's config; returns the whole config."""
        response = httpx.post(f"{self.url}/emulator/config", json=changes, timeout=10)
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/emulator/stats", timeout=10).json()

    def reset_stats(self) -> dict[str, Any]:
        return httpx.post(f"{self.url}/emulator/stats/reset", timeout=10).json()

    def trace(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.url}/emulator/trace", timeout=30).json()["requests"]

    def restart(self) -> None:
        httpx.post(f"{self.url}/emulator/restart", timeout=10).raise_for_status()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class EmulatorThread(_Handle):
    """The emulator on its own event loop in a daemon thread of this process."""

    def __init__(self, config: EmulatorConfig | None = None, loop: str = "asyncio") -> None:
        self.config = config or EmulatorConfig(port=0)
        self.loop_kind = loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = new_event_loop(self.loop_kind)
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._stop = asyncio.Event()
            try:
                loop.run_until_complete(serve(self.config, ready, self._stop, announce=False))
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="emulator", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("emulator thread did not start listening within 10 s")
        self.url = f"http://{self.config.host}:{ready.port}"  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        self._thread = None


class EmulatorProcess(_Handle):
    """The emulator as a child process (`python -m emulator --port 0 ...`), stopped with SIGTERM."""

    def __init__(
        self,
        config: EmulatorConfig | None = None,
        *,
        python: str | None = None,
        extra_args: list[str] | None = None,
        cpu: int | None = None,
    ) -> None:
        self.config = config or EmulatorConfig(port=0)
        self.python = python or sys.executable
        self.extra_args = extra_args or []
        self.cpu = cpu
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, timeout_s: float = 30.0) -> None:
        repo = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [self.python, "-m", "emulator", *config_args(self.config), *self.extra_args]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=repo
        )
        if self.cpu is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, {self.cpu})
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith(READY_PREFIX):
                self.url = line[len(READY_PREFIX) :].strip()
                return
        self.stop()
        stderr = self.proc.stderr.read() if self.proc.stderr else ""
        raise RuntimeError(f"emulator did not start: {' '.join(cmd)}\n{stderr[-2000:]}")

    def cpu_seconds(self) -> float:
        """User + system CPU time the emulator process has used so far (Linux /proc)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
