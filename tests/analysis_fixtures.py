"""Synthetic campaigns with PLANTED answers for the analysis tests, written through the real raw layout
(tests/warehouse_fixtures.RawBuilder), the real ingest and the real correctness gate (tasks.gate), so the
tests follow schema changes. Also a small Chrome DevTools Protocol driver for Debian's headless Chromium.

`PlantedBuilder` serves each (variant, repeat, workload, load) cell with the VariantProfile its `plant`
function returns, schedules closed-loop requests as C workers really would (so output throughput is
C x tokens / E2E and a planted E2E ratio is the throughput speedup), can fail requests, give a variant less
KV cache, and make a variant's greedy captures diverge from plain's.
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import polars as pl
from warehouse_fixtures import RawBuilder, VariantProfile

from experiments.plan import CellPlan, DeploymentPlan
from tasks.gate import gate, write_verdict
from tasks.launch.base import Deployment
from warehouse.ingest import ingest_raw

Plant = Callable[[str, int, str, str], VariantProfile]  # (variant, repeat, workload, load_label) -> profile
CAPTURE_PROMPTS = 40  # enough for the gate to tell a diverging arm from its controls


def e2e_s(profile: VariantProfile, tokens: int) -> float:
    """The planted (noise-free) end-to-end latency of one request."""
    return profile.ttft_s + profile.tpot_s * (tokens - 1)


@dataclass
class PlantedBuilder(RawBuilder):
    plant: Plant | None = None
    failed: Callable[[str, int, str, str], int] = field(default=lambda *_: 0)
    kv_tokens: dict[str, int] = field(default_factory=dict)
    diverging: frozenset[str] = frozenset()
    _cell: CellPlan | None = None

    def write_cell(self, slot: DeploymentPlan, cell: CellPlan, **kwargs: Any) -> Path:
        name = slot.variant.name
        key = (name, slot.repeat, cell.workload, cell.load_label)
        kwargs.setdefault("failed_requests", self.failed(*key))
        saved = self.profiles.get(name)
        if self.plant is not None:
            self.profiles[name] = self.plant(*key)
        self._cell = cell
        try:
            return super().write_cell(slot, cell, **kwargs)
        finally:
            self._cell = None
            if saved is not None:
                self.profiles[name] = saved

    def requests_frame(self, *args: Any, **kwargs: Any) -> pl.DataFrame:
        """The base frame (same arguments), moved in time to how the current cell's load sends."""
        frame = super().requests_frame(*args, **kwargs)
        cell = self._cell
        if cell is None or cell.mode != "closed":
            return frame
        # C workers, each sending its next request when its previous one ended (closed loop).
        free = [0.0] * int(cell.concurrency or 1)
        shifts = []
        for row in frame.iter_rows(named=True):
            worker = min(range(len(free)), key=free.__getitem__)
            shift = free[worker] - row["sent_s"]
            shifts.append(shift)
            free[worker] = row["ended_s"] + shift
        moved = pl.Series("shift", shifts, dtype=pl.Float64)
        return frame.with_columns(
            *[
                (pl.col(c) + moved).alias(c)
                for c in ("queued_s", "sent_s", "first_token_s", "last_token_s", "ended_s")
            ]
        )

    def deployment(self, slot: DeploymentPlan, launch: int = 1) -> Deployment:
        deployment = super().deployment(slot, launch)
        deployment.kv_cache_tokens = self.kv_tokens.get(slot.variant.name, deployment.kv_cache_tokens)
        return deployment

    def write_capture(
        self, slot: DeploymentPlan, capture_id: str, n_prompts: int = CAPTURE_PROMPTS, launch: int = 1
    ) -> Path:
        path = super().write_capture(slot, capture_id, n_prompts=n_prompts, launch=launch)
        if slot.variant.name in self.diverging:  # a lossy arm: every output differs from plain's
            outputs = pl.read_parquet(path / "outputs.parquet")
            outputs = outputs.with_columns(
                pl.col("token_ids").list.eval(pl.element() + 1000),
                (pl.col("text") + " # changed").alias("text"),
            )
            outputs.write_parquet(path / "outputs.parquet")
        return path

    def write_gates(self) -> list[Path]:
        """A real gate verdict for every speculative variant: (plain r0, variant r0) against the same-deployment
        repeat and the cross-deployment control, as the campaign's gate does."""
        captures = self.campaign_dir / "captures"
        plain = self.spec.plain.name
        controls = [
            (captures / f"{plain}.r0", captures / f"{plain}.r0.again"),
            (captures / f"{plain}.r0", captures / f"{plain}.ctl1"),
        ]
        written = []
        for variant in self.spec.variants:
            if variant.method == "none":
                continue
            verdict = gate((captures / f"{plain}.r0", captures / f"{variant.name}.r0"), controls, force=True)
            written.append(write_verdict(verdict, self.campaign_dir))
        return written

    def build(self, db: Path, gates: bool = True) -> Path:
        """Write everything, gate, ingest into `db`; returns db."""
        self.write_all()
        if gates:
            self.write_gates()
        report = ingest_raw(self.raw_dir, db)
        assert report.ok, report.as_dict()
        return db


# ------------------------------------------------------------------------------------------ plant helpers

TOKENS = 32
BASE_TTFT = 0.002  # small, so E2E (hence throughput) follows TPOT


def planted_throughput_speedup(plain_tpot: float, speedup: float, ttft: float = BASE_TTFT) -> float:
    """The throughput speedup a TPOT speedup produces under the closed-loop schedule (E2E ratio)."""
    plain = VariantProfile(ttft, plain_tpot, 1.0)
    fast = VariantProfile(ttft, plain_tpot / speedup, 1.0)
    return e2e_s(plain, TOKENS) / e2e_s(fast, TOKENS)


def profile(
    tpot_s: float, acceptance: float | None, tokens_per_chunk: float | None = None, ttft_s: float = BASE_TTFT
) -> VariantProfile:
    """A cell's planted profile. Tokens per chunk default to 1 + 3a (depth 3): each step then yields its bonus
    token plus the accepted ones, as the counters the fixture derives from it assume."""
    if tokens_per_chunk is None:
        tokens_per_chunk = 1.0 if acceptance is None else 1.0 + 3 * acceptance
    return VariantProfile(
        ttft_s=ttft_s, tpot_s=tpot_s, tokens_per_chunk=tokens_per_chunk, acceptance_rate=acceptance
    )


# ------------------------------------------------------------------------------------- headless Chromium

CHROMIUM = Path("/usr/bin/chromium")


@dataclass
class PageReport:
    console_errors: list[str]
    exceptions: list[str]
    requests: list[str]
    charts: list[dict[str, Any]]  # id, x, y, width, height, svg, canvas, rendered
    dom: str
    chart_images: dict[str, bytes]  # chart id -> PNG of its region


class Chromium:
    """Debian's chromium, headless, driven over the DevTools protocol (websockets)."""

    def __init__(self, profile_dir: Path) -> None:
        self.process = subprocess.Popen(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
                "--disable-extensions",
                f"--user-data-dir={profile_dir}",
                "--remote-debugging-port=0",
                "--window-size=1400,1000",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.port = self._port()
        self._id = 0
        self.events: list[dict[str, Any]] = []
        targets = httpx.get(f"http://127.0.0.1:{self.port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        from websockets.sync.client import connect

        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)

    def _port(self) -> int:
        assert self.process.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            match = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if match:
                return int(match.group(1))
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError("chromium did not start its DevTools endpoint")

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        self._id += 1
        wanted = self._id
        self.ws.send(json.dumps({"id": wanted, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result["result"].get("value")

    def open(self, url: str, settle_s: float = 30) -> PageReport:
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + settle_s
        charts_done = (
            "(() => { const all = document.querySelectorAll('div.chart');"
            " return document.readyState === 'complete' && all.length > 0 &&"
            " [...all].every(d => d.hasAttribute('data-rendered')); })()"
        )
        while time.monotonic() < deadline and not self.evaluate(charts_done):
            time.sleep(0.2)
        time.sleep(0.5)  # let late console messages arrive
        self.evaluate("0")
        charts = self.evaluate(
            "JSON.stringify([...document.querySelectorAll('div.chart')].map(d => { const r = "
            "d.getBoundingClientRect(); return {id: d.id, x: r.x + scrollX, y: r.y + scrollY, width: r.width, "
            "height: r.height, svg: d.querySelectorAll('svg').length, canvas: d.querySelectorAll('canvas').length, "
            "rendered: d.getAttribute('data-rendered'), marks: d.querySelectorAll('svg path, svg rect, svg "
            "line').length}; }))"
        )
        charts = json.loads(charts)
        dom = self.evaluate("document.documentElement.outerHTML")
        images = {}
        for chart in charts:
            if chart["width"] and chart["height"]:
                shot = self.call(
                    "Page.captureScreenshot",
                    {
                        "format": "png",
                        "captureBeyondViewport": True,
                        "clip": {
                            "x": chart["x"],
                            "y": chart["y"],
                            "width": chart["width"],
                            "height": chart["height"],
                            "scale": 1,
                        },
                    },
                )
                images[chart["id"]] = base64.b64decode(shot["data"])
        errors, exceptions, requests = [], [], []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", []))
                )
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                errors.append(params["entry"].get("text", ""))
            elif method == "Runtime.exceptionThrown":
                exceptions.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Network.requestWillBeSent":
                requests.append(params["request"]["url"])
        return PageReport(errors, exceptions, requests, charts, dom, images)

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def pixel_spread(png: bytes) -> tuple[float, float]:
    """(standard deviation of grey levels, share of non-white pixels) of an image: a blank region is ~(0, 0)."""
    from PIL import Image

    grey = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float)
    return float(grey.std()), float((grey < 245).mean())
