"""The streaming client: one request in, one `RequestRecord` out, per the measurement contract.

`StreamingClient.send` streams a chat completion (`/v1/chat/completions`, the default) or a completion
(`/v1/completions`) and fills every per-request field of /work/shared/facts/metrics.md:

- **send time** (`sent_s`) is taken after the client's slot and a connection are obtained, right before the
  request is written; waiting for a slot (and opening a new connection) is `client_queue_s`
  (`sent_s - queued_s`), never TTFT. Connections are kept alive, so only a cell's first requests open one.
- **TTFT** ends at the first chunk carrying content, reasoning content (`reasoning_content` or
  `reasoning`), tool-call arguments, or generated token ids (a token whose text is still being held back
  by the detokenizer is still a token); a role-only chunk does not count. **E2E** ends at the last such
  chunk: the usage chunk and `[DONE]` do not move it. Times are those at which the bytes arrived: the
  kernel's receive time (SO_TIMESTAMPNS, specgauge/kernel_clock.py) on plain TCP on Linux, else
  `time.perf_counter()` in the protocol's `data_received`, before any task switch.
- **completion tokens** come from the usage block (`stream_options.include_usage`); a stream without one
  is a failed request (`no_usage`). **TPOT** = (E2E - TTFT) / (tokens - 1) for >= 2 tokens.
- **acceptance per request**: vLLM >= 0.32 started with `--per-request-spec-decode-metrics summary`
  (tasks/launch/command.py adds it for speculative variants) puts `metrics.speculative_decoding` on the
  usage chunk: verify steps, draft tokens, accepted draft tokens and the histogram of accepted drafts per
  step. They fill `spec_*`; null when the server gives none (plain, an older vLLM, the flag off).
- **tokens per chunk**: the request asks vLLM for per-chunk token ids (`"return_token_ids": true`); when
  every token-bearing chunk carries `token_ids`, `chunk_tokens` are exact (`tokens_exact`). Otherwise they
  are derived: usage's tokens spread evenly over the chunks (remainder to the earliest). A server that
  answers 400/422 naming `return_token_ids` gets the request again without it, once, and the client stops
  asking for its lifetime.
- every failure is classified: `connect`, `timeout` (no data for `timeout_s`), `http_status`,
  `stream_cut` (the body ended or the connection closed before `[DONE]`/a finish reason, or the server sent
  an error event mid-stream), `no_usage`, `protocol` (a data line that is not JSON, a malformed response),
  `cancelled` (the caller cancelled: `send` returns the record instead of raising, so a cell's time cap
  loses no record). No exception escapes `send`.

For `/v1/completions` the prompt is rendered as the messages' contents joined by a blank line ("\\n\\n"),
without a chat template: the same text, not the same tokens, as the chat request.

The HTTP layer is `tasks.load.http1` (why not httpx: see there). Run the event loop under uvloop for the
client's published figures (`run_load_sync` in tasks/load/runner.py does).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import orjson

from experiments.spec import Sampling
from tasks.load.http1 import (
    Connection,
    ConnectionPool,
    Origin,
    TransportError,
    TransportErrorKind,
    build_request,
)
from tasks.load.records import ErrorClass, Phase, RequestRecord
from workloads.schema import Prompt

Endpoint = Literal["chat", "completions"]
PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_ERROR_BODY_LIMIT = 4096
_perf_counter = time.perf_counter


def render_completion_prompt(prompt: Prompt) -> str:
    """The text a /v1/completions request sends: message contents joined by a blank line."""
    return "\n\n".join(m.content for m in prompt.messages)


class _Exchange:
    """One HTTP exchange's parsing state; fed by the connection's callbacks (see http1.Sink)."""

    __slots__ = (
        "chat",
        "chunk_ids",
        "chunk_offsets",
        "done",
        "error",
        "error_body",
        "error_class",
        "finish_reason",
        "first",
        "future",
        "got_response",
        "keep_ids",
        "keep_text",
        "last",
        "parts",
        "pending",
        "sent",
        "spec_decode",
        "status",
        "texts",
        "token_ids",
        "usage",
    )

    def __init__(self, chat: bool, sent: float, keep_text: bool, keep_ids: bool) -> None:
        self.chat = chat
        self.sent = sent
        self.keep_text = keep_text
        self.keep_ids = keep_ids
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status: int | None = None
        self.pending = b""  # an incomplete line
        self.parts: list[bytes] = []  # data lines of the event being read
        self.chunk_offsets: list[float] = []
        self.chunk_ids: list[int | None] = []  # token ids per chunk; None when the chunk had none
        self.first: float | None = None
        self.last: float | None = None
        self.usage: dict[str, Any] | None = None
        self.spec_decode: dict[str, Any] | None = None  # vLLM's per-request acceptance (metrics block)
        self.finish_reason: str | None = None
        self.done = False
        self.error_class: ErrorClass | None = None
        self.error: str | None = None
        self.error_body = b""
        self.got_response = False
        self.texts: list[str] = []
        self.token_ids: list[int] = []

    # -- http1.Sink ---------------------------------------------------------------------------------------
    def on_headers(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status
        self.got_response = True
        content_type = headers.get(b"content-type", b"")
        if status == 200 and not content_type.startswith(b"text/event-stream"):
            kind = content_type.decode("latin-1") or "none"
            self.error_class, self.error = "protocol", f"expected a text/event-stream response, got {kind}"

    def on_body(self, data: bytes, arrived: float) -> None:
        if self.status != 200:
            if len(self.error_body) < _ERROR_BODY_LIMIT:
                self.error_body += data[: _ERROR_BODY_LIMIT - len(self.error_body)]
            return
        if self.error_class is not None:
            return
        if self.pending:
            data = self.pending + data
        lines = data.split(b"\n")
        self.pending = lines.pop()
        parts = self.parts
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:  # blank line: the event is complete
                if parts:
                    payload = parts[0] if len(parts) == 1 else b"\n".join(parts)
                    parts.clear()
                    self._event(payload, arrived)
                    if self.error_class is not None:
                        return
            elif line[:5] == b"data:":
                parts.append(line[6:] if line[5:6] == b" " else line[5:])
            # other fields (event:, id:, retry:) and comments (":") carry nothing we use

    def on_end(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def on_error(self, kind: TransportErrorKind, message: str, got_response: bool) -> None:
        if self.error_class is None:
            self.error_class, self.error = kind, message
        self.got_response = self.got_response or got_response
        if not self.future.done():
            self.future.set_result(None)

    # -- one SSE event ------------------------------------------------------------------------------------
    def _event(self, payload: bytes, arrived: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            self.error_class, self.error = "protocol", f"data line is not JSON ({exc}): {payload[:200]!r}"
            return
        if not isinstance(obj, dict):
            self.error_class, self.error = "protocol", f"data line is not a JSON object: {payload[:200]!r}"
            return
        usage = obj.get("usage")
        if usage:
            self.usage = usage
            metrics = obj.get("metrics")
            if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
                self.spec_decode = metrics["speculative_decoding"]
        choices = obj.get("choices")
        if not choices:
            error = obj.get("error")
            if error is not None:
                message = error.get("message") if isinstance(error, dict) else error
                self.error_class, self.error = "stream_cut", f"server sent an error mid-stream: {message}"
            return
        choice = choices[0]
        if self.chat:
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            if not text and delta.get("tool_calls"):
                text = "".join(
                    (call.get("function") or {}).get("arguments") or "" for call in delta["tool_calls"]
                )
        else:
            text = choice.get("text")
        ids = choice.get("token_ids")
        reason = choice.get("finish_reason")
        if reason:
            self.finish_reason = reason
        if not text and not ids:
            return  # role-only, empty or finish-only chunk: not a token
        if self.first is None:
            self.first = arrived
        self.last = arrived
        self.chunk_offsets.append(arrived - self.sent)
        self.chunk_ids.append(len(ids) if ids is not None else None)
        if self.keep_text and text:
            self.texts.append(text)
        if self.keep_ids and ids:
            self.token_ids.extend(ids)


class StreamingClient:
    """Streams completions from one OpenAI-compatible server; `send` returns a `RequestRecord`.

    One instance per cell (or longer): it keeps up to `max_connections` keep-alive connections, which
    should be at least the cell's concurrency (requests beyond it wait for a slot, counted as client
    queue time). `api_key`, when given, goes in an `Authorization: Bearer` header and nowhere else;
    `authorization` is a whole header value instead (Basic, for an endpoint URL's user:password).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        authorization: str | None = None,
        timeout_s: float = 300,
        endpoint: Endpoint = "chat",
        max_connections: int = 256,
        want_token_ids: bool = True,
        keep_text: bool = False,
        keep_token_ids: bool = False,
        connect_timeout_s: float | None = None,
    ) -> None:
        if endpoint not in PATHS:
            raise ValueError(f"endpoint must be 'chat' or 'completions', got {endpoint!r}")
        if max_connections <= 0 or timeout_s <= 0:
            raise ValueError("max_connections and timeout_s must be > 0")
        origin = Origin.parse(base_url)
        if origin.base_path.endswith("/v1"):  # accept ".../v1" as well as the server root
            origin = Origin(origin.scheme, origin.host, origin.port, origin.base_path[: -len("/v1")])
        self.origin = origin
        self.model = model
        self.endpoint: Endpoint = endpoint
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.want_token_ids = want_token_ids
        self.keep_text = keep_text
        self.keep_token_ids = keep_token_ids
        self.token_ids_supported: bool | None = None  # None: not known yet; False: server refused the field
        self._connect_timeout_s = connect_timeout_s or min(timeout_s, 30.0)
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": "specgauge",
        }
        if api_key or authorization:
            self._headers["Authorization"] = authorization or f"Bearer {api_key}"
        self._pool: ConnectionPool | None = None
        self._slots: asyncio.Semaphore | None = None

    def __repr__(self) -> str:  # never shows the API key
        return f"StreamingClient({self.origin.scheme}://{self.origin.host_header}, model={self.model!r})"

    async def __aenter__(self) -> StreamingClient:
        self._pool = ConnectionPool(self.origin, connect_timeout_s=self._connect_timeout_s, ssl_context=None)
        self._slots = asyncio.Semaphore(self.max_connections)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # -- the request body -----------------------------------------------------------------------------------
    def payload(self, prompt: Prompt, sampling: Sampling, *, token_ids: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model}
        if self.endpoint == "chat":
            body["messages"] = prompt.chat_messages()
        else:
            body["prompt"] = render_completion_prompt(prompt)
        body |= {
            "max_tokens": sampling.max_tokens or prompt.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if sampling.top_k is not None and sampling.top_k != -1:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.ignore_eos:
            body["ignore_eos"] = True
        if sampling.chat_template_kwargs and self.endpoint == "chat":  # completions apply no template
            body["chat_template_kwargs"] = sampling.template_options
        if token_ids:
            body["return_token_ids"] = True
        return body

    # -- one request ------------------------------------------------------------------------------------------
    async def send(
        self,
        prompt: Prompt,
        sampling: Sampling,
        *,
        index: int,
        phase: Phase,
        t0: float,
        queued_s: float,
        scheduled_s: float | None = None,
    ) -> RequestRecord:
        """Stream one request; always returns its record (never raises, cancellation included).

        `t0` is the cell's `time.perf_counter()` origin; `queued_s` (seconds from t0) is when the request
        asked for a slot (closed loop) or was due (open loop); every time in the record is from t0.
        """
        record = RequestRecord(
            index=index,
            prompt_id=prompt.id,
            workload=prompt.workload,
            phase=phase,
            endpoint=self.endpoint,
            queued_s=queued_s,
            scheduled_s=scheduled_s,
        )
        exchange: _Exchange | None = None
        conn: Connection | None = None
        acquired = False
        try:
            if self._pool is None or self._slots is None:
                raise RuntimeError("StreamingClient.send outside `async with StreamingClient(...)`")
            await self._slots.acquire()
            acquired = True
            for attempt in range(3):
                ask_ids = self.want_token_ids and self.token_ids_supported is not False
                body = orjson.dumps(self.payload(prompt, sampling, token_ids=ask_ids))
                request = build_request(self.origin, PATHS[self.endpoint], body, self._headers)
                conn = None
                try:
                    conn = await self._pool.acquire()
                except TransportError as exc:
                    record.sent_s = _perf_counter() - t0
                    exchange = None
                    self._fail(record, exc.kind, str(exc))
                    break
                sent = _perf_counter()
                record.sent_s = sent - t0
                exchange = _Exchange(self.endpoint == "chat", sent, self.keep_text, self.keep_token_ids)
                reused = conn.reused
                conn.start(request, exchange, self.timeout_s)
                await exchange.future
                conn = None  # the connection is back in the pool or closed
                if self._stale(exchange, attempt, reused) or self._refused_token_ids(exchange, ask_ids):
                    continue
                break
            if exchange is not None:
                self._finish(record, exchange, t0)
        except asyncio.CancelledError:
            if conn is not None:
                conn.abandon()
            if exchange is not None:
                self._finish(record, exchange, t0)
            self._fail(record, "cancelled", "cancelled before the response ended (time cap or shutdown)")
        except Exception as exc:  # a bug here must still leave a record
            self._fail(record, "protocol", f"client error: {type(exc).__name__}: {exc}")
        finally:
            if acquired and self._slots is not None:
                self._slots.release()
            if record.ended_s is None:
                record.ended_s = _perf_counter() - t0
            record.client_queue_s = (record.sent_s - queued_s) if record.sent_s is not None else 0.0
        return record

    @staticmethod
    def _stale(exchange: _Exchange, attempt: int, reused: bool) -> bool:
        """A kept-alive connection that the server had closed: no response at all; retry once, fresh."""
        return attempt == 0 and reused and exchange.error_class == "stream_cut" and not exchange.got_response

    def _refused_token_ids(self, exchange: _Exchange, asked: bool) -> bool:
        if asked and exchange.status in (400, 422) and b"return_token_ids" in exchange.error_body:
            self.token_ids_supported = False
            return True
        if asked and exchange.status == 200 and self.token_ids_supported is None:
            self.token_ids_supported = True
        return False

    @staticmethod
    def _fail(record: RequestRecord, kind: ErrorClass, message: str) -> None:
        record.ok = False
        if record.error_class is None or kind == "cancelled":
            record.error_class = kind
            record.error = message

    def _finish(self, record: RequestRecord, ex: _Exchange, t0: float) -> None:
        """Fill the record from a finished (or abandoned) exchange."""
        record.ended_s = _perf_counter() - t0
        record.http_status = ex.status
        record.finish_reason = ex.finish_reason
        sent = ex.sent
        if ex.first is not None:
            record.first_token_s = ex.first - t0
            record.ttft_s = ex.first - sent
        if ex.last is not None:
            record.last_token_s = ex.last - t0
            record.e2e_s = ex.last - sent
        record.chunks = len(ex.chunk_offsets)
        record.chunk_offsets_s = ex.chunk_offsets
        usage = ex.usage or {}
        record.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
        record.completion_tokens = _int_or_none(usage.get("completion_tokens"))
        _spec_decode(record, ex.spec_decode)
        if self.keep_text:
            record.text = "".join(ex.texts)
        if self.keep_token_ids and ex.token_ids:
            record.token_ids = ex.token_ids
        self._tokens_per_chunk(record, ex.chunk_ids)

        if ex.error_class is not None:
            self._fail(record, ex.error_class, ex.error or ex.error_class)
            return
        if ex.status is None:
            self._fail(record, "stream_cut", "no response")
            return
        if ex.status != 200:
            text = ex.error_body.decode("utf-8", errors="replace").strip()
            self._fail(record, "http_status", f"HTTP {ex.status}: {text[:500]}")
            return
        if not ex.done and ex.finish_reason is None:
            self._fail(record, "stream_cut", "the stream ended without [DONE] or a finish reason")
            return
        if record.completion_tokens is None:
            self._fail(record, "no_usage", "the stream carried no usage block (completion tokens unknown)")
            return
        record.ok = True
        tokens = record.completion_tokens
        if tokens >= 2 and record.ttft_s is not None and record.e2e_s is not None:
            record.tpot_s = (record.e2e_s - record.ttft_s) / (tokens - 1)

    @staticmethod
    def _tokens_per_chunk(record: RequestRecord, chunk_ids: list[int | None]) -> None:
        if chunk_ids and all(n is not None for n in chunk_ids):
            record.chunk_tokens = [n for n in chunk_ids if n is not None]
            record.tokens_exact = True
            return
        record.tokens_exact = False
        n, total = len(chunk_ids), record.completion_tokens
        if n == 0 or total is None:
            record.chunk_tokens = []
            return
        base, extra = divmod(total, n)
        record.chunk_tokens = [base + (1 if i < extra else 0) for i in range(n)]


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _spec_decode(record: RequestRecord, block: dict[str, Any] | None) -> None:
    """The per-request acceptance block's counts, when whole and consistent; else the fields stay null (a
    malformed block must not fail a request that streamed fine: acceptance then comes from the counters)."""
    if not block:
        return
    steps = _int_or_none(block.get("num_spec_steps"))
    drafted = _int_or_none(block.get("num_draft_tokens"))
    accepted = _int_or_none(block.get("num_accepted_draft_tokens"))
    histogram = block.get("acceptance_histogram")
    if steps is None or drafted is None or accepted is None or not isinstance(histogram, list):
        return
    counts = [_int_or_none(v) for v in histogram]
    if any(c is None or c < 0 for c in counts) or sum(counts) != steps:  # type: ignore[operator, arg-type]
        return
    if sum(j * c for j, c in enumerate(counts)) != accepted:  # type: ignore[operator]
        return
    record.spec_steps, record.spec_draft_tokens, record.spec_accepted_tokens = steps, drafted, accepted
    record.spec_acceptance_histogram = counts  # type: ignore[assignment]
