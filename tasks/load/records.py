"""One streamed request, as measured by the client (the per-request part of docs/metrics contract).

Times are seconds on the client's monotonic clock, relative to the cell's start (`t0`), so records of one
cell compare directly; the cell's meta.json gives t0 as UTC. A cell's requests.parquet is these records,
one row each, of the contract's REQUEST_SCHEMA (artifacts.documents).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import polars as pl

from artifacts.documents import REQUEST_SCHEMA, ErrorClass

__all__ = ["REQUEST_SCHEMA", "ErrorClass", "Phase", "RequestRecord", "records_frame"]

Phase = Literal["warmup", "measured"]


@dataclass
class RequestRecord:
    index: int  # issue order within the cell, warm-up first
    prompt_id: str
    workload: str
    phase: Phase
    endpoint: str  # "chat" or "completions"
    queued_s: float  # when it asked for a concurrency slot (closed loop) or was due (open loop)
    scheduled_s: float | None = None  # open loop: the planned arrival time
    sent_s: float | None = None  # when the request left the client
    first_token_s: float | None = None  # first delta carrying content, reasoning or tool-call arguments
    last_token_s: float | None = None  # last token-bearing chunk
    ended_s: float | None = None  # stream closed
    client_queue_s: float = 0.0  # sent - queued: waiting for a slot, never inside TTFT
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None  # (e2e - ttft) / (completion_tokens - 1), >= 2 tokens only
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from the usage block
    chunks: int = 0  # token-bearing chunks
    chunk_offsets_s: list[float] = field(default_factory=list)  # each token-bearing chunk, from send
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each of those chunks
    tokens_exact: bool = False  # chunk_tokens from server token ids (else derived from usage)
    finish_reason: str | None = None
    http_status: int | None = None
    ok: bool = False
    error_class: ErrorClass | None = None
    error: str | None = None
    token_ids: list[int] | None = None  # kept only when asked (greedy capture)
    text: str | None = None  # kept only when asked (greedy capture)
    # vLLM's per-request acceptance (tasks.load.client): verify steps, draft tokens, accepted draft tokens,
    # and verify steps by the number of drafts they accepted (index j: j accepted; length k + 1)
    spec_steps: int | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    spec_acceptance_histogram: list[int] | None = None

    def as_row(self) -> dict:
        return asdict(self)


def records_frame(records: list[RequestRecord]) -> pl.DataFrame:
    return pl.DataFrame([r.as_row() for r in records], schema=REQUEST_SCHEMA, orient="row")
