"""The error of the kernel-stamp mapping (specgauge/kernel_clock.py): how far a kernel receive stamp, moved to
the perf_counter clock, can be from the truth.

Sends one byte at a time over loopback to a `StampedReader` (uvloop) and, for every read, records the
mapping's error (half the time between the perf_counter reads that bracketed the wall-clock read) and the
delay from the user-space send stamp to the mapped arrival, which must be at least minus that error.

    .venv/bin/python benchmarks/kernel_clock_error.py [--reads 5000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time

import uvloop

from specgauge.kernel_clock import StampedReader


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.reads: list[tuple[float, float]] = []  # (mapped arrival, that read's mapping error)
        self.reader: StampedReader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.reader = StampedReader.attach(transport, self._stamped)

    def _stamped(self, data: bytes, arrived: float) -> None:
        assert self.reader is not None
        self.reads.append((arrived, self.reader.mapping_error_s))
        self.reader.mapping_error_s = 0.0  # per read: the reader keeps the largest so far

    def data_received(self, data: bytes) -> None:
        raise AssertionError("a byte was read without a kernel stamp")


async def one_run(reads: int) -> tuple[list[float], list[float]]:
    protocols: list[Recorder] = []
    server = await asyncio.get_running_loop().create_server(
        lambda: protocols.append(Recorder()) or protocols[-1], "127.0.0.1", 0
    )
    peer = socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1]))
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.sleep(0.05)  # the switch to the stamped reader
    (receiver,) = protocols
    delays, errors = [], []
    for n in range(reads):
        sent = time.perf_counter()
        peer.send(b"x")
        time.sleep(0.0003)  # one read per byte
        while len(receiver.reads) <= n:
            await asyncio.sleep(0)
        arrived, error = receiver.reads[n]
        delays.append(arrived - sent)
        errors.append(error)
    peer.close()
    server.close()
    return delays, errors


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {args.runs} runs of {args.reads} reads (times in us)")
    print("run | error p50 | p99 | p99.9 | max | send->arrival min | p50 | below -error")
    for run in range(args.runs):
        delays, errors = uvloop.run(one_run(args.reads))
        below = sum(1 for d, e in zip(delays, errors, strict=True) if d < -(e + 2e-9))
        figures = [quantile(errors, q) for q in (0.5, 0.99, 0.999)] + [max(errors), min(delays)]
        figures.append(quantile(delays, 0.5))
        print(f"{run + 1} | " + " | ".join(f"{v * 1e6:.2f}" for v in figures) + f" | {below}")


if __name__ == "__main__":
    main()
