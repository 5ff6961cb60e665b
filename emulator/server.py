"""The emulator's HTTP server: raw asyncio HTTP/1.1 (httptools' parser) serving vLLM-shaped responses.

Why a protocol object per connection rather than an ASGI app: control, not speed. It takes a request's
arrival time from the kernel (specgauge/kernel_clock.py; in `data_received`, before any handler runs,
where it cannot), so a burst of requests read late keeps true arrival times; it schedules every chunk
with `call_at` on absolute deadlines, and can drop a TCP connection mid-body for the `cut` fault. Measured
with benchmarks/emulator_server_choice.py (docs/performance.md), a bare ASGI callable under uvicorn +
httptools costs about the same CPU per chunk (0.020-0.026 ms either way), so speed did not decide it.
Either needs about 20 microseconds of CPU per chunk: one core streams some 50,000 chunks a second, which
bounds the load the emulator can present (1,024 streams at 20 ms steps).

Timing model, per request: the response headers go out on arrival; a request is admitted at once, or when
a running one ends if `max_running` is reached (it waits, like a full batch); the first token is written
`ttft_ms` after admission and step i's chunk at `admission + ttft + i * step`, on absolute deadlines so
that lateness never accumulates. Each step emits 1 + accepted tokens; accepted draft positions are drawn
per step (position i with `acceptance[i]` given i-1 was accepted). The counters behind /metrics are
updated from exactly what was streamed, so a client's sums must agree with them.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from emulator.config import FAULTS, EmulatorConfig
from specgauge.kernel_clock import StampedReader, stamp_arrivals

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_FAULT_MARKER = "[[fault:"
_WORDS = ("def", " return", " self", " if", " for", " in", " x", " =", " (", ")", ":", "\n", " None", " 1")


def _chunk(payload: bytes) -> bytes:
    """One SSE event framed as one HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def _event(obj: Any) -> bytes:
    return _chunk(b"data: " + orjson.dumps(obj) + b"\n\n")


_DONE = _chunk(b"data: [DONE]\n\n")
_END = b"0\r\n\r\n"


def token_text(token_id: int) -> str:
    return _WORDS[token_id % len(_WORDS)] + (str(token_id % 7) if token_id % 3 == 0 else "")


@dataclass
class EngineCounters:
    """vLLM's counters for one engine (one `engine` label)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: dict[int, int] = field(default_factory=dict)
    generation_tokens: int = 0
    prompt_tokens: int = 0
    preemptions: int = 0
    requests_ok: int = 0


@dataclass
class _Request:
    method: bytes
    target: bytes
    headers: dict[bytes, bytes]
    body: bytes
    keep_alive: bool
    arrived: float  # perf_counter when its bytes were read


class _Collector:
    """Renders the emulator's counters in vLLM's metric names and labels (prometheus-client exposition)."""

    def __init__(self, state: EmulatorState) -> None:
        self.state = state

    def collect(self):  # prometheus_client's collector protocol
        state, config = self.state, self.state.config
        labels = ["engine", "model_name"]
        families: dict[str, CounterMetricFamily] = {}

        def counter(name: str, doc: str, extra: list[str] | None = None) -> CounterMetricFamily:
            if name not in families:
                families[name] = CounterMetricFamily(name, doc, labels=labels + (extra or []))
            return families[name]

        spec = config.k > 0 or any(c.drafts for c in state.counters)
        models = [(config.model, state.counters)]
        if config.decoy_model:
            models.append((config.decoy_model, state.decoy_counters))
        for model, engines in models:
            for engine, c in enumerate(engines):
                lab = [str(engine), model]
                created = state.created
                counter("vllm:prompt_tokens", "Number of prefill tokens processed.").add_metric(
                    lab, c.prompt_tokens, created=created
                )
                counter("vllm:generation_tokens", "Number of generation tokens processed.").add_metric(
                    lab, c.generation_tokens, created=created
                )
                counter(
                    "vllm:num_preemptions", "Cumulative number of preemption from the engine."
                ).add_metric(lab, c.preemptions, created=created)
                counter("vllm:request_success", "Count of successfully processed requests.").add_metric(
                    lab, c.requests_ok, created=created
                )
                if not spec:
                    continue
                counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").add_metric(
                    lab, c.drafts, created=created
                )
                counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").add_metric(
                    lab, c.draft_tokens, created=created
                )
                counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.").add_metric(
                    lab, c.accepted_tokens, created=created
                )
                per_pos = counter(
                    "vllm:spec_decode_num_accepted_tokens_per_pos",
                    "Accepted tokens per draft position.",
                    ["position"],
                )
                for pos in range(max(config.k, max(c.accepted_per_pos, default=-1) + 1)):
                    per_pos.add_metric([*lab, str(pos)], c.accepted_per_pos.get(pos, 0), created=created)
        yield from families.values()
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Requests in model execution.", labels=labels
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Requests waiting to be processed.", labels=labels
        )
        kv = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=labels
        )
        for engine in range(config.engines):
            lab = [str(engine), config.model]
            running.add_metric(lab, sum(1 for g in state.running if g.engine == engine))
            waiting.add_metric(lab, sum(1 for g in state.waiting if g.engine == engine))
            used = sum(g.prompt_tokens + g.emitted for g in state.running if g.engine == engine)
            kv.add_metric(lab, min(1.0, used / config.kv_tokens))
        yield running
        yield waiting
        yield kv


class EmulatorState:
    """Everything the server knows: config, counters, running/waiting requests, stats, trace."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.created = time.time()
        self.counters = [EngineCounters() for _ in range(config.engines)]
        self.decoy_counters = [
            EngineCounters(drafts=7, draft_tokens=21, accepted_tokens=5, generation_tokens=99)
        ]
        self.running: set[_Generation] = set()
        self.waiting: deque[_Generation] = deque()
        self.fail_budget = config.fail_first
        self.sequence = 0
        self.stats: dict[str, Any] = {}
        self.reset_stats()
        self.trace: list[dict[str, Any]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def reset_stats(self) -> None:
        self.stats = {
            "requests": 0,
            "completions": 0,
            "finished": 0,
            "active": 0,
            "max_active": 0,
            "faults": {},
            "http_errors": 0,
            "aborted": 0,
        }

    def restart(self) -> None:
        """Counters back to zero, as after a server restart (what a scraper must detect as a reset)."""
        self.created = time.time()
        self.counters = [EngineCounters() for _ in range(self.config.engines)]

    def configure(self, changes: dict[str, Any]) -> None:
        self.config = self.config.updated(changes)
        if "fail_first" in changes:
            self.fail_budget = self.config.fail_first
        if "seed" in changes:
            self.rng = random.Random(self.config.seed)
        if "engines" in changes:
            self.counters = (self.counters + [EngineCounters() for _ in range(self.config.engines)])[
                : self.config.engines
            ]

    def metrics_text(self) -> bytes:
        if self.config.metrics_fault == "garbage":
            return b"<html>502 upstream hiccup</html>\n\x00\x01 vllm:generation_tokens_total{oops 12\n"
        return generate_latest(self.registry)

    def admit_waiting(self) -> None:
        limit = self.config.max_running
        while self.waiting and (limit <= 0 or len(self.running) < limit):
            self.waiting.popleft().admit()


class _Generation:
    """One completion request being answered (streamed or not)."""

    def __init__(
        self,
        state: EmulatorState,
        conn: _Connection,
        request: _Request,
        body: dict[str, Any],
        endpoint: str,
        fault: str | None,
    ) -> None:
        self.state, self.conn, self.endpoint, self.fault = state, conn, endpoint, fault
        config = state.config
        self.config = config
        self.keep_alive = request.keep_alive
        self.loop = asyncio.get_running_loop()
        self.stream = bool(body.get("stream"))
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage")) and fault != "no_usage"
        self.want_ids = bool(body.get("return_token_ids")) and config.token_ids == "supported"
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or config.default_max_tokens
        self.max_tokens = max(1, int(max_tokens))
        text = _prompt_text(body, endpoint)
        self.template_options = body.get("chat_template_kwargs")  # traced: what a chat request asked of it
        self.prompt_tokens = max(1, len(text.split()))
        self.base_id = zlib.crc32(text.encode()) % 1997
        state.sequence += 1
        self.engine = state.sequence % config.engines
        self.rid = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-emu{state.sequence}"
        self.created = int(time.time())
        self.emitted = 0
        self.chunks = 0
        self.histogram = [0] * (config.k + 1)  # verify steps by drafts accepted (vLLM's per-request block)
        self.handle: asyncio.Handle | None = None
        self.due = 0.0
        self.received = request.arrived
        self.admitted: float | None = None
        self.waited = False
        self.first_write: float | None = None
        self.last_write: float | None = None
        self.finished = False
        self.text_parts: list[str] = []
        self.ids: list[int] = []
        self.cut_at = max(1, self.max_tokens // 2)
        self.sent_bad = False

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.stream:
            head = _STREAM_HEAD
            if self.endpoint == "chat" and self.config.role_chunk == "immediate":
                head += self._role_event()
            self.conn.write(head)
        limit = self.config.max_running
        if limit > 0 and len(self.state.running) >= limit:
            self.waited = True
            self.state.waiting.append(self)
        else:
            self.admit()

    def admit(self) -> None:
        self.state.running.add(self)
        # admitted on arrival, or now if it had to wait for a running request to end
        self.admitted = self.received if self.admitted is None and not self.waited else time.perf_counter()
        self._schedule(self.admitted + self.config.ttft_ms / 1000.0)

    def _schedule(self, due: float) -> None:
        self.due = due
        wake = due - self.config.spin_ms / 1000.0
        self.handle = self.loop.call_at(self.loop.time() + (wake - time.perf_counter()), self._step)

    def abort(self) -> None:
        """The client went away: stop, count what was generated so far (vLLM aborts the request too)."""
        if self.finished:
            return
        self.finished = True
        if self.handle is not None:
            self.handle.cancel()
        self.state.stats["aborted"] += 1
        self._leave()

    def _leave(self) -> None:
        self.state.running.discard(self)
        try:
            self.state.waiting.remove(self)
        except ValueError:
            pass
        self.state.stats["active"] -= 1
        self.state.admit_waiting()

    # -- one decode step -------------------------------------------------------------------------------------
    def _draw_tokens(self) -> int:
        """Tokens this step emits: 1 for the prefill's token, else 1 + accepted drafts; counts the step."""
        counters = self.state.counters[self.engine]
        remaining = self.max_tokens - self.emitted
        k = self.config.k
        if self.emitted == 0 or k == 0:
            return 1
        accepted = 0
        rng = self.state.rng
        while accepted < k and rng.random() < self.config.acceptance_at(accepted):
            accepted += 1
        accepted = min(accepted, remaining - 1)  # what is streamed is what is counted
        counters.drafts += 1
        counters.draft_tokens += k
        counters.accepted_tokens += accepted
        self.histogram[accepted] += 1
        per_pos = counters.accepted_per_pos
        for pos in range(accepted):
            per_pos[pos] = per_pos.get(pos, 0) + 1
        return accepted + 1

    def _step(self) -> None:
        if self.finished:
            return
        if time.perf_counter() < self.due:  # uvloop's timers round to 1 ms: never write early
            if self.config.spin_ms > 0:  # poll: come back after the loop's next round of I/O
                self.handle = self.loop.call_soon(self._step)
            else:
                self._schedule(self.due)
            return
        n = self._draw_tokens()
        ids = [(self.base_id + (self.emitted + j) * 7919) % 2000 + 2 for j in range(n)]
        text = "".join(token_text(t) for t in ids)
        first = self.emitted == 0
        self.emitted += n
        self.chunks += 1
        counters = self.state.counters[self.engine]
        counters.generation_tokens += n
        if first:
            counters.prompt_tokens += self.prompt_tokens
        done = self.emitted >= self.max_tokens
        now = time.perf_counter()
        if first:
            self.first_write = now
        self.last_write = now
        if not self.stream:
            self.text_parts.append(text)
            self.ids.extend(ids)
            if done:
                self._finish_whole()
            else:
                self._schedule(self._due(self.chunks))
            return
        out = b""
        if first and self.endpoint == "chat" and self.config.role_chunk == "with_first":
            out += self._role_event()
        out += self._token_event(text, ids, "length" if done else None)
        fault = self.fault
        if fault == "bad_json" and not self.sent_bad and not done:
            self.sent_bad = True
            out += _chunk(b"data: {not json\n\n")
        if fault in ("cut", "truncate", "error_event") and self.emitted >= self.cut_at and not done:
            self._end_by_fault(out)
            return
        if done:
            out += self._tail()
            self.conn.write(out)
            self._complete()
            return
        self.conn.write(out)
        due = self._due(self.chunks)
        if fault == "stall":
            due = now + self.config.stall_s
        self._schedule(due)

    def _due(self, step: int) -> float:
        assert self.admitted is not None
        return self.admitted + (self.config.ttft_ms + step * self.config.step_ms) / 1000.0

    # -- payloads --------------------------------------------------------------------------------------------
    def _role_event(self) -> bytes:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return _event(self._envelope([choice]))

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return {
            "id": self.rid,
            "object": kind,
            "created": self.created,
            "model": self.config.model,
            "choices": choices,
        }

    def _token_event(self, text: str, ids: list[int], finish: str | None) -> bytes:
        token_ids = ids if self.want_ids else None
        if self.endpoint == "chat":
            field_name = self.config.delta_field
            if self.emitted - len(ids) < self.config.reasoning_tokens:
                field_name = "reasoning_content"
            if field_name == "tool_calls":
                delta: dict[str, Any] = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
            else:
                delta = {field_name: text}
            choice = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "token_ids": token_ids,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": token_ids,
            }
        return _event(self._envelope([choice]))

    def _usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.emitted,
            "completion_tokens": self.emitted,
        }

    def _spec_decoding(self) -> dict[str, Any]:
        steps = sum(self.histogram)
        accepted = sum(j * count for j, count in enumerate(self.histogram))
        drafted = steps * self.config.k
        return {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_histogram": list(self.histogram),
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": drafted,
            "num_spec_tokens": self.config.k,
        }

    def _tail(self) -> bytes:
        out = b""
        if self.include_usage:
            usage = self._envelope([])
            usage["usage"] = self._usage()
            if self.config.k > 0:  # vLLM >= 0.32 with --per-request-spec-decode-metrics summary
                usage["metrics"] = {"speculative_decoding": self._spec_decoding()}
            out += _event(usage)
        return out + _DONE + _END

    def _end_by_fault(self, out: bytes) -> None:
        self.state.stats["faults"][self.fault] = self.state.stats["faults"].get(self.fault, 0) + 1
        self.finished = True
        if self.fault == "cut":
            self.conn.write(out)
            self.conn.drop()
        elif self.fault == "truncate":
            self.conn.write(out + _END)
            self.conn.finish(self.keep_alive)
        else:  # error_event: vLLM reports an engine error inside the stream, then ends it
            error = {
                "error": {
                    "message": "emulated engine error mid-stream",
                    "type": "InternalServerError",
                    "code": 500,
                }
            }
            self.conn.write(out + _event(error) + _DONE + _END)
            self.conn.finish(self.keep_alive)
        self._leave()

    def _complete(self) -> None:
        self.finished = True
        self.state.counters[self.engine].requests_ok += 1
        self.state.stats["finished"] += 1
        if self.state.config.trace:
            self.state.trace.append(
                {
                    "received": self.received,
                    "admitted": self.admitted,
                    "first": self.first_write,
                    "last": self.last_write,
                    "tokens": self.emitted,
                    "chunks": self.chunks,
                    "chat_template_kwargs": self.template_options,
                }
            )
        self._leave()
        self.conn.finish(self.keep_alive)

    def _finish_whole(self) -> None:
        text = "".join(self.text_parts)
        if self.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "length",
            }
            kind = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
            kind = "text_completion"
        if self.want_ids:
            choice["token_ids"] = self.ids
        body: dict[str, Any] = {
            "id": self.rid,
            "object": kind,
            "created": self.created,
            "model": self.config.model,
            "choices": [choice],
            "usage": self._usage(),
        }
        if self.fault == "no_usage":
            body.pop("usage")
        self.conn.send_json(200, body, self.keep_alive, finish=False)
        self._complete()


def _prompt_text(body: dict[str, Any], endpoint: str) -> str:
    if endpoint == "chat":
        messages = body.get("messages") or []
        return "\n\n".join(str(m.get("content") or "") for m in messages if isinstance(m, dict))
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return " ".join(str(p) for p in prompt)
    return str(prompt)


def _error_body(message: str, status: int, kind: str = "BadRequestError") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


class _Connection(asyncio.Protocol):
    """One client connection: parses requests with httptools, answers them one at a time (keep-alive)."""

    def __init__(self, app: Emulator) -> None:
        self.app = app
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[_Request] = deque()
        self.busy = False
        self.closed = False
        self.current: _Generation | None = None
        self._target = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._arrived = 0.0
        self._reader: StampedReader | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # A request's arrival time is the kernel's where it can give it (plain TCP on Linux), else taken in
        # data_received, before the event loop runs any handler. Each request's schedule starts there, so
        # a burst of requests that the loop reads late still gets its true arrival times.
        self._reader = stamp_arrivals(transport, self._received)

    def data_received(self, data: bytes) -> None:
        self._received(data, time.perf_counter())

    def _received(self, data: bytes, arrived: float) -> None:
        self._arrived = arrived
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.send_json(400, _error_body("malformed HTTP request", 400), keep_alive=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._reader is not None:
            self._reader.close()
        if self.current is not None:
            self.current.abort()
            self.current = None

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._target, self._headers, self._body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        request = _Request(
            self.parser.get_method(),
            self._target,
            self._headers,
            b"".join(self._body),
            self.parser.should_keep_alive(),
            self._arrived,
        )
        self.queue.append(request)
        if not self.busy:
            asyncio.get_running_loop().call_soon(self._next)

    # responses
    def _next(self) -> None:
        while not self.busy and self.queue and not self.closed:
            self.busy = True
            self.app.handle(self, self.queue.popleft())

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def drop(self) -> None:
        """Close without finishing the response (a cut stream)."""
        self.current = None
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def finish(self, keep_alive: bool) -> None:
        self.current = None
        self.busy = False
        if not keep_alive:
            if self.transport is not None:
                self.transport.close()
            self.closed = True
            return
        self._next()

    def send_json(self, status: int, obj: Any, keep_alive: bool, *, finish: bool = True) -> None:
        self.send_bytes(status, orjson.dumps(obj), b"application/json", keep_alive, finish=finish)

    def send_bytes(
        self, status: int, body: bytes, content_type: bytes, keep_alive: bool, *, finish: bool = True
    ) -> None:
        head = b"HTTP/1.1 %d %b\r\ncontent-type: %b\r\ncontent-length: %d\r\n" % (
            status,
            _REASONS.get(status, "Error").encode(),
            content_type,
            len(body),
        )
        if not keep_alive:
            head += b"connection: close\r\n"
        self.write(head + b"\r\n" + body)
        if finish:
            self.finish(keep_alive)


class Emulator:
    """The application: routes requests to handlers. `serve()` runs it on the current event loop."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.state = EmulatorState(config)
        self.server: asyncio.Server | None = None
        self._routes: dict[tuple[bytes, str], Callable[[_Connection, _Request], None]] = {
            (b"GET", "/health"): self._health,
            (b"GET", "/v1/models"): self._models,
            (b"GET", "/metrics"): self._metrics,
            (b"POST", "/v1/chat/completions"): lambda c, r: self._completion(c, r, "chat"),
            (b"POST", "/v1/completions"): lambda c, r: self._completion(c, r, "completions"),
            (b"GET", "/emulator/stats"): self._stats,
            (b"POST", "/emulator/stats/reset"): self._stats_reset,
            (b"GET", "/emulator/trace"): self._trace,
            (b"GET", "/emulator/config"): self._get_config,
            (b"POST", "/emulator/config"): self._set_config,
            (b"POST", "/emulator/restart"): self._restart,
        }

    @property
    def config(self) -> EmulatorConfig:
        return self.state.config

    async def start(self) -> int:
        """Listen; return the bound port."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _Connection(self), self.config.host, self.config.port, backlog=4096, reuse_address=True
        )
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for gen in list(self.state.running) + list(self.state.waiting):
                gen.conn.drop()
            await self.server.wait_closed()

    # -- routing ---------------------------------------------------------------------------------------------
    def handle(self, conn: _Connection, request: _Request) -> None:
        self.state.stats["requests"] += 1
        path = urlsplit(request.target.decode("latin-1")).path
        handler = self._routes.get((request.method, path))
        if handler is None:
            known = any(p == path for _, p in self._routes)
            status = 405 if known else 404
            conn.send_json(
                status, _error_body(f"{request.method.decode()} {path}: not here", status), request.keep_alive
            )
            return
        key = self.config.api_key
        if (
            key
            and path.startswith("/v1/")
            and request.headers.get(b"authorization") != f"Bearer {key}".encode()
        ):
            conn.send_json(
                401, _error_body("missing or wrong API key", 401, "AuthenticationError"), request.keep_alive
            )
            return
        handler(conn, request)

    def _health(self, conn: _Connection, request: _Request) -> None:
        conn.send_bytes(200, b"", b"text/plain", request.keep_alive)

    def _models(self, conn: _Connection, request: _Request) -> None:
        model = {
            "id": self.config.model,
            "object": "model",
            "created": int(self.state.created),
            "owned_by": "specgauge-emulator",
            "root": self.config.model,
            "parent": None,
            "max_model_len": 4096,
        }
        conn.send_json(200, {"object": "list", "data": [model]}, request.keep_alive)

    def _metrics(self, conn: _Connection, request: _Request) -> None:
        content_type = b"text/plain; version=0.0.4; charset=utf-8"
        conn.send_bytes(200, self.state.metrics_text(), content_type, request.keep_alive)

    def _stats(self, conn: _Connection, request: _Request) -> None:
        stats = dict(self.state.stats, running=len(self.state.running), waiting=len(self.state.waiting))
        conn.send_json(200, stats, request.keep_alive)

    def _stats_reset(self, conn: _Connection, request: _Request) -> None:
        active = self.state.stats["active"]
        self.state.reset_stats()
        self.state.stats["active"] = self.state.stats["max_active"] = active
        self._stats(conn, request)

    def _trace(self, conn: _Connection, request: _Request) -> None:
        trace, self.state.trace = self.state.trace, []
        conn.send_json(200, {"clock": "perf_counter", "requests": trace}, request.keep_alive)

    def _get_config(self, conn: _Connection, request: _Request) -> None:
        conn.send_json(200, asdict(self.config), request.keep_alive)

    def _set_config(self, conn: _Connection, request: _Request) -> None:
        try:
            changes = orjson.loads(request.body or b"{}")
            if not isinstance(changes, dict):
                raise ValueError("expected a JSON object of config fields")
            self.state.configure(changes)
        except (ValueError, TypeError, orjson.JSONDecodeError) as exc:
            conn.send_json(400, _error_body(str(exc), 400), request.keep_alive)
            return
        self._get_config(conn, request)

    def _restart(self, conn: _Connection, request: _Request) -> None:
        self.state.restart()
        conn.send_json(200, {"restarted": True}, request.keep_alive)

    # -- completions -----------------------------------------------------------------------------------------
    def _completion(self, conn: _Connection, request: _Request, endpoint: str) -> None:
        state, config = self.state, self.config
        state.stats["completions"] += 1
        try:
            body = orjson.loads(request.body)
            if not isinstance(body, dict):
                raise ValueError("expected a JSON object")
        except (ValueError, orjson.JSONDecodeError) as exc:
            self._reject(conn, request, 400, f"invalid JSON body: {exc}")
            return
        if body.get("model") != config.model:
            self._reject(
                conn, request, 404, f"The model `{body.get('model')}` does not exist.", "NotFoundError"
            )
            return
        if endpoint == "chat" and not body.get("messages"):
            self._reject(conn, request, 400, "messages: field required")
            return
        if "return_token_ids" in body and config.token_ids == "rejected":
            self._reject(conn, request, 400, "Unrecognized request argument supplied: return_token_ids")
            return
        fault = _requested_fault(request, body, endpoint) or config.fault
        if fault is not None and fault not in FAULTS:
            self._reject(conn, request, 400, f"unknown emulator fault {fault!r}; known: {', '.join(FAULTS)}")
            return
        if fault is None and state.fail_budget > 0:
            state.fail_budget -= 1
            fault = "error"
        if fault is None and config.fail_fraction > 0 and state.rng.random() < config.fail_fraction:
            fault = "error"
        if fault == "error":
            state.stats["faults"]["error"] = state.stats["faults"].get("error", 0) + 1
            self._reject(
                conn, request, config.fail_status, "emulated server failure", "ServiceUnavailableError"
            )
            return
        state.stats["active"] += 1
        state.stats["max_active"] = max(state.stats["max_active"], state.stats["active"])
        gen = _Generation(state, conn, request, body, endpoint, fault)
        conn.current = gen
        gen.start()

    def _reject(
        self, conn: _Connection, request: _Request, status: int, message: str, kind: str = "BadRequestError"
    ) -> None:
        self.state.stats["http_errors"] += 1
        conn.send_json(status, _error_body(message, status, kind), request.keep_alive)


def _requested_fault(request: _Request, body: dict[str, Any], endpoint: str) -> str | None:
    header = request.headers.get(b"x-emulator-fault")
    if header:
        return header.decode("latin-1").strip()
    text = _prompt_text(body, endpoint)
    start = text.find(_FAULT_MARKER)
    if start < 0:
        return None
    end = text.find("]]", start)
    return text[start + len(_FAULT_MARKER) : end if end >= 0 else None].strip()
