"""Kernel receive timestamps for asyncio TCP connections (Linux).

A stamp taken in `data_received` is the moment the event loop got round to the bytes. Under load that is
later than their arrival by however long the loop was busy with other streams (at 256 concurrent streams,
up to several milliseconds: docs/performance.md). The kernel stamps every packet as it arrives
(SO_TIMESTAMPNS); `StampedReader` reads the socket with recvmsg to get that stamp, on the perf_counter clock.

How: asyncio's transports do not expose recvmsg, so the transport keeps writing and closing while its own
reading is paused, and a duplicate of the socket's descriptor is read here. Where that is not possible
(TLS, another OS, no socket), `attach` returns None and the caller stamps in `data_received` as before.
The switch happens in a callback right after connection_made (uvloop starts a transport's reading when
connection_made returns, whatever it asked); bytes read before it still come through `data_received`.

The kernel stamps on CLOCK_REALTIME; a stamp is moved to the perf_counter clock by its age on the wall clock,
read between two perf_counter reads: the age is subtracted from their midpoint, so the mapping is off by at
most half the time between them (`mapping_error_s`: up to about 1 us, docs/performance.md "Timestamps").
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
import time
from collections.abc import Callable

SO_TIMESTAMPNS = 35  # Linux's SO_TIMESTAMPNS(_OLD): a struct timespec of two native longs per read
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)
_READ_SIZE = 64 * 1024
_perf_counter = time.perf_counter
_time_ns = time.time_ns
_WIDE_BRACKET_S = 2e-6  # perf_counter, time_ns, perf_counter: well under 1 us unless preempted between


class StampedReader:
    """Reads one connected TCP socket for its asyncio transport, stamping each read with the kernel's
    receive time (of the newest packet in the read) on the perf_counter clock."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        sock: socket.socket,
        on_data: Callable[[bytes, float], None],
    ) -> None:
        self.loop = loop
        self.transport = transport
        self.sock = sock
        self.on_data = on_data
        self.closed = False
        self.reading = False
        # The largest error of any read's mapping from the kernel's clock to perf_counter, in seconds: half
        # the time between the perf_counter reads that bracketed its wall-clock read.
        self.mapping_error_s = 0.0
        loop.call_soon(self._start)

    @classmethod
    def attach(
        cls, transport: asyncio.BaseTransport, on_data: Callable[[bytes, float], None]
    ) -> StampedReader | None:
        """Take over reading `transport` (call from connection_made, before any byte was read)."""
        if sys.platform != "linux" or transport.get_extra_info("sslcontext") is not None:
            return None
        original = transport.get_extra_info("socket")
        if original is None or original.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        try:
            sock = socket.socket(fileno=os.dup(original.fileno()))
        except OSError:
            return None
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            return cls(asyncio.get_running_loop(), transport, sock, on_data)  # type: ignore[arg-type]
        except (OSError, RuntimeError):
            sock.close()
            return None

    def _start(self) -> None:
        if self.closed or self.transport.is_closing():
            self.close()
            return
        self.transport.pause_reading()  # type: ignore[attr-defined]
        self.loop.add_reader(self.sock.fileno(), self._readable)
        self.reading = True

    def _readable(self) -> None:
        while not self.closed:
            try:
                data, ancillary, _flags, _address = self.sock.recvmsg(_READ_SIZE, _ANCILLARY_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # reset by the peer: the transport reports the loss
                self._lost()
                return
            now = _perf_counter()
            if not data:  # end of stream
                self._lost()
                return
            arrived = now
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                    seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                    before = _perf_counter()
                    wall_ns = _time_ns()
                    after = _perf_counter()
                    if after - before > _WIDE_BRACKET_S:  # preempted between the reads: try once more
                        again = _perf_counter()
                        wall_again = _time_ns()
                        after_again = _perf_counter()
                        if after_again - again < after - before:
                            before, wall_ns, after = again, wall_again, after_again
                    waited = (wall_ns - (seconds * 1_000_000_000 + nanoseconds)) * 1e-9
                    if 0.0 < waited < 60.0:  # outside that, a clock step: keep the loop's own time
                        arrived = (before + after) * 0.5 - waited
                        error = (after - before) * 0.5
                        if error > self.mapping_error_s:
                            self.mapping_error_s = error
            self.on_data(data, arrived)
            if len(data) < _READ_SIZE:
                return  # drained: the next byte wakes the loop again

    def _lost(self) -> None:
        self.close()
        self.transport.close()  # the protocol's connection_lost follows, as for any closed connection

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.reading:
            try:
                self.loop.remove_reader(self.sock.fileno())
            except (ValueError, RuntimeError):  # the loop is closing
                pass
        self.sock.close()


def stamp_arrivals(
    transport: asyncio.BaseTransport, on_data: Callable[[bytes, float], None]
) -> StampedReader | None:
    """Set up a new connection for timed reading (call from connection_made): no Nagle delay on what it sends,
    and every read stamped with the kernel's receive time where it can be (else None: stamp in data_received)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    return StampedReader.attach(transport, on_data)
