"""SSH against the real OpenSSH server of tests/services/sshd.sh (127.0.0.1:2222): commands, SFTP,
reconnecting after the connection is dropped, tunnels, host-key policies and key handling."""

from __future__ import annotations

import http.server
import logging
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from stand_ins.cluster import SSHD_DIR, SSHD_PORT, ensure_services, ssh_config

from specgauge.errors import InputError
from tasks.launch.local import free_port
from tasks.launch.ssh import SSHConfig, SSHError, SSHSession

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def sshd() -> None:
    ensure_services("sshd")


@pytest.fixture
def session() -> Iterator[SSHSession]:
    with SSHSession(ssh_config()) as s:
        yield s


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """A plain HTTP server on this host: what a tunnel reaches on the cluster side."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = f"path={self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def drop_connection(session: SSHSession) -> None:
    """Kill the sshd process serving this session: the connection dies as in a network outage."""
    with pytest.raises(SSHError, match="connection lost"):
        session.run("kill -9 $PPID; sleep 5")
    assert not session.connected


def test_commands_return_exit_code_stdout_and_stderr(session: SSHSession) -> None:
    result = session.run("echo out; echo err >&2; exit 3")
    assert (result.rc, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert session.run('printf %s "$SLURM_CONF"').stdout.endswith("slurm.conf")  # sshd's SetEnv
    with pytest.raises(SSHError, match=r"false failed \(exit 1\)"):
        session.run("false").check("false")


def test_command_timeout_is_an_error(session: SSHSession) -> None:
    with pytest.raises(SSHError, match="did not finish within"):
        session.run("sleep 5", timeout=0.5)
    assert session.run("echo still usable").stdout == "still usable\n"


def test_sftp_mkdir_write_read_put_get(session: SSHSession, tmp_path: Path) -> None:
    remote = f"{tmp_path}/remote/a/b/c"
    session.mkdir_p(remote)
    session.mkdir_p(remote)  # idempotent
    session.write_text(f"{remote}/log.txt", "".join(f"line {i}\n" for i in range(1000)))
    assert session.read_text(f"{remote}/log.txt").count("\n") == 1000
    assert session.read_text(f"{remote}/log.txt", tail_bytes=9) == "line 999\n"
    local = tmp_path / "payload.bin"
    local.write_bytes(bytes(range(256)) * 100)
    session.put(local, f"{remote}/payload.bin")
    session.get(f"{remote}/payload.bin", tmp_path / "back" / "payload.bin")
    assert (tmp_path / "back" / "payload.bin").read_bytes() == local.read_bytes()
    assert session.exists(f"{remote}/payload.bin")
    assert not session.exists(f"{remote}/missing")
    with pytest.raises(FileNotFoundError):
        session.read_text(f"{remote}/missing")
    assert session.expand("~/x") == f"{session.home()}/x"


def test_dropped_connection_is_reestablished_on_the_next_call(session: SSHSession, tmp_path: Path) -> None:
    assert session.run("echo before").rc == 0
    drop_connection(session)
    # The next call reconnects by itself: commands and SFTP both work again.
    assert session.run("echo after").stdout == "after\n"
    session.write_text(f"{tmp_path}/f.txt", "sftp after reconnect")
    assert session.read_text(f"{tmp_path}/f.txt") == "sftp after reconnect"
    assert session.reconnects >= 1


def test_idempotent_command_is_rerun_after_a_drop_mid_command(session: SSHSession, tmp_path: Path) -> None:
    flag = tmp_path / "dropped-once"
    command = f"if [ ! -e {flag} ]; then touch {flag}; kill -9 $PPID; sleep 5; fi; echo done"
    assert session.run(command, idempotent=True).stdout == "done\n"
    assert flag.exists()


def test_reconnect_attempts_are_bounded() -> None:
    closed_port = free_port()
    config = ssh_config(port=closed_port, reconnect_attempts=2, reconnect_backoff_s=0)
    session = SSHSession(config)
    with pytest.raises(SSHError, match="after 2 attempt") as caught:
        session.run("true")
    assert caught.value.transient


def test_tunnel_reaches_a_cluster_side_port_and_survives_a_reconnect(session: SSHSession, web: int) -> None:
    tunnel = session.forward("127.0.0.1", web)
    assert tunnel.url.startswith("http://127.0.0.1:") and tunnel.local_port != web
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{tunnel.url}/metrics").text == "path=/metrics"
        drop_connection(session)
        assert client.get(f"{tunnel.url}/v1/models").text == "path=/v1/models"  # new channel, new connection
        # Nothing listens on the far side: the local connection is closed, the caller sees a transport error.
        refused = session.forward("127.0.0.1", free_port())
        with pytest.raises(httpx.TransportError):
            client.get(f"{refused.url}/health")
    tunnel.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{tunnel.url}/", timeout=2)


def test_unknown_host_key_is_refused_by_default(tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(SSHError, match="host key not in") as caught:
        SSHSession(ssh_config(known_hosts=empty)).connect()
    assert not caught.value.transient
    with pytest.raises(SSHError, match="does not exist"):
        SSHSession(ssh_config(known_hosts=tmp_path / "absent")).connect()


def test_accept_new_remembers_the_key_and_refuses_a_changed_one(tmp_path: Path) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    with SSHSession(ssh_config(known_hosts=known, host_key_policy="accept-new")) as session:
        assert session.run("true").rc == 0
    server_key = (SSHD_DIR / "host_ed25519.pub").read_text().split()[1]
    assert server_key in known.read_text() and f"[127.0.0.1]:{SSHD_PORT}" in known.read_text()
    # A different key for the same host (as after a man-in-the-middle): refused even under accept-new.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()
    known.write_text(f"[127.0.0.1]:{SSHD_PORT} {other[0]} {other[1]}\n")
    with pytest.raises(SSHError, match="does not match") as caught:
        SSHSession(ssh_config(known_hosts=known, host_key_policy="accept-new")).connect()
    assert not caught.value.transient


def test_insecure_policy_connects_and_says_so_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = ssh_config(known_hosts=tmp_path / "none", host_key_policy="insecure")
    with caplog.at_level(logging.WARNING, logger="specgauge.ssh"), SSHSession(config) as session:
        assert session.run("echo ok").stdout == "ok\n"
    assert any("INSECURE" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert not (tmp_path / "none").exists()  # nothing remembered


def test_key_from_a_secret_string_never_reaches_logs(caplog: pytest.LogCaptureFixture) -> None:
    key_text = (SSHD_DIR / "client_ed25519").read_text()
    secret_line = key_text.splitlines()[1]
    config = ssh_config(key_path=None, private_key=SecretStr(key_text))
    with caplog.at_level(logging.DEBUG), SSHSession(config) as session:
        assert session.run("echo ok").stdout == "ok\n"
    assert secret_line not in caplog.text
    assert secret_line not in repr(config) and secret_line not in str(config.describe())
    assert config.describe()["key_path"] is None


def test_wrong_key_fails_authentication_and_bad_keys_are_named(tmp_path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True
    )
    with pytest.raises(SSHError, match="authentication failed") as caught:
        SSHSession(ssh_config(key_path=tmp_path / "stranger")).connect()
    assert not caught.value.transient
    (tmp_path / "garbage").write_text("not a key\n")
    with pytest.raises(InputError, match="could not be loaded"):
        SSHSession(ssh_config(key_path=tmp_path / "garbage")).connect()
    with pytest.raises(InputError, match="not an Ed25519, ECDSA or RSA key"):
        SSHSession(ssh_config(key_path=None, private_key=SecretStr("garbage"))).connect()
    with pytest.raises(ValueError, match="exactly one of key_path or private_key"):
        SSHConfig(host="h", user="u")
