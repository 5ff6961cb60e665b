"""Kernel receive timestamps: a busy event loop delays when bytes are read, not the time recorded for them."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Callable

import pytest
import uvloop

from specgauge.kernel_clock import StampedReader

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPNS is Linux's"),
    pytest.mark.timing,  # microsecond assertions: see tests/conftest.py
]

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.stamped: list[tuple[bytes, float]] = []
        self.unstamped: list[bytes] = []
        self.lost = asyncio.get_running_loop().create_future()
        self.reader: StampedReader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.reader = StampedReader.attach(transport, lambda data, at: self.stamped.append((data, at)))

    def data_received(self, data: bytes) -> None:
        self.unstamped.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.reader is not None:
            self.reader.close()
        self.lost.set_result(exc)


async def connected_pair() -> tuple[asyncio.Server, list[Recorder], socket.socket]:
    """A server whose connections record what they receive, and a plain socket connected to it."""
    protocols: list[Recorder] = []
    server = await asyncio.get_running_loop().create_server(
        lambda: protocols.append(Recorder()) or protocols[-1], "127.0.0.1", 0
    )
    peer = socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1]))
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return server, protocols, peer


def run(loop_kind: str, main: Callable[[], object]) -> None:
    loop = LOOPS[loop_kind]()
    try:
        loop.run_until_complete(main())  # type: ignore[arg-type]
    finally:
        loop.close()


@pytest.mark.parametrize("loop_kind", sorted(LOOPS))
def test_stamp_is_the_arrival_not_the_late_read(loop_kind: str) -> None:
    async def main() -> None:
        server, protocols, peer = await connected_pair()
        await asyncio.sleep(0.05)  # connection_made and the switch to the stamped reader
        (receiver,) = protocols
        assert receiver.reader is not None and receiver.reader.reading
        delays = []
        for n in range(3):
            sent = time.perf_counter()
            peer.send(b"chunk %d;" % n)
            time.sleep(0.03)  # the event loop is busy elsewhere: it reads these bytes 30 ms late
            await asyncio.sleep(0.01)
            data, at = receiver.stamped[-1]
            assert data == b"chunk %d;" % n
            delays.append(at - sent)
        # a stamp taken when the loop read the bytes would be 30 ms or more after the send
        assert max(delays) < 0.01, delays
        # The packet arrived after the send began; its kernel stamp, moved to perf_counter, may seem earlier
        # only by the mapping's measured error (plus the clocks' whole nanoseconds).
        error = receiver.reader.mapping_error_s
        assert min(delays) >= -(error + 2e-9), (delays, error)
        assert receiver.unstamped == []
        peer.close()
        assert await asyncio.wait_for(receiver.lost, 5) is None  # the end of stream closes the transport
        assert receiver.reader.closed
        server.close()

    run(loop_kind, main)


@pytest.mark.parametrize("loop_kind", sorted(LOOPS))
def test_bytes_before_the_switch_still_arrive_in_order(loop_kind: str) -> None:
    """A peer that writes the moment it connects: nothing is lost or reordered across the switch."""

    async def main() -> None:
        server, protocols, peer = await connected_pair()
        parts = [b"%04d" % i for i in range(200)]
        for part in parts:
            peer.send(part)
            await asyncio.sleep(0)
        peer.close()
        (receiver,) = protocols
        await asyncio.wait_for(receiver.lost, 5)
        received = b"".join(receiver.unstamped) + b"".join(d for d, _ in receiver.stamped)
        assert received == b"".join(parts)
        server.close()

    run(loop_kind, main)


def test_tls_transports_keep_their_own_reading() -> None:
    class Fake(asyncio.BaseTransport):
        def get_extra_info(self, name: str, default: object = None) -> object:
            return object() if name == "sslcontext" else default

    async def main() -> None:
        assert StampedReader.attach(Fake(), lambda data, at: None) is None

    run("asyncio", main)


class SlowSink:
    """Takes 40 ms over the first piece of body (a loop busy parsing other streams), records the rest."""

    def __init__(self) -> None:
        self.pieces: list[tuple[bytes, float]] = []
        self.done = asyncio.get_running_loop().create_future()

    def on_headers(self, status: int, headers: dict[bytes, bytes]) -> None:
        pass

    def on_body(self, data: bytes, arrived: float) -> None:
        if not self.pieces:
            time.sleep(0.04)
        self.pieces.append((data, arrived))

    def on_end(self) -> None:
        self.done.set_result(None)

    def on_error(self, kind: str, message: str, got_response: bool) -> None:
        self.done.set_exception(AssertionError(f"{kind}: {message}"))


@pytest.mark.parametrize("loop_kind", sorted(LOOPS))
def test_a_busy_loop_reads_every_ready_stream_before_parsing_any(loop_kind: str) -> None:
    """A read carries the stamp of its newest packet: a stream read only after another stream's parsing
    would give its first chunk the second chunk's time. Two streams get their first chunks together, their
    second ones 15 ms later, while parsing each first chunk takes 40 ms: every chunk keeps its own time."""
    from tasks.load.http1 import ConnectionPool, Origin, build_request

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    first_sent = threading.Event()
    sent_at: dict[str, float] = {}

    def serve() -> None:
        peers = [listener.accept()[0] for _ in range(2)]
        for peer in peers:
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer.recv(65536)  # the request
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        for peer in peers:
            peer.send(head + b"6\r\nfirst;\r\n")
        sent_at["first"] = time.perf_counter()
        first_sent.set()
        time.sleep(0.015)
        for peer in peers:
            peer.send(b"7\r\nsecond;\r\n")
        sent_at["second"] = time.perf_counter()
        for peer in peers:
            peer.send(b"0\r\n\r\n")
        time.sleep(0.2)
        for peer in peers:
            peer.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def main() -> None:
        origin = Origin.parse(f"http://127.0.0.1:{port}")
        pool = ConnectionPool(origin, connect_timeout_s=5, ssl_context=None)
        connections = [await pool.connect() for _ in range(2)]
        await asyncio.sleep(0.02)  # the switch to stamped reading
        sinks = [SlowSink() for _ in connections]
        for conn, sink in zip(connections, sinks, strict=True):
            conn.start(build_request(origin, "/x", b"{}", {}), sink, timeout_s=5)
        # keep the loop away until both first chunks are in, so that one loop pass finds both ready
        assert first_sent.wait(5)
        time.sleep(0.005)
        await asyncio.wait_for(asyncio.gather(*(s.done for s in sinks)), 5)
        for sink in sinks:
            (first, first_at), (second, second_at) = sink.pieces
            assert (first, second) == (b"first;", b"second;")
            assert first_at - sent_at["first"] < 0.008, "the first chunk got a later packet's time"
            assert abs(second_at - sent_at["second"]) < 0.008
        for conn in connections:
            conn.abandon()

    try:
        run(loop_kind, main)
    finally:
        thread.join(5)
        listener.close()
