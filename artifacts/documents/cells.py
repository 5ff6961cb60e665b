"""Cells: cells/<cell_id>.a<n>/meta.json (CellMeta: what was measured, where and how), summary.json
(CellSummary and its blocks, whose `Column` fields are the warehouse's cell columns), and the per-row parquet
files beside them: requests.parquet (REQUEST_SCHEMA) and gauges.parquet (GAUGE_SCHEMA)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import polars as pl

from artifacts.documents.base import Column, Columns, Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import HostFacts, ToolFacts, VariantFacts
from artifacts.documents.deployments import EngineFacts


class SamplingFacts(Document):
    """experiments.spec.Sampling as JSON."""

    temperature: Number | None = None
    max_tokens: Whole | None = None


class WorkloadFacts(Document):
    file: Text | None = None
    sha256: Text | None = None
    stratum: Text  # the cell's workload
    prompt_ids: list[Any] | None = None


class LoadFacts(Document):
    """The cell's load (experiments.spec.LoadSpec plus the cell's own concurrency or rate)."""

    mode: Text  # closed | open
    concurrency: Whole | None = None
    rate: Number | None = None
    arrival: Text | None = None
    requests: Whole | None = None
    warmup: Whole | None = None
    time_cap_s: Number | None = None
    request_timeout_s: Number | None = None
    seed: Whole | None = None
    # client processes that generated the load (tasks/load/workers.py); None: written before it was recorded,
    # when every cell's load came from one process
    workers: Whole | None = None
    # load.cluster's load (tasks/load/dask_load.py): kind, scheduler, hosts (each: workers, clock offset and its
    # uncertainty against the scheduler, ms); None: the load came from this host
    cluster: dict[str, Any] | None = None


class CellMeta(Document):
    """cells/<cell_id>.a<n>/meta.json: what was measured, where and how (tasks.cell.run_cell).
    `cell_id`, `attempt` and `campaign_id` match the directory. `deployment_id` is the launch id. `t0_utc`
    is the UTC time of the cell's clock zero (request and gauge times count from it); `capped`: the load
    stopped at `time_cap_s` before every request was sent."""

    cell_id: Text
    campaign_id: Text
    deployment_id: Text
    variant: VariantFacts
    repeat: Whole
    workload: WorkloadFacts
    load: LoadFacts
    sampling: SamplingFacts | None = None
    endpoint: Text | None = None  # chat | completions
    deployment: EngineFacts | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None
    t0_utc: Time | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None
    capped: Flag | None = None
    attempt: Whole


_NonNegative = Column(ge=0)


class RequestCounts(Document):
    """Measured requests (`phase == "measured"`) only; `errors` counts failures by error class
    (`unknown` when a failure has none)."""

    total: Annotated[Whole | None, _NonNegative] = None
    ok: Annotated[Whole | None, _NonNegative] = None
    failed: Annotated[Whole | None, _NonNegative] = None
    success_rate: Annotated[Number | None, Column(prefixed=False, ge=0, le=1)] = None
    errors: Annotated[dict[str, Any] | None, Column("request_errors", prefixed=False, json=True)] = None


_Seconds = Column(ge=0)


class Distribution(Document):
    """mean and percentiles (numpy's default, linear interpolation, as vLLM's `bench serve`) and n; all
    null when there are no values."""

    mean: Annotated[Number | None, Column("mean_s", ge=0)] = None
    p50: Annotated[Number | None, Column("p50_s", ge=0)] = None
    p90: Annotated[Number | None, Column("p90_s", ge=0)] = None
    p95: Annotated[Number | None, Column("p95_s", ge=0)] = None
    p99: Annotated[Number | None, Column("p99_s", ge=0)] = None
    n: Annotated[Whole | None, Column("n", ge=0)] = None


class Latency(Document):
    """Successful measured requests only. `tpot` leaves out requests of fewer than 2 tokens. `chunk_gap`:
    every gap between consecutive token-bearing chunks, pooled over requests. `itl_per_token`: the gap before
    a chunk of k tokens divided by k, counted k times (once per token), so `mean` = sum of gaps / tokens
    after each request's first chunk and `n` counts tokens."""

    ttft: Annotated[Distribution | None, Columns("ttft_")] = None
    tpot: Annotated[Distribution | None, Columns("tpot_")] = None
    e2e: Annotated[Distribution | None, Columns("e2e_")] = None
    chunk_gap: Annotated[Distribution | None, Columns("chunk_gap_")] = None
    itl_per_token: Annotated[Distribution | None, Columns("itl_per_token_")] = None


class Goodput(Document):
    """`good` = successful requests with TTFT <= `ttft_slo_s` and TPOT <= `tpot_slo_s` (a request of fewer
    than 2 tokens has no TPOT and meets that half); `share` = good / all measured requests (failures miss);
    `rate_rps` = good / wall. The SLOs are the spec's `slo.ttft_p99_s` / `slo.tpot_p99_s`."""

    ttft_slo_s: Annotated[Number | None, Column(gt=0)] = None
    tpot_slo_s: Annotated[Number | None, Column(gt=0)] = None
    good: Whole | None = None
    share: Annotated[Number | None, Column(ge=0, le=1)] = None
    rate_rps: Annotated[Number | None, Column(ge=0)] = None


class Speculation(Document):
    """The `/metrics` deltas over the measured window (tasks.metrics.prometheus; per-position rates `{}`
    when the server lacks that counter, rates null when their denominator is 0). `tokens` (T) =
    d(vllm:generation_tokens_total) over the window (`tokens_basis: "server"`), else the client's measured
    completion tokens (`"client"`). `decode_steps` = T - accepted (per-request steps, the prefill's first
    token included). `inferred_step_time_s` = mean TPOT of successful measured requests x T / (T - accepted).
    Stored in the warehouse's spec_decode and spec_decode_positions tables."""

    drafts: Whole | None = None
    draft_tokens: Whole | None = None
    accepted_tokens: Whole | None = None
    acceptance_rate: Number | None = None
    mean_acceptance_length: Number | None = None
    acceptance_rate_per_position: dict[str, Number | None] | None = None
    decode_steps: Whole | None = None
    inferred_step_time_s: Number | None = None
    accepted_per_position: dict[str, Any] | None = None
    tokens: Whole | None = None
    tokens_basis: Text | None = None  # server | client


class TokensPerChunkCheck(Document):
    """`client` = tokens_per_chunk_mean; `server` = T / (T - accepted), the mean acceptance length over ALL
    decode steps. vLLM's `mean_acceptance_length` (kept beside it) averages only over steps that carried a
    draft, so it disagrees legitimately when some steps draft nothing (n-gram: 1.99 vs 1.43 measured) while a
    chunk is one step either way. `ok`: |rel_diff| <= `tolerance` (0.10; measured agreement within 4%; a
    larger gap means chunks are not steps, e.g. merged by a slow client or a proxy, or wrong per-chunk
    counts). `rel_diff` = (client - server) / server, as in every check."""

    client: Annotated[Number | None, Column()] = None
    server: Annotated[Number | None, Column()] = None
    rel_diff: Annotated[Number | None, Column()] = None
    ok: Annotated[Flag | None, Column()] = None
    mean_acceptance_length: Number | None = None
    tolerance: Number | None = None
    note: Text | None = None


class GenerationTokensCheck(Document):
    """`client` = completion tokens of all measured requests with a usage block, `server` =
    d(vllm:generation_tokens_total); `ok`: |rel_diff| <= `tolerance` (0.02: they agreed exactly on the
    embedded engine; cut streams add server tokens the client never hears of). Not judged (`ok` null,
    `note` says why) when a warm-up request overlaps the measured window or a measured request falls
    outside it."""

    client: Annotated[Number | None, Column()] = None
    server: Annotated[Number | None, Column()] = None
    rel_diff: Annotated[Number | None, Column()] = None
    ok: Annotated[Flag | None, Column()] = None
    tolerance: Number | None = None
    note: Text | None = None


class BurstCheck(Document):
    """Share of successful responses of >= 4 chunks whose chunks all arrived within 1 ms (held back and
    delivered at once: their TTFT equals their E2E, their TPOT reads 0). `ok`: share <= `tolerance`."""

    bursts: Whole | None = None
    responses: Whole | None = None
    share: Number | None = None
    ok: Flag | None = None
    tolerance: Number | None = None


class CrossChecks(Document):
    tokens_per_chunk_vs_acceptance_length: Annotated[
        TokensPerChunkCheck | None, Columns("check_tokens_per_chunk_")
    ] = None
    completion_tokens_vs_generation_tokens: Annotated[
        GenerationTokensCheck | None, Columns("check_completion_tokens_")
    ] = None
    streamed_token_by_token: BurstCheck | None = None


class GaugeSummary(Document):
    """The gauge sampler's rows within the measured window; `preemptions` = last - first
    `preemptions_total`; `scrape_failures`: scrapes that failed and were skipped."""

    kv_cache_usage_max: Annotated[Number | None, Column(ge=0, le=1)] = None
    kv_cache_usage_mean: Annotated[Number | None, Column(ge=0, le=1)] = None
    running_max: Annotated[Number | None, Column(dtype=pl.Float64, ge=0)] = None
    waiting_max: Annotated[Number | None, Column(dtype=pl.Float64, ge=0)] = None
    preemptions: Annotated[Number | None, Column(dtype=pl.Float64, ge=0)] = None
    samples: Annotated[Whole | None, Column(ge=0)] = None
    scrape_failures: Whole | None = None


class HostLoad(Document):
    """Shares of the host's CPU capacity while the cell measured (tasks.metrics.host_load): busy = ours (the
    process tree that ran the cell: client, load workers, a local engine) + other (every other process) +
    steal (time the hypervisor ran other tenants of a virtual machine's host while this one wanted the CPU;
    null: recorded before steal was kept apart, when it was counted in `other`)."""

    cpus: Annotated[Whole | None, Column(ge=1)] = None
    busy_share: Annotated[Number | None, Column(ge=0, le=1)] = None
    ours_share: Annotated[Number | None, Column(ge=0, le=1)] = None
    other_share: Annotated[Number | None, Column(ge=0, le=1)] = None
    steal_share: Annotated[Number | None, Column(ge=0, le=1)] = None


class CellSummary(Document):
    """cells/<cell_id>.a<n>/summary.json, built by tasks.metrics.summary.summarize_cell.

    Only measured requests count; latency figures cover the successful ones; a figure that cannot be
    computed is null (JSON has no NaN). `status` is failed, with `error`, when there were no measured requests,
    every measured request failed, or the server side is invalid (`server_valid` false, `server_problem`
    says why, e.g. a counter went down: the server restarted during the window)."""

    status: Annotated[Text, Column(isin=("ok", "failed"), nullable=False)]
    error: Annotated[Text | None, Column()] = None
    requests: Annotated[RequestCounts | None, Columns("requests_")] = None
    # First measured send to last measured end (`ended_s`, else `last_token_s`), failures included.
    wall_s: Annotated[Number | None, _Seconds] = None
    # The time-weighted mean number of measured requests in flight (sent, not yet ended; failures included)
    # over the wall_s window: the load the engine actually got. A closed-loop cell at C reaches C only while
    # every worker has a request out; fewer requests than C, or a ramp and a tail, keep it below (validity
    # reads achieved / C: analysis/validity.py). Null without a window.
    achieved_concurrency: Annotated[Number | None, Column(ge=0)] = None
    measured_window_s: list[Number] | None = None  # (before, after) scrape times on the records' clock
    # Successful completion tokens / wall_s; successful requests / wall_s.
    output_throughput_tok_s: Annotated[Number | None, Column(ge=0)] = None
    request_throughput_rps: Annotated[Number | None, Column(ge=0)] = None
    # Sums over successful measured requests.
    completion_tokens: Annotated[Whole | None, Column(dtype=pl.Int64, ge=0)] = None
    prompt_tokens: Annotated[Whole | None, Column(dtype=pl.Int64, ge=0)] = None
    latency_s: Annotated[Latency | None, Columns()] = None
    # Successful completion tokens / their chunks; every successful request had per-chunk token ids.
    tokens_per_chunk_mean: Annotated[Number | None, Column(ge=0)] = None
    tokens_exact: Annotated[Flag | None, Column()] = None
    goodput: Annotated[Goodput | None, Columns("goodput_")] = None
    speculation: Speculation | None = None  # null for plain
    cross_checks: Annotated[CrossChecks | None, Columns()] = None
    gauges: Annotated[GaugeSummary | None, Columns("gauge_")] = None
    server_valid: Annotated[Flag | None, Column()] = None
    server_problem: Annotated[Text | None, Column()] = None
    host: Annotated[HostLoad | None, Columns("host_")] = None  # who else used the CPU (null: not Linux)


# ------------------------------------------------------------------------------------ per-row parquet files

# requests.parquet: one row per request of a cell, warm-up rows included (`phase`); what each column means:
# tasks.load.records.RequestRecord.
ErrorClass = Literal["connect", "timeout", "http_status", "stream_cut", "no_usage", "protocol", "cancelled"]
ERROR_CLASSES: tuple[str, ...] = get_args(ErrorClass)
REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "index": pl.Int32(),
    "prompt_id": pl.String(),
    "workload": pl.String(),
    "phase": pl.String(),
    "endpoint": pl.String(),
    "queued_s": pl.Float64(),
    "scheduled_s": pl.Float64(),
    "sent_s": pl.Float64(),
    "first_token_s": pl.Float64(),
    "last_token_s": pl.Float64(),
    "ended_s": pl.Float64(),
    "client_queue_s": pl.Float64(),
    "ttft_s": pl.Float64(),
    "e2e_s": pl.Float64(),
    "tpot_s": pl.Float64(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "chunks": pl.Int32(),
    "chunk_offsets_s": pl.List(pl.Float64()),
    "chunk_tokens": pl.List(pl.Int32()),
    "tokens_exact": pl.Boolean(),
    "finish_reason": pl.String(),
    "http_status": pl.Int32(),
    "ok": pl.Boolean(),
    "error_class": pl.String(),
    "error": pl.String(),
    "token_ids": pl.List(pl.Int64()),
    "text": pl.String(),
    "spec_steps": pl.Int64(),
    "spec_draft_tokens": pl.Int64(),
    "spec_accepted_tokens": pl.Int64(),
    "spec_acceptance_histogram": pl.List(pl.Int64()),
}
# Columns a requests.parquet written before they existed lacks: read as null (acceptance per request came
# with vLLM 0.32's per-request metrics; older cells have only the counters).
REQUEST_OPTIONAL_COLUMNS = frozenset(
    {"spec_steps", "spec_draft_tokens", "spec_accepted_tokens", "spec_acceptance_histogram"}
)

# gauges.parquet: one row per /metrics scrape during a cell. `t_s`: seconds from the cell's t0 (the request
# records' clock), the midpoint of the scrape; `kv_cache_usage` 0..1; `preemptions_total` cumulative.
GAUGE_SCHEMA: dict[str, pl.DataType] = {
    "t_s": pl.Float64(),
    "kv_cache_usage": pl.Float64(),
    "running": pl.Int64(),
    "waiting": pl.Int64(),
    "preemptions_total": pl.Int64(),
}
