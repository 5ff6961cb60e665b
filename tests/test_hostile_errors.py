"""Issue 34, findings 6-8 (the CLI and report-server part): every failure is one `error:` line, never a
traceback; no silent wrong; a hostile report-server client costs a bounded number of threads.

Real parts: the CLI as a subprocess (`python -m cli`, SPECGAUGE_HOME a tmp dir), a real report server on a
loopback port and real sockets, the campaign flow on the session's Prefect test server with the stand-in
engine (tests/reliability_support.py). What each test saw is recorded for docs/reliability.md (`observe`).
"""

from __future__ import annotations

import http.client
import os
import resource
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import typer
from cli_support import cli_run
from reliability_support import REPO, corpus, emulator_spec, write_spec
from typer.testing import CliRunner

pytest_plugins = ["reliability_support"]

TRACEBACK = "Traceback (most recent call last)"
MEMORY_LIMIT = 3 << 30  # the CLI's address space: the old code read /dev/zero until MemoryError, not forever


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_cli(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECGAUGE_HOME": str(home)}
    env.pop("SPECGAUGE_DEBUG", None)
    return cli_run(env, *args, timeout=timeout, preexec_fn=_limit_memory)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The run's error line; asserts it is the only thing on stderr and no traceback was printed."""
    assert TRACEBACK not in done.stdout + done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    return lines[0]


def busy_port() -> tuple[socket.socket, int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder, holder.getsockname()[1]


# -- finding 6: inputs that raised a traceback --------------------------------------------------------------
def test_inputs_that_raised_a_traceback_give_one_error_line(tmp_path: Path, observe) -> None:
    home = tmp_path / "home"
    no_weights = tmp_path / "head-without-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((REPO / "models" / "tiny-eagle3" / "config.json").read_text())
    holder, taken = busy_port()
    cases: dict[str, tuple[list[str], str]] = {
        "metrics file /dev/zero": (["metrics-delta", "/dev/zero", "/dev/null", "--model", "m"], "64 MiB"),
        "profile --counters /dev/zero": (
            ["profile", "analyze", str(tmp_path), "--counters", "/dev/zero", "/dev/null", "--model", "m"],
            "64 MiB",
        ),
        "drafters confirm: a head without weights": (
            ["drafters", "confirm", "--new", str(no_weights), "--target", "code"],
            "safetensors",
        ),
        "drafters confirm --gain-metric bogus": (
            ["drafters", "confirm", "--new", str(no_weights), "--target", "code", "--gain-metric", "bogus"],
            "gain_metric must be one of",
        ),
        "reports serve on a taken port": (
            ["reports", "serve", "--port", str(taken)],
            f"port {taken}: Address already in use",
        ),
        "reports serve on a host that does not resolve": (
            ["reports", "serve", "--host", "no-such-host.invalid", "--port", "0"],
            "cannot serve on 'no-such-host.invalid'",
        ),
        "reports serve on an address not of this host": (
            ["reports", "serve", "--host", "192.0.2.1", "--port", "0"],  # TEST-NET-1: bind only, no traffic
            "cannot serve on '192.0.2.1'",
        ),
    }
    seen: dict[str, str] = {}
    try:
        for name, (args, expected) in cases.items():
            done = run_cli(home, *args, timeout=30)
            assert done.returncode == 2, (name, done.returncode, done.stderr[-2000:])
            line = one_error_line(done)
            assert expected in line, (name, line)
            seen[name] = f"rc {done.returncode}, {line[:90]}"
    finally:
        holder.close()
    # an out-of-range port is a usage error: typer's usage text and exit 2, no traceback
    bad_port = run_cli(home, "reports", "serve", "--port", "99999", timeout=30)
    assert bad_port.returncode == 2 and TRACEBACK not in bad_port.stderr
    assert "65535" in bad_port.stderr, bad_port.stderr
    seen["reports serve --port 99999"] = "rc 2, usage error: less than or equal to 65535"
    observe(
        "inputs that raised a traceback",
        done=f"{len(seen)} commands as a user would type them: " + "; ".join(seen),
        expected="each: one `error:` line naming the input, exit 2, no traceback (usage errors: usage, exit 2)",
        observed="; ".join(f"{name}: {what}" for name, what in seen.items()),
    )


def test_a_nul_in_a_report_url_is_answered_400(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    from analysis.serve import serving

    (tmp_path / "camp-1").mkdir()
    (tmp_path / "camp-1" / "index.html").write_text("<html>the report</html>")
    with serving(tmp_path) as base:
        host, port = base.removeprefix("http://").split(":")
        for path in ("/camp-1/index%00.html", "/%00", "/camp-1%00/index.html"):
            con = http.client.HTTPConnection(host, int(port), timeout=10)
            con.request("GET", path)
            response = con.getresponse()
            assert response.status == 400, (path, response.status)
            con.close()
        con = http.client.HTTPConnection(host, int(port), timeout=10)
        con.request("GET", "/camp-1/index.html")  # the server still serves
        assert con.getresponse().read() == b"<html>the report</html>"
    assert TRACEBACK not in capfd.readouterr().err  # the old handler died with one for each


# -- the one boundary: whatever escapes a command is one line -------------------------------------------------
def _boundary_app() -> typer.Typer:
    """An app with the CLI's real root group, whose commands raise what a library may raise."""
    from cli.app import ErrorBoundary

    app = typer.Typer(cls=ErrorBoundary, pretty_exceptions_enable=False)
    raisers: dict[str, BaseException] = {
        "oserror": PermissionError(13, "Permission denied", "/etc/locked-file"),
        "recursion": RecursionError("maximum recursion depth exceeded"),
        "memory": MemoryError(),
        "value": ValueError("invalid literal for int() with base 10: 'x'"),
        "interrupt": KeyboardInterrupt(),
        "bug": ZeroDivisionError("division by zero"),
    }
    for name, exc in raisers.items():

        def command(exc: BaseException = exc) -> None:
            raise exc

        app.command(name)(command)
    app.command("usage")(lambda count: None)  # a missing argument: click's usage error
    return app


@pytest.mark.parametrize(
    ("command", "code", "expected"),
    [
        ("oserror", 2, "error: '/etc/locked-file': Permission denied"),
        ("recursion", 2, "error: input nested too deeply"),
        ("memory", 2, "error: out of memory: an input is too large"),
        ("value", 2, "error: invalid input: invalid literal for int()"),
        ("interrupt", 130, "error: interrupted"),
        ("bug", 2, "error: internal error: ZeroDivisionError: division by zero (set SPECGAUGE_DEBUG=1"),
    ],
)
def test_the_boundary_turns_every_exception_into_one_line(
    command: str, code: int, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _boundary_app()
    monkeypatch.delenv("SPECGAUGE_DEBUG", raising=False)
    done = CliRunner().invoke(app, [command], catch_exceptions=False)
    assert done.exit_code == code, done.output
    assert done.stderr.strip() == done.stderr.strip().splitlines()[0] and done.stderr.startswith(expected)
    assert TRACEBACK not in done.output
    monkeypatch.setenv("SPECGAUGE_DEBUG", "1")  # the traceback too, then the same line
    debug = CliRunner().invoke(app, [command], catch_exceptions=False)
    assert debug.exit_code == code and TRACEBACK in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith(expected)


def test_usage_errors_keep_their_usage_text_and_exit_2() -> None:
    done = CliRunner().invoke(_boundary_app(), ["usage"], catch_exceptions=False)
    assert done.exit_code == 2 and "Usage:" in done.output and "Missing argument" in done.output


# -- finding 7: silent wrongs -----------------------------------------------------------------------------
def test_emulator_port_out_of_range_is_refused(tmp_path: Path) -> None:
    done = run_cli(tmp_path / "home", "emulator", "--port", "99999", timeout=20)  # old code: listened forever
    assert done.returncode == 2, done.stderr
    assert "port must be in 0..65535" in done.stderr and TRACEBACK not in done.stderr
    assert "listening" not in done.stdout
    assert "0: any free port" in run_cli(tmp_path / "home", "emulator", "--help", timeout=20).stdout


@pytest.mark.server  # a real Prefect API
def test_a_campaign_whose_every_launch_failed_exits_1_with_a_summary(
    prefect_api, standin_engine, tmp_path: Path, observe
) -> None:
    from cli.app import app

    work = corpus(tmp_path / "w.jsonl", [("ok-0", "code", "def add(a, b):", 8)])
    spec = write_spec(
        tmp_path / "s.yaml",
        emulator_spec(
            "rel-allfail",
            work,
            launcher={"kind": "local", "ready_timeout_s": 1},
            validity={"client_calibration": False},  # 20 s of calibration would measure nothing here
        ),
    )
    standin_engine.write_text("--never-ready")  # /health answers 503 forever: every launch times out
    started = time.monotonic()
    done = CliRunner().invoke(
        app,
        ["campaign", "run", str(spec), "--no-ingest", "--no-gate", "--no-analyze"],
        catch_exceptions=False,
    )
    seconds = time.monotonic() - started
    assert done.exit_code == 1, (done.exit_code, done.output[-3000:])
    summary = [line for line in done.stderr.splitlines() if line.startswith("error: every launch failed")]
    assert len(summary) == 1, done.stderr[-3000:]
    assert ".plain.r0: " in summary[0] and "not ready after 1 s" in summary[0], summary[0]
    # (Prefect's own log of the failed launch task carries its traceback: a log line, not the error line)
    assert not done.stderr.rstrip().splitlines()[-1].startswith(("Traceback", "  File")), done.stderr[-2000:]
    port_done = run_cli(tmp_path / "home", "emulator", "--port", "99999", timeout=20)
    assert port_done.returncode == 2
    observe(
        "silent wrongs (every launch failed, bad port, a foreign file as spec)",
        done="`campaign run` of a plain-only spec whose stand-in engine never gets ready (ready_timeout_s 1); "
        "`specgauge emulator --port 99999`",
        expected="campaign: exit 1 and one paragraph naming each slot and why (was exit 0); emulator: "
        "refused, exit 2 (was: listening on a random port)",
        observed=f"campaign: exit {done.exit_code} after {seconds:.0f} s, {summary[0][:160]}...; emulator: exit "
        f"{port_done.returncode}, {port_done.stderr.strip().splitlines()[-1][:80]}",
    )


# -- finding 8: a hostile report-server client --------------------------------------------------------------
def _threads() -> int:
    return threading.active_count()


def _get(base: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
    host, port = base.removeprefix("http://").split(":")
    con = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        con.request("GET", path)
        response = con.getresponse()
        return response.status, response.read()
    finally:
        con.close()


def test_a_hostile_report_server_client_costs_bounded_threads(tmp_path: Path, observe) -> None:
    import analysis.serve
    from analysis.serve import serving

    # (read with defaults so that the test runs, and fails on its assertions, against the unbounded server)
    REQUEST_TIMEOUT_S = getattr(analysis.serve, "REQUEST_TIMEOUT_S", 5.0)
    WORKERS = getattr(analysis.serve, "WORKERS", 16)

    root = tmp_path / "reports"
    (root / "camp-1").mkdir(parents=True)
    (root / "camp-1" / "index.html").write_text("<html>the report</html>")
    (root / ".hidden-notes").write_text("not for the browser")
    (root / "camp-2").mkdir()  # no index.html: served as a listing
    (root / "camp-2" / "chart.png").write_bytes(b"\x89PNG")
    (root / "camp-2" / ".tmp-chart").mkdir()
    (root / "elsewhere").symlink_to(tmp_path)
    (root / "camp-2" / "alias.png").symlink_to(root / "camp-2" / "chart.png")
    silent: list[socket.socket] = []
    with serving(root) as base:
        host, port = base.removeprefix("http://").split(":")
        before = _threads()
        for _ in range(200):  # connect and send nothing
            silent.append(socket.create_connection((host, int(port)), timeout=30))
        time.sleep(1.0)
        peak = _threads()
        started = time.monotonic()
        status, body = _get(base, "/camp-1/index.html", timeout=REQUEST_TIMEOUT_S)
        answer_s = time.monotonic() - started
        listing = _get(base, "/")[1].decode() + _get(base, "/camp-2/")[1].decode()
        hidden = _get(base, "/.hidden-notes")[0]
        # the silent ones are dropped after the request timeout: recv sees the end of the stream
        silent[0].settimeout(REQUEST_TIMEOUT_S + 10)
        waited = time.monotonic()
        dropped = silent[0].recv(1) == b""
        drop_s = time.monotonic() - waited + (waited - started)
        after_drop = _threads()
        for s in silent:
            s.close()
    assert status == 200 and body == b"<html>the report</html>"
    assert answer_s < REQUEST_TIMEOUT_S, answer_s
    assert peak - before <= WORKERS + 2, (before, peak)  # the pool (16) and the dispatcher, not 200 threads
    assert dropped and drop_s < REQUEST_TIMEOUT_S + 5, drop_s
    assert "camp-1" in listing and "chart.png" in listing
    for name in (".hidden-notes", ".tmp-chart", "elsewhere", "alias.png"):
        assert name not in listing, (name, listing)
    assert hidden == 404
    observe(
        "litter after a kill; a hostile report-server client",
        done="200 connections to the report server that send nothing, then a normal request; a folder with a "
        "dotfile, a dot-folder and two symlinks listed",
        expected=f"threads bounded (pool of {WORKERS}); the normal request answered at once; each silent "
        f"connection dropped after {REQUEST_TIMEOUT_S:.0f} s; listings without dotfiles or symlinks",
        observed=f"threads {before} -> {peak} with 200 silent connections ({after_drop} after the drops); "
        f"normal request {status} in {answer_s:.2f} s; silent connection dropped after {drop_s:.1f} s; "
        f"listing hides dotfiles and symlinks: {not any(n in listing for n in ('.hidden', 'elsewhere'))}; "
        f"GET /.hidden-notes: {hidden}",
    )


def test_report_server_stays_up_under_hostile_requests(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    from analysis.serve import serving

    (tmp_path / "index.html").write_text("ok")
    with serving(tmp_path) as base:
        host, port = base.removeprefix("http://").split(":")
        payloads = [
            b"\x00\xff" * 100 + b"\r\n\r\n",
            b"GET /" + b"a" * 70000 + b" HTTP/1.0\r\n\r\n",
            b"GET\r\n\r\n",
            b"GET /%00%ff%fe HTTP/1.0\r\n\r\n",
            b"GET /index.html HTTP/1.0\r\nHost: \x00\r\n\r\n",
        ]
        for payload in payloads:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(payload)
                s.recv(64)
        assert _get(base, "/index.html") == (200, b"ok")
    assert TRACEBACK not in capfd.readouterr().err  # the handler never died with a traceback
