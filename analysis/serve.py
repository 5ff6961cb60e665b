"""The report server: HOME/reports over HTTP, so that a person in the Prefect UI opens a campaign's report
with one click from its run's artifacts (a file:// link on the worker's disk opens nothing elsewhere).

It serves the reports folder and nothing else: GET and HEAD only, no path outside the folder (`..` is
dropped by the standard handler, a symlink that leads out is refused here), no dotfile, and folder listings
without dotfiles or symlinks; bound to the address the user chose (127.0.0.1 unless told otherwise). The
pages are self-contained (no CDN), so the server is all a browser needs.

A hostile client costs it little (BoundedHTTPServer): a connection waits for its first bytes without a
thread and is dropped after REQUEST_TIMEOUT_S; at most WORKERS threads answer requests, each read or write
bounded by the same timeout, and a path it cannot read (a NUL byte) is answered 400, never a traceback."""

from __future__ import annotations

import html
import logging
import os
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler
from io import BytesIO
from pathlib import Path
from typing import Any
from urllib.parse import quote

from specgauge.errors import InputError
from specgauge.settings import get_settings

log = logging.getLogger("specgauge.reports")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4280
REQUEST_TIMEOUT_S = 5.0  # a connection silent this long is dropped; so is a read or write that stalls
WORKERS = 16  # threads answering requests; 500 half-open connections cost sockets, not threads
MAX_WAITING = 512  # connections waiting for their first bytes; beyond it the oldest are dropped
MAX_QUEUED = 256  # readable connections queued for a worker; beyond it new ones are closed


class ReportHandler(SimpleHTTPRequestHandler):
    """The standard library's static file handler, kept inside its folder and quiet on stderr."""

    server_version = "specgauge-reports"
    timeout = REQUEST_TIMEOUT_S  # socket timeout of each connection (StreamRequestHandler.setup)

    def send_head(self):  # GET and HEAD both start here
        root = Path(self.directory).resolve()
        translated = self.translate_path(self.path)  # `..` segments already dropped
        if "\x00" in translated:  # %00: no file has it (and resolve() would raise)
            self.send_error(400, "Bad request: NUL byte in path")
            return None
        inside = Path(translated).relative_to(root) if Path(translated).is_relative_to(root) else None
        if inside is None or any(part.startswith(".") for part in inside.parts):  # dotfiles are not served
            self.send_error(404, "File not found")
            return None
        try:
            resolved = Path(translated).resolve()
        except (OSError, ValueError, RuntimeError):  # a symlink loop, a name the OS refuses
            self.send_error(404, "File not found")
            return None
        if resolved != root and root not in resolved.parents:  # a symlink that leads out of the folder
            self.send_error(404, "File not found")
            return None
        return super().send_head()

    def list_directory(self, path: str | os.PathLike[str]) -> BytesIO | None:
        """A folder's listing without dotfiles or symlinks (their names say what else is on the disk)."""
        try:
            entries = sorted(
                (e for e in os.scandir(path) if not e.name.startswith(".") and not e.is_symlink()),
                key=lambda e: e.name.lower(),
            )
        except OSError:
            self.send_error(404, "No permission to list directory")
            return None
        title = html.escape(f"Directory listing for {self.path.split('?', 1)[0]}", quote=False)
        items = []
        for entry in entries:
            name = entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "")
            items.append(f'<li><a href="{quote(name)}">{html.escape(name, quote=False)}</a></li>')
        page = (
            f'<!DOCTYPE HTML>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>\n'
            f"<body><h1>{title}</h1><hr><ul>\n" + "\n".join(items) + "\n</ul><hr></body></html>\n"
        ).encode("utf-8", "surrogateescape")
        self.send_response(200)
        self.send_header("Content-type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        return BytesIO(page)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class BoundedHTTPServer(HTTPServer):
    """An HTTP server whose threads are bounded: accepted connections wait in a selector (no thread) until
    their first bytes arrive, or are dropped after `timeout_s`; readable ones go to a pool of `workers`."""

    request_queue_size = 128  # listen backlog: a burst of connections is accepted, not SYN-retried

    def __init__(
        self,
        address: tuple[str, int],
        handler: Any,
        *,
        workers: int = WORKERS,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.timeout_s = timeout_s
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="report-worker")
        self._arrived: deque[tuple[socket.socket, Any]] = deque()  # handed over by the accepting thread
        self._waiting: dict[socket.socket, float] = {}  # connection -> deadline, oldest first
        self._queued = 0  # handed to the pool, not yet done
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._closing = threading.Event()
        self._dispatcher: threading.Thread | None = None
        super().__init__(address, handler)  # binds; on failure it calls server_close
        self._dispatcher = threading.Thread(target=self._dispatch, name="report-dispatch", daemon=True)
        self._dispatcher.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Called by the accepting thread: park the connection until it has something to read."""
        self._arrived.append((request, client_address))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # the buffer is full: the dispatcher is awake already
            pass

    def _dispatch(self) -> None:
        while not self._closing.is_set():
            for key, _ in self._selector.select(timeout=0.25):
                if key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                    continue
                conn = key.fileobj
                self._selector.unregister(conn)
                self._waiting.pop(conn, None)
                self._hand_over(conn, key.data)
            while self._arrived:
                conn, address = self._arrived.popleft()
                self._waiting[conn] = time.monotonic() + self.timeout_s
                self._selector.register(conn, selectors.EVENT_READ, address)
            now = time.monotonic()
            expired = [c for c, deadline in self._waiting.items() if deadline <= now]
            excess = list(self._waiting)[: max(0, len(self._waiting) - len(expired) - MAX_WAITING)]
            for conn in expired + excess:  # silent too long, or too many silent ones: the oldest go
                self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._waiting.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        self.shutdown_request(conn)

    def _hand_over(self, conn: socket.socket, address: Any) -> None:
        with self._lock:
            full = self._queued >= self.workers + MAX_QUEUED
            if not full:
                self._queued += 1
        if full:  # every worker busy and a long queue: refuse rather than hold the socket
            self.shutdown_request(conn)
            return
        try:
            self._pool.submit(self._serve, conn, address)
        except RuntimeError:  # the pool was shut down: the server is closing
            self.shutdown_request(conn)

    def _serve(self, conn: socket.socket, address: Any) -> None:
        try:
            self.finish_request(conn, address)
        except Exception:
            self.handle_error(conn, address)
        finally:
            self.shutdown_request(conn)
            with self._lock:
                self._queued -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed (a client that went away mid-answer): one log line, no traceback."""
        log.debug("request from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        self._closing.set()
        self._wake()
        if self._dispatcher is not None:
            self._dispatcher.join(timeout=2)
        for conn in list(self._waiting) + [c for c, _ in self._arrived]:
            self.shutdown_request(conn)
        self._waiting.clear()
        self._arrived.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        super().server_close()

    def worker_threads(self) -> int:
        """Threads of the pool alive now (for tests and health checks)."""
        return sum(t.name.startswith("report-worker") and t.is_alive() for t in threading.enumerate())


def report_server(
    root: Path | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
) -> BoundedHTTPServer:
    """A server (not yet serving) for `root` (default HOME/reports), bound to host:port (port 0: any free).
    InputError, naming the address, when the port is out of range or the address cannot be bound."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InputError(f"port {port!r} is out of range: 0..65535 (0: any free port)")
    folder = Path(root or get_settings().reports_dir)
    folder.mkdir(parents=True, exist_ok=True)
    handler = partial(ReportHandler, directory=str(folder.resolve()))
    try:
        return BoundedHTTPServer((host, port), handler)
    except (OSError, ValueError, OverflowError) as exc:  # taken, not this host's, no such name, a NUL
        why = getattr(exc, "strerror", None) or str(exc)
        raise InputError(f"cannot serve on {host!r} port {port}: {why}") from None


@contextmanager
def serving(root: Path | None = None, host: str = DEFAULT_HOST, port: int = 0) -> Iterator[str]:
    """Serve `root` in a background thread for the duration; yields the base URL."""
    server = report_server(root, host, port)
    thread = threading.Thread(target=server.serve_forever, name="report-server", daemon=True)
    thread.start()
    try:
        yield base_url(server)
    finally:
        server.shutdown()
        server.server_close()


def base_url(server: HTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def report_url(report: Path | str, reports_dir: Path | None = None, served_at: str | None = None) -> str:
    """Where a browser opens `report` (a file under the reports folder): through the report server when
    SPECGAUGE_REPORTS_URL says where it runs, else as a file:// URI (which opens on the worker's machine)."""
    served_at = served_at if served_at is not None else get_settings().reports_url
    path = Path(report).resolve()
    root = Path(reports_dir or get_settings().reports_dir).resolve()
    if not served_at or root not in path.parents:
        return path.as_uri()
    return served_at.rstrip("/") + "/" + quote(path.relative_to(root).as_posix())
