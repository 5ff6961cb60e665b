"""The gauge sampler: scrape `/metrics` every `interval_s` while a cell runs.

It records KV-cache usage, running and waiting requests and the cumulative preemption count as the
`gauges.parquet` frame (artifacts.documents.GAUGE_SCHEMA). Times are seconds since the cell's `t0` on the
`time.perf_counter()` clock, the clock of the request records, so both line up. A failed scrape (or a
text that does not parse) is skipped and counted: the sampler never fails the cell.

    async with GaugeSampler(deployment.metrics_url, deployment.served_model_name, t0=t0) as sampler:
        ...  # run the cell
    frame, failures = sampler.frame(), sampler.failures
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from types import TracebackType

import httpx
import polars as pl

from artifacts.documents import GAUGE_SCHEMA
from specgauge.errors import MetricsError
from tasks.metrics.prometheus import ascrape, gauges

_KEPT_ERRORS = 5


class GaugeSampler:
    """Samples the load gauges of one served model at a fixed interval until stopped.

    Ticks fall on a fixed grid (the first scrape + k * interval_s), so a slow scrape does not shift later
    ones; ticks missed while a scrape was still running are skipped, not bunched up. A scrape gives up after
    `timeout_s` (default: the larger of interval_s and 5 s) and counts as failed. Each row's `t_s` is the
    midpoint of its scrape's request and response, the best estimate of when the server read it.
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        *,
        t0: float,
        interval_s: float = 0.5,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.url, self.model_name, self.t0, self.interval_s = url, model_name, t0, interval_s
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s if timeout_s is not None else max(interval_s, 5.0)
        self.failures = 0
        self.errors: list[str] = []  # the first few failure reasons, for the cell's log
        self._rows: list[dict[str, float | int | None]] = []
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    async def sample_once(self) -> None:
        """One scrape: append a row, or count the failure."""
        assert self._client is not None
        sent = time.perf_counter()
        try:
            text = await ascrape(
                self.url, headers=self.headers, timeout_s=self.timeout_s, client=self._client
            )
            row: dict[str, float | int | None] = dict(gauges(text, self.model_name))
        except Exception as exc:  # never let a sampling problem fail the cell: count it and go on
            self._failed(str(exc) if isinstance(exc, MetricsError) else f"{type(exc).__name__}: {exc}")
            return
        received = time.perf_counter()
        row["t_s"] = (sent + received) / 2 - self.t0
        self._rows.append(row)

    def _failed(self, reason: str) -> None:
        self.failures += 1
        if len(self.errors) < _KEPT_ERRORS:
            self.errors.append(reason)

    async def _run(self) -> None:
        next_tick = time.perf_counter()
        while True:
            await self.sample_once()
            next_tick += self.interval_s
            now = time.perf_counter()
            if now > next_tick:  # the scrape overran: skip the ticks it covered
                next_tick += self.interval_s * ((now - next_tick) // self.interval_s + 1)
            await asyncio.sleep(next_tick - now)

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("GaugeSampler already started")
        self._client = httpx.AsyncClient(timeout=self.timeout_s)
        self._task = asyncio.create_task(self._run(), name=f"gauges {self.url}")

    async def stop(self) -> pl.DataFrame:
        """Stop sampling (an in-flight scrape is abandoned) and return the frame."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        return self.frame()

    def frame(self) -> pl.DataFrame:
        """The samples so far, in `gauges.parquet`'s columns and order."""
        return pl.DataFrame(self._rows, schema=GAUGE_SCHEMA, orient="row").select(list(GAUGE_SCHEMA))

    async def __aenter__(self) -> GaugeSampler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
