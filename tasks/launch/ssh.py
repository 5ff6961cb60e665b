"""Reaching a cluster: SSH to its login node (paramiko), or the same interface run locally on it.

`SSHSession` authenticates with a key (a file or a secret string), checks the server's host key
(known_hosts by default), keeps the connection alive and re-establishes a dropped one on the next call,
runs commands, moves files over SFTP and forwards local ports to cluster-side addresses (`Tunnel`), so a
compute node's API and /metrics answer at http://127.0.0.1:<port> outside the cluster.

`LocalShell` offers the same calls when specgauge already runs on the login node. Launchers take either.
Secrets (private keys, passphrases) are never logged or written anywhere.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import select
import shlex
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import paramiko

from specgauge.errors import InputError, LaunchError
from tasks.launch.config import SSHConfig

log = logging.getLogger("specgauge.ssh")

# What a dropped or refused connection raises inside paramiko and the socket layer.
_CONNECTION_ERRORS = (paramiko.SSHException, OSError, EOFError)


class SSHError(LaunchError):
    """The cluster could not be reached, or a command over SSH failed. Transient unless said otherwise."""

    def __init__(self, message: str, *, transient: bool = True, log_tail: str = "") -> None:
        super().__init__(message, transient=transient, log_tail=log_tail)


class CommandResult(NamedTuple):
    command: str
    rc: int
    stdout: str
    stderr: str

    def check(self, what: str) -> CommandResult:
        """Raise SSHError naming `what` unless the command succeeded."""
        if self.rc != 0:
            detail = (self.stderr.strip() or self.stdout.strip())[-2000:]
            raise SSHError(f"{what} failed (exit {self.rc}): {detail}", transient=False)
        return self


class Endpoint(Protocol):
    url: str

    def close(self) -> None: ...


class Shell(Protocol):
    """What launchers need from a cluster login node, over SSH or locally."""

    description: str

    def run(self, command: str, timeout: float = 60.0, *, idempotent: bool = False) -> CommandResult: ...
    def expand(self, path: str) -> str: ...
    def mkdir_p(self, path: str) -> None: ...
    def write_text(self, path: str, text: str, mode: int = 0o644) -> None: ...
    def read_text(self, path: str, tail_bytes: int | None = None) -> str: ...
    def exists(self, path: str) -> bool: ...
    def put(self, local: Path, remote: str) -> None: ...
    def get(self, remote: str, local: Path) -> None: ...
    def forward(self, host: str, port: int) -> Endpoint: ...
    def close(self) -> None: ...


def load_private_key(config: SSHConfig) -> paramiko.PKey:
    """The key object; errors name the file but never show key material."""
    password = config.passphrase.get_secret_value() if config.passphrase else None
    if config.key_path is not None:
        path = Path(config.key_path).expanduser()
        if not path.exists():
            raise InputError(f"SSH key file {path} does not exist")
        try:
            return paramiko.PKey.from_path(str(path), password)
        except (paramiko.SSHException, ValueError, OSError) as exc:
            raise InputError(f"SSH key file {path} could not be loaded: {type(exc).__name__}") from None
    assert config.private_key is not None
    text = config.private_key.get_secret_value()
    for key_class in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return key_class.from_private_key(io.StringIO(text), password)
        except (paramiko.SSHException, ValueError):
            continue
    raise InputError(
        "the SSH private key given as a secret is not an Ed25519, ECDSA or RSA key (or the passphrase is wrong)"
    )


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: remember unknown hosts, still refuse changed keys."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        paramiko.AutoAddPolicy().missing_host_key(client, hostname, key)
        log.info("accepted the new host key of %s (%s %s)", hostname, key.get_name(), key.fingerprint)


class _InsecurePolicy(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        log.warning(
            "INSECURE: the host key of %s (%s %s) was NOT verified (host_key_policy=insecure); "
            "anyone on the path could read this session",
            hostname,
            key.get_name(),
            key.fingerprint,
        )


class SSHSession:
    """One SSH connection to a login node, re-established on demand. Thread-safe for concurrent calls."""

    def __init__(self, config: SSHConfig) -> None:
        self.config = config
        self.description = f"ssh {config.where}"
        self.reconnects = 0
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_transport: paramiko.Transport | None = None
        self._lock = threading.RLock()
        self._home: str | None = None
        self._tunnels: list[Tunnel] = []
        self._closed = False

    def __enter__(self) -> SSHSession:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connection -------------------------------------------------------------------------------
    def connect(self) -> None:
        self._transport()

    @property
    def connected(self) -> bool:
        transport = self._client.get_transport() if self._client else None
        return bool(transport and transport.is_active())

    def _new_client(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        policy = self.config.host_key_policy
        known = self.config.known_hosts_path
        if policy == "insecure":
            log.warning(
                "INSECURE: host key checking is off for %s (host_key_policy=insecure)", self.config.where
            )
            client.set_missing_host_key_policy(_InsecurePolicy())
            return client
        if policy == "accept-new":
            known.parent.mkdir(parents=True, exist_ok=True)
            known.touch(mode=0o600, exist_ok=True)
            client.load_host_keys(str(known))  # also where accepted keys are saved
            client.set_missing_host_key_policy(_AcceptNewPolicy())
            return client
        if not known.exists():
            raise SSHError(
                f"known_hosts file {known} does not exist: add {self.config.host}'s host key to it "
                "(ssh-keyscan) or choose host_key_policy accept-new",
                transient=False,
            )
        client.load_host_keys(str(known))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        return client

    def _connect_once(self) -> paramiko.SSHClient:
        client = self._new_client()
        try:
            client.connect(
                self.config.host,
                port=self.config.port,
                username=self.config.user,
                pkey=load_private_key(self.config),
                timeout=self.config.connect_timeout_s,
                banner_timeout=self.config.connect_timeout_s,
                auth_timeout=self.config.connect_timeout_s,
                allow_agent=False,
                look_for_keys=False,
            )
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        if self.config.keepalive_s:
            transport.set_keepalive(self.config.keepalive_s)
        return client

    def _transport(self) -> paramiko.Transport:
        """The live transport, (re)connecting with bounded attempts when there is none."""
        with self._lock:
            if self._closed:
                raise SSHError(f"{self.description}: session was closed", transient=False)
            transport = self._client.get_transport() if self._client else None
            if transport is not None and transport.is_active():
                return transport
            if self._client is not None:
                log.warning("%s: connection lost; reconnecting", self.description)
                self._client.close()
                self._client = None
                self.reconnects += 1
            last: BaseException | None = None
            for attempt in range(1, self.config.reconnect_attempts + 1):
                try:
                    self._client = self._connect_once()
                    transport = self._client.get_transport()
                    assert transport is not None
                    return transport
                except paramiko.BadHostKeyException as exc:
                    raise SSHError(
                        f"{self.description}: the host key of {exc.hostname} does not match "
                        f"{self.config.known_hosts_path} ({exc.key.get_name()} {exc.key.fingerprint}): refusing",
                        transient=False,
                    ) from None
                except paramiko.AuthenticationException as exc:
                    raise SSHError(
                        f"{self.description}: authentication failed ({exc})", transient=False
                    ) from None
                except paramiko.SSHException as exc:
                    if "not found in known_hosts" in str(exc):
                        raise SSHError(
                            f"{self.description}: host key not in {self.config.known_hosts_path} "
                            "(host_key_policy=known_hosts): add it (ssh-keyscan) or use accept-new",
                            transient=False,
                        ) from None
                    last = exc
                except (OSError, EOFError) as exc:
                    last = exc
                if attempt < self.config.reconnect_attempts:
                    time.sleep(self.config.reconnect_backoff_s * attempt)
            raise SSHError(
                f"{self.description}: cannot connect after {self.config.reconnect_attempts} attempt(s): "
                f"{type(last).__name__}: {last}"
            )

    def _drop(self, transport: paramiko.Transport | None = None) -> None:
        """Forget a connection found broken, so that the next call reconnects."""
        with self._lock:
            if self._client is not None and (transport is None or self._client.get_transport() is transport):
                self._client.close()
                self._client = None
                self._sftp = None
                self.reconnects += 1

    def close(self) -> None:
        for tunnel in list(self._tunnels):
            tunnel.close()
        with self._lock:
            self._closed = True
            if self._sftp is not None:
                try:
                    self._sftp.close()
                except _CONNECTION_ERRORS:
                    pass
                self._sftp = None
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- commands ---------------------------------------------------------------------------------
    def _open_session(self) -> tuple[paramiko.Transport, paramiko.Channel]:
        """A fresh channel; nothing has run yet, so a dead connection is simply re-established."""
        last: BaseException | None = None
        for _ in range(2):
            transport = self._transport()
            try:
                return transport, transport.open_session(timeout=self.config.connect_timeout_s)
            except _CONNECTION_ERRORS as exc:
                last = exc
                self._drop(transport)
        raise SSHError(f"{self.description}: cannot open a channel: {type(last).__name__}: {last}")

    def run(self, command: str, timeout: float = 60.0, *, idempotent: bool = False) -> CommandResult:
        """Run `command` in the login shell's `sh -c`; return exit code and output.

        A connection lost before the command starts is re-established. One lost while it runs raises
        SSHError, unless `idempotent` says that running it again is harmless (then it is re-run once).
        """
        for attempt in (1, 2):
            try:
                return self._run_once(command, timeout)
            except _Interrupted:
                if not idempotent or attempt == 2:
                    raise SSHError(
                        f"{self.description}: connection lost while running {command[:200]!r}; it may or "
                        "may not have taken effect"
                    ) from None
        raise AssertionError("unreachable")

    def _run_once(self, command: str, timeout: float) -> CommandResult:
        transport, channel = self._open_session()
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            channel.exec_command(command)
            while True:
                while channel.recv_ready():
                    out += channel.recv(1 << 16)
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(1 << 16)
                if (
                    channel.exit_status_ready()
                    and not channel.recv_ready()
                    and not channel.recv_stderr_ready()
                ):
                    break
                if not transport.is_active():
                    self._drop(transport)
                    raise _Interrupted()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SSHError(
                        f"{self.description}: {command[:200]!r} did not finish within {timeout:g} s"
                    )
                select.select([channel], [], [], min(remaining, 0.5))
            rc = channel.recv_exit_status()
            if rc == -1:  # no exit status: killed by a signal, or the connection went away under it
                for _ in range(20):
                    if not transport.is_active():
                        self._drop(transport)
                        raise _Interrupted()
                    time.sleep(0.025)
        except _CONNECTION_ERRORS:
            self._drop(transport)
            raise _Interrupted() from None
        finally:
            channel.close()
        return CommandResult(command, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    # -- files ------------------------------------------------------------------------------------
    def _sftp_client(self) -> paramiko.SFTPClient:
        transport = self._transport()
        with self._lock:
            if self._sftp is None or self._sftp_transport is not transport:
                self._sftp = paramiko.SFTPClient.from_transport(transport)
                self._sftp_transport = transport
            assert self._sftp is not None
            return self._sftp

    def _sftp_call(self, what: str, fn: Any) -> Any:
        """Run one SFTP operation; file operations are idempotent, so a dropped connection is retried once."""
        for attempt in range(2):
            sftp = self._sftp_client()
            try:
                return fn(sftp)
            except FileNotFoundError:
                raise
            except _CONNECTION_ERRORS as exc:
                transport = self._sftp_transport
                if transport is not None and transport.is_active():
                    # The connection is fine: the operation itself failed (permissions, a full disk ...).
                    raise SSHError(f"{self.description}: {what}: {exc}", transient=False) from None
                self._drop(transport)
                if attempt == 1:
                    raise SSHError(f"{self.description}: {what}: {type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")

    def home(self) -> str:
        if self._home is None:
            self._home = self._sftp_call("home directory", lambda s: s.normalize("."))
        return self._home

    def expand(self, path: str) -> str:
        """`~` and relative paths resolve against the remote home directory."""
        if path == "~":
            return self.home()
        if path.startswith("~/"):
            return posixpath.join(self.home(), path[2:])
        if not path.startswith("/"):
            return posixpath.join(self.home(), path)
        return path

    def mkdir_p(self, path: str) -> None:
        path = self.expand(path)

        def make(sftp: paramiko.SFTPClient) -> None:
            current = "/"
            for part in [p for p in path.split("/") if p]:
                current = posixpath.join(current, part)
                try:
                    if not stat.S_ISDIR(sftp.stat(current).st_mode or 0):
                        raise SSHError(
                            f"{self.description}: {current} exists and is not a directory", transient=False
                        )
                except FileNotFoundError:
                    sftp.mkdir(current)

        self._sftp_call(f"mkdir -p {path}", make)

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a whole file atomically (temporary name, then rename)."""
        path = self.expand(path)
        tmp = f"{path}.tmp{os.getpid()}"

        def write(sftp: paramiko.SFTPClient) -> None:
            with sftp.open(tmp, "w") as fh:
                fh.write(text.encode())
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)

        self._sftp_call(f"write {path}", write)

    def read_text(self, path: str, tail_bytes: int | None = None) -> str:
        path = self.expand(path)

        def read(sftp: paramiko.SFTPClient) -> str:
            with sftp.open(path, "r") as fh:
                if tail_bytes is not None:
                    size = fh.stat().st_size or 0
                    fh.seek(max(size - tail_bytes, 0))
                return fh.read().decode("utf-8", "replace")

        return self._sftp_call(f"read {path}", read)

    def exists(self, path: str) -> bool:
        path = self.expand(path)

        def check(sftp: paramiko.SFTPClient) -> bool:
            try:
                sftp.stat(path)
                return True
            except FileNotFoundError:
                return False

        return self._sftp_call(f"stat {path}", check)

    def put(self, local: Path, remote: str) -> None:
        remote = self.expand(remote)
        self._sftp_call(f"put {local} -> {remote}", lambda s: s.put(str(local), remote))

    def get(self, remote: str, local: Path) -> None:
        remote = self.expand(remote)
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        self._sftp_call(f"get {remote}", lambda s: s.get(remote, str(local)))

    # -- tunnels ----------------------------------------------------------------------------------
    def open_channel(self, host: str, port: int, origin: tuple[str, int]) -> paramiko.Channel:
        """A `direct-tcpip` channel to host:port as seen from the login node (reconnecting if needed)."""
        last: BaseException | None = None
        for _ in range(2):
            transport = self._transport()
            try:
                return transport.open_channel(
                    "direct-tcpip", (host, port), origin, timeout=self.config.connect_timeout_s
                )
            except paramiko.ChannelException:
                raise  # the far side refused (nothing listening): not a connection problem
            except _CONNECTION_ERRORS as exc:
                last = exc
                self._drop(transport)
        raise SSHError(f"{self.description}: cannot open a channel to {host}:{port}: {last}")

    def forward(self, host: str, port: int, local_port: int = 0) -> Tunnel:
        tunnel = Tunnel(self, host, port, local_port=local_port)
        self._tunnels.append(tunnel)
        return tunnel


class _Interrupted(Exception):
    """The connection went away while a command ran."""


class Tunnel:
    """A local listening port forwarded through SSH to host:port on the cluster side.

    Each accepted connection gets its own `direct-tcpip` channel, opened on the session's current
    connection, so a tunnel survives a reconnect. A refused channel (nothing listening yet) closes the
    local connection at once, which HTTP clients see as a connection error.
    """

    def __init__(self, session: SSHSession, host: str, port: int, *, local_port: int = 0) -> None:
        self.session = session
        self.host, self.port = host, port
        self._server = socket.create_server(("127.0.0.1", local_port))
        self._server.settimeout(0.5)
        self.local_port = int(self._server.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.local_port}"
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"tunnel-{self.local_port}", daemon=True
        )
        self._thread.start()
        log.info("tunnel 127.0.0.1:%d -> %s:%d via %s", self.local_port, host, port, session.description)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()

    def _serve(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        with self._conns_lock:
            self._conns.add(conn)
        channel: paramiko.Channel | None = None
        try:
            channel = self.session.open_channel(self.host, self.port, addr)
            conn.settimeout(None)
            while not self._stop.is_set():
                readable, _, _ = select.select([conn, channel], [], [], 0.5)
                if conn in readable:
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    channel.sendall(data)
                if channel in readable:
                    data = channel.recv(1 << 16)
                    if not data:
                        break
                    conn.sendall(data)
        except (paramiko.ChannelException, SSHError, *_CONNECTION_ERRORS) as exc:
            log.debug("tunnel %d: connection ended: %s", self.local_port, exc)
        finally:
            if channel is not None:
                channel.close()
            conn.close()
            with self._conns_lock:
                self._conns.discard(conn)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._server.close()
        with self._conns_lock:
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(timeout=2)
        if self in self.session._tunnels:
            self.session._tunnels.remove(self)


class DirectEndpoint:
    """No tunnel needed: the client is inside the cluster network."""

    def __init__(self, host: str, port: int) -> None:
        self.url = f"http://{host}:{port}"

    def close(self) -> None:
        pass


class LocalShell:
    """The Shell interface for a client that runs on the login node itself."""

    description = "local shell"

    def run(self, command: str, timeout: float = 60.0, *, idempotent: bool = False) -> CommandResult:
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=timeout, errors="replace"
            )
        except subprocess.TimeoutExpired:
            raise SSHError(f"{command[:200]!r} did not finish within {timeout:g} s") from None
        return CommandResult(command, done.returncode, done.stdout, done.stderr)

    def expand(self, path: str) -> str:
        return str(Path(path).expanduser().absolute())

    def mkdir_p(self, path: str) -> None:
        Path(self.expand(path)).mkdir(parents=True, exist_ok=True)

    def write_text(self, path: str, text: str, mode: int = 0o644) -> None:
        target = Path(self.expand(path))
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(mode)
        tmp.replace(target)

    def read_text(self, path: str, tail_bytes: int | None = None) -> str:
        with open(self.expand(path), "rb") as fh:
            if tail_bytes is not None:
                fh.seek(0, 2)
                fh.seek(max(fh.tell() - tail_bytes, 0))
            return fh.read().decode("utf-8", "replace")

    def exists(self, path: str) -> bool:
        return Path(self.expand(path)).exists()

    def put(self, local: Path, remote: str) -> None:
        target = Path(self.expand(remote))
        target.write_bytes(Path(local).read_bytes())

    def get(self, remote: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        Path(local).write_bytes(Path(self.expand(remote)).read_bytes())

    def forward(self, host: str, port: int) -> Endpoint:
        return DirectEndpoint(host, port)

    def close(self) -> None:
        pass


def quote(value: str) -> str:
    """Shell-quote one word for a remote command line."""
    return shlex.quote(value)
