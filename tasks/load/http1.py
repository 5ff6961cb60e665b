"""A small HTTP/1.1 client transport for streamed completions: keep-alive connections, httptools' parser.

Why not httpx (which the rest of the code base uses): benchmarks/client_transport_choice.py reads the
same emulated streams with several stacks (table in docs/performance.md). At 256 concurrent streams httpx
with httpx-sse sustained under 3,000 chunks per CPU-second (httpcore's pool scans every connection for each
queued request, and anyio wraps every read in a cancel scope), aiohttp about 55,000, and StreamingClient on
this module about 90,000 with all its record keeping. A load generator that spends its CPU in its HTTP stack
delays the very timestamps it reports, so this transport does the minimum: it writes a pre-built request,
stamps every arrival (with the kernel's receive time where it can: specgauge/kernel_clock.py), hands the
bytes to the caller's sink, and keeps the connection for the next request. Parsing (status line, headers,
chunked framing) is httptools' (llhttp, as in uvicorn).

Scope, on purpose: HTTP/1.1 over TCP or TLS to one origin, no proxies, no redirects, no compression.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import urlsplit

import httptools

from specgauge.kernel_clock import StampedReader, stamp_arrivals

TransportErrorKind = Literal["connect", "timeout", "stream_cut", "protocol"]
_perf_counter = time.perf_counter


class Sink(Protocol):
    """What receives one response. Called from the event loop's protocol callbacks: must not block."""

    def on_headers(self, status: int, headers: dict[bytes, bytes]) -> None: ...

    def on_body(self, data: bytes, arrived: float) -> None: ...

    def on_end(self) -> None: ...

    def on_error(self, kind: TransportErrorKind, message: str, got_response: bool) -> None: ...


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    base_path: str  # path prefix of the base URL, without a trailing "/"

    @classmethod
    def parse(cls, base_url: str) -> Origin:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL {base_url!r}: expected http://HOST[:PORT][/PATH] or https://...")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class Connection(asyncio.Protocol):
    """One keep-alive connection; serves one request at a time."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.closed = False
        self.reused = False
        self.got_bytes = False
        self.headers_done = False
        self.complete = False
        self.close_delimited = False
        self.last_activity = 0.0
        self._arrived = 0.0
        self._inbox: list[tuple[bytes, float]] = []
        self._loop = asyncio.get_running_loop()
        self._headers: dict[bytes, bytes] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._reader: StampedReader | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # Arrival times from the kernel where it can give them (plain TCP on Linux): a busy event loop
        # then delays when a chunk is parsed, not the time recorded for it.
        self._reader = stamp_arrivals(transport, self._stamped)

    def data_received(self, data: bytes) -> None:
        # The transport's own reading (no kernel stamps): stamp now and parse in a callback. The event loop
        # calls every ready socket's reader before it runs callbacks, so at high concurrency each stream's
        # bytes are stamped before, not after, the parsing of all the streams that became readable with it.
        arrived = _perf_counter()
        self.last_activity = arrived
        self.got_bytes = True
        self._inbox.append((data, arrived))
        if len(self._inbox) == 1:
            self._loop.call_soon(self._parse_inbox)

    def _stamped(self, data: bytes, arrived: float) -> None:
        # Parsed in a callback too, although the kernel's stamp no longer depends on when: a read carries the
        # stamp of its newest packet, so a socket read late gives an earlier chunk the time of a later one.
        # Parsing at once, a burst of 1,024 streams' chunks kept the loop from the last sockets for ~40 ms,
        # a whole step (docs/performance.md); read first, every ready socket is read within a few ms.
        self.last_activity = arrived
        self.got_bytes = True
        self._inbox.append((data, arrived))
        if len(self._inbox) == 1:
            self._loop.call_soon(self._parse_inbox)

    def _parse_inbox(self) -> None:
        inbox, self._inbox = self._inbox, []
        for data, arrived in inbox:
            if not self._feed(data, arrived):
                return

    def _feed(self, data: bytes, arrived: float) -> bool:
        """Parse bytes that arrived at `arrived`; False when the connection was given up."""
        if self.sink is None:  # bytes outside a request: the server misbehaves; do not reuse
            self._close()
            return False
        self._arrived = arrived
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail("protocol", f"malformed HTTP response: {exc}")
            return False
        except Exception as exc:  # a sink bug must not kill the event loop's protocol: report it
            self._fail("protocol", f"{type(exc).__name__} while reading the response: {exc}")
            return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._inbox:
            self._parse_inbox()  # bytes that arrived before the close belong to the response
        self.closed = True
        self._cancel_timer()
        self.pool.forget(self)
        if self.sink is None or self.complete:
            return
        if self.headers_done and self.close_delimited:
            self._end()  # a body without length or chunking ends when the connection does
            return
        why = f": {exc}" if exc else ""
        if self.headers_done:
            self._fail("stream_cut", f"server closed the connection mid-response{why}")
        else:
            self._fail("stream_cut", f"server closed the connection before responding{why}")

    # -- httptools callbacks ------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.headers_done = True
        headers = self._headers
        self.close_delimited = (
            b"content-length" not in headers
            and b"chunked" not in headers.get(b"transfer-encoding", b"").lower()
        )
        if self.sink is not None:
            self.sink.on_headers(self.parser.get_status_code(), headers)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.on_body(body, self._arrived)

    def on_message_complete(self) -> None:
        self._end()

    # -- requests -----------------------------------------------------------------------------------------
    def start(self, request: bytes, sink: Sink, timeout_s: float) -> None:
        assert self.transport is not None
        self.sink = sink
        self.headers_done = self.complete = self.got_bytes = False
        self._headers = {}
        self.last_activity = _perf_counter()
        self.transport.write(request)
        self._arm(timeout_s)

    def abandon(self) -> None:
        """The caller gave up (cancelled): the response is unfinished, so the connection is unusable."""
        self.sink = None
        self._close()

    def _arm(self, timeout_s: float) -> None:
        # One timer per request, re-armed lazily: a chunk only stamps last_activity (no timer churn).
        loop = asyncio.get_running_loop()

        def check() -> None:
            idle = _perf_counter() - self.last_activity
            if self.sink is None or self.complete:
                return
            if idle >= timeout_s:
                self._fail("timeout", f"no data for {timeout_s:g} s")
            else:
                self._timer = loop.call_later(timeout_s - idle, check)

        self._timer = loop.call_later(timeout_s, check)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _end(self) -> None:
        self.complete = True
        self._cancel_timer()
        sink, self.sink = self.sink, None
        keep = not self.closed and self.parser.should_keep_alive() and not self.close_delimited
        if keep:
            self.pool.release(self)
        else:
            self._close()
        if sink is not None:
            sink.on_end()

    def _fail(self, kind: TransportErrorKind, message: str) -> None:
        self._cancel_timer()
        sink, self.sink = self.sink, None
        got_response = self.headers_done
        self._close()
        if sink is not None:
            sink.on_error(kind, message, got_response)

    def _close(self) -> None:
        self.closed = True
        if self._reader is not None:
            self._reader.close()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.pool.forget(self)


class ConnectionPool:
    """Idle keep-alive connections to one origin. O(1) to take and return (unlike a scanning pool)."""

    def __init__(
        self, origin: Origin, *, connect_timeout_s: float, ssl_context: ssl.SSLContext | None
    ) -> None:
        self.origin = origin
        self.connect_timeout_s = connect_timeout_s
        self.ssl_context = ssl_context or (ssl.create_default_context() if origin.scheme == "https" else None)
        self.idle: deque[Connection] = deque()
        self.open: set[Connection] = set()

    async def acquire(self) -> Connection:
        while self.idle:
            conn = self.idle.pop()  # most recently used first: the likeliest to be alive
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                return conn
        return await self.connect()

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(self),
                    self.origin.host,
                    self.origin.port,
                    ssl=self.ssl_context,
                    server_hostname=self.origin.host if self.ssl_context else None,
                ),
                self.connect_timeout_s,
            )
        except TimeoutError:
            raise TransportError(
                "connect", f"connecting to {self.origin.host_header} took over {self.connect_timeout_s:g} s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise TransportError("connect", f"cannot connect to {self.origin.host_header}: {exc}") from None
        self.open.add(conn)
        return conn

    def release(self, conn: Connection) -> None:
        self.idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self.open.discard(conn)
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def close(self) -> None:
        for conn in list(self.open):
            conn.sink = None
            conn._close()
        self.idle.clear()
        self.open.clear()


class TransportError(Exception):
    def __init__(self, kind: TransportErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def build_request(origin: Origin, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {origin.base_path}{path} HTTP/1.1", f"Host: {origin.host_header}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
