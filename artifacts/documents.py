"""The raw documents, typed: what each JSON file of the raw tree holds (artifacts.layout says where).

Writers build these models and write them (artifacts.store.write_json); the warehouse reads the same files
through the same models (warehouse.kinds). The models accept every document written so far: fields that
older writers did not write are optional, fields no model declares are kept (`extra="allow"`), so a
document read and written again keeps them.

Value types say what JSON value a field takes; they are strict (a value of another type is refused, not
converted; TYPE_ERRORS gives the words a reader gets): `Number` (an int or a float, taken as a float), `Whole`
(an int), `Text`, `Flag` (true/false), `Time` (ISO-8601 text, kept as written). Value *ranges* (a share within 0..1) are the
warehouse's checks: a field that the warehouse stores as a column carries a `Column` (its name, type and
checks there), and a block whose fields are columns carries `Columns` (the prefix of their names). The cell
summary's columns are all derived that way (`stored_columns`, `StoredReader`): a new summary figure is one field here, one
migration adding its column, one line in the view that shows it (docs/design.md).

The per-row tables (requests, gauges, capture outputs) are parquet files; their column types are
REQUEST_SCHEMA, GAUGE_SCHEMA and OUTPUT_SCHEMA below.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin

import polars as pl
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from specgauge.redact import redact_data

# ---------------------------------------------------------------------------------------------- value types


def _time(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise PydanticCustomError("time", "not an ISO-8601 time: {value}", {"value": repr(value)}) from None
    return value


def _integral(value: Any) -> Any:
    """Counts read from Prometheus text are floats (63.0), and summaries written before the contract kept
    them so: a float with no fraction is that whole number; 63.5 is still refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Strict: a JSON value of another type is refused, never converted ("3" is not a number, 1 not true).
Number = Annotated[float, Field(strict=True)]  # an int is taken, as a float
Whole = Annotated[int, Field(strict=True), BeforeValidator(_integral)]
Text = Annotated[str, Field(strict=True)]
Flag = Annotated[bool, Field(strict=True)]
Time = Annotated[str, Field(strict=True), AfterValidator(_time)]

# What a reader is told when a value has the wrong type (pydantic's error type -> words).
TYPE_ERRORS = {
    "float_type": "expected a number",
    "int_type": "expected a whole number",
    "string_type": "expected a string",
    "bool_type": "expected true/false",
    "dict_type": "expected an object",
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "list_type": "expected a list",
}


def utc_datetime(value: str | None) -> datetime | None:
    """A `Time` as naive UTC ('...Z' or any offset), as the warehouse stores times."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


class Document(BaseModel):
    """A raw JSON document or one of its blocks."""

    model_config = ConfigDict(
        extra="allow", defer_build=True
    )  # schemas built on first use: imports stay quick

    def as_written(self) -> dict[str, Any]:
        """The fields the document had (as read or as built), extras included: what hashes and canonical
        JSON of a block are computed from, so that fields a reader merely declares change nothing."""
        return self.model_dump(mode="json", exclude_unset=True)


class Configuration(Document):
    """A document, or block, of configuration (a spec, a variant, an engine command, a deployment, a run): its
    JSON form (every dump: the file written, the warehouse's columns, hashes of it) passes through
    specgauge.redact, so URL passwords, secret env values and flags, and SecretStr never leave the process. A
    document read from an older file is redacted again when dumped. Measurement documents (summaries,
    requests, outputs) are not: a corpus may hold the text "password=...". The run keeps the real values in
    memory (experiments.spec, tasks.launch.base.Deployment): only what is written is redacted."""

    @model_serializer(mode="wrap")
    def _redacted(self, handler: SerializerFunctionWrapHandler) -> Any:
        return redact_data(handler(self))


# ------------------------------------------------------------------------------------ warehouse columns


@dataclass(frozen=True)
class Column:
    """The warehouse stores this field as a column of the table its document fills.

    `name`: the column (default: the field's name), after the prefix of the blocks around it unless
    `prefixed` is False. `dtype`: its polars type (default from the field: Number Float64, Whole Int32,
    Flag Boolean, Text String; `json`: an object kept as canonical JSON text). The rest are its checks
    (pandera's ge, gt, le, isin; `nullable`)."""

    name: str | None = None
    dtype: Any = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    isin: tuple[str, ...] | None = None
    nullable: bool = True
    prefixed: bool = True
    json: bool = False


@dataclass(frozen=True)
class Columns:
    """This block's `Column` fields are columns too, named `<prefix><column name>`."""

    prefix: str = ""


@dataclass(frozen=True)
class StoredColumn:
    path: tuple[str, ...]  # field names from the document's root
    name: str
    dtype: Any
    column: Column


def _dtype(annotation: Any, column: Column) -> Any:
    if column.dtype is not None:
        return column.dtype
    if column.json:
        return pl.String
    inner = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    kind = inner[0]
    if get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    if kind is bool:
        return pl.Boolean
    if kind is int:
        return pl.Int32
    if kind is str:
        return pl.String
    return pl.Float64  # Number


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def stored_columns(
    model: type[BaseModel], prefix: str = "", path: tuple[str, ...] = ()
) -> list[StoredColumn]:
    """Every `Column` field of `model`, through its `Columns` blocks, in declaration order."""
    out: list[StoredColumn] = []
    for name, info in model.model_fields.items():
        marks = info.metadata
        column = next((m for m in marks if isinstance(m, Column)), None)
        block = next((m for m in marks if isinstance(m, Columns)), None)
        if column is not None:
            label = column.name or name
            full = f"{prefix}{label}" if column.prefixed else label
            out.append(StoredColumn((*path, name), full, _dtype(info.annotation, column), column))
        elif block is not None:
            inner = _model_of(info.annotation)
            assert inner is not None, f"{model.__name__}.{name}: Columns on a field that is not a block"
            out += stored_columns(inner, prefix + block.prefix, (*path, name))
    return out


class StoredReader:
    """The stored columns of a document model, read from its instances: {column name: value}, null where a
    block on the way is null. Blocks are looked up once per document, then their fields by name."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.columns = stored_columns(model)
        blocks: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for column in self.columns:
            blocks.setdefault(column.path[:-1], []).append((column.name, column.path[-1]))
        self._blocks = list(blocks.items())

    def __call__(self, document: BaseModel) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path, fields in self._blocks:
            node: Any = document
            for part in path:
                node = getattr(node, part) if node is not None else None
            if node is None:
                out.update((name, None) for name, _ in fields)
            else:
                out.update((name, getattr(node, field)) for name, field in fields)
        return out


# --------------------------------------------------------------------------------------- shared blocks


class ToolFacts(Document):
    """specgauge.provenance.tool_facts()."""

    specgauge_version: Text | None = None
    git_revision: Text | None = None


class HostFacts(Document):
    """specgauge.provenance.host_facts(): hostname, platform, python, cpus."""

    hostname: Text | None = None


class VariantFacts(Configuration):
    """experiments.spec.Variant as JSON (`model_dump(mode="json")`): every field of it is kept."""

    name: Text
    method: Text | None = None
    k: Whole | None = None
    extra_args: list[Text] | None = None


class SamplingFacts(Document):
    """experiments.spec.Sampling as JSON."""

    temperature: Number | None = None
    max_tokens: Whole | None = None


# ------------------------------------------------------------------------------------------- deployment


class DrafterSwap(Document):
    """One hot swap of a running deployment's EAGLE-3 head (tasks.drafters.swap.swap_head): when it finished
    (UTC), the `drafter_digest` of the head served before and after, the new head's directory, and how long
    the swap took (contract check, RPC, verification)."""

    at: Time
    old_sha256: Text | None = None
    new_sha256: Text
    head: Text
    seconds: Number | None = None
    engine: dict[str, Any] | None = None  # the extension's answer: stage_s, commit_s, tensors, replaced


class DrafterFacts(Document):
    """The drafter a deployment serves (specgauge.checkpoints.drafter_record): the method, the path as
    the spec gave it, the sha256 over its weights and config.json (`drafter_digest`), and its training card's
    facts when it has one. Two campaigns whose drafters differ in `sha256` are never pooled. After a hot
    swap `path`, `sha256` and `card` are the head now serving and `swaps` lists every swap in order (the
    launched head is the first swap's `old_sha256`); a cell copies these facts as they were when it ran."""

    method: Text
    path: Text
    sha256: Text | None = None  # None where the drafter is not readable from here (a hub id, a cluster path)
    card: dict[str, Any] | None = None
    swaps: list[DrafterSwap] | None = None


class EngineFacts(Configuration):
    """What a cell, capture or profile records of the deployment it ran on: a copy of its DeploymentFacts
    (older and hand-written documents have only some of the fields)."""

    launcher: Text | None = None
    command: list[Text] | None = None
    engine_version: Text | None = None
    kv_cache_tokens: Whole | None = None
    max_model_len: Whole | None = None
    job_id: Text | int | None = None
    drafter: DrafterFacts | None = None
    extra: dict[str, Any] | None = None


class DeploymentFacts(Configuration):
    """deployments/<launch_id>/deployment.json: one launched (or adopted) engine serving one variant,
    written by tasks.launch.base.Deployment.save at launch, when ready and at teardown (a living record).
    `id` is the launch id (artifacts.ids.launch_id); times are UTC ISO-8601; `ready_s` is how long the
    readiness check waited; `extra` holds launcher-specific facts (port, kv_cache_gib, node, ...). The API key
    is never written."""

    id: Text
    launcher: Text
    variant: VariantFacts
    served_model_name: Text | None = None
    base_url: Text | None = None
    metrics_url: Text | None = None
    directory: Text | None = None
    command: list[Text] | None = None
    log_path: Text | None = None
    started_at: Time | Literal[""] | None = None
    status: Text  # starting | ready | failed | stopped
    ready_s: Number | None = None
    engine_version: Text | None = None
    kv_cache_tokens: Whole | None = None
    max_model_len: Whole | None = None
    pid: Whole | None = None
    job_id: Text | int | None = None
    stopped_at: Time | None = None
    teardown: Text | None = None
    drafter: DrafterFacts | None = None
    extra: dict[str, Any] | None = None


# ------------------------------------------------------------------------------------------------- cells


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
    process tree that ran the cell: client, load workers, a local engine) + other (every other process)."""

    cpus: Annotated[Whole | None, Column(ge=1)] = None
    busy_share: Annotated[Number | None, Column(ge=0, le=1)] = None
    ours_share: Annotated[Number | None, Column(ge=0, le=1)] = None
    other_share: Annotated[Number | None, Column(ge=0, le=1)] = None


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

# captures/<capture_id>/outputs.parquet: one row per prompt, in meta's prompt_ids order. `token_ids` null
# when the server gave none (or they did not account for every completion token).
OUTPUT_SCHEMA: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "workload": pl.String(),
    "ok": pl.Boolean(),
    "error": pl.String(),
    "text": pl.String(),
    "token_ids": pl.List(pl.Int64()),
    "finish_reason": pl.String(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
}


# --------------------------------------------------------------------------------------------- campaigns


class SloFacts(Document):
    ttft_p99_s: Number | None = None
    tpot_p99_s: Number | None = None


class SpecFacts(Configuration):
    """experiments.spec.ExperimentSpec as JSON: every field kept; these few are read by the warehouse."""

    name: Text | None = None
    repeats: Whole | dict[str, Any] | None = None  # a count, or adaptive {min, max, target_halfwidth}
    slo: SloFacts | None = None

    @property
    def max_repeats(self) -> int | None:
        """Repeat blocks planned: the count, or the adaptive rule's maximum."""
        return self.repeats.get("max") if isinstance(self.repeats, dict) else self.repeats


class PlannedSlot(Document):
    """One deployment slot of the plan (experiments.plan.DeploymentPlan)."""

    slot: Text
    variant: Text
    repeat: Whole
    role: Text  # arm | control
    position: Whole
    cells: list[Text]
    captures: list[Text]


class ImportFacts(Document):
    """Where an imported campaign came from (tasks.imports): the campaign was not run by specgauge but
    translated from another harness's results. `source`: the study (e.g. a GitHub repository),
    `path`: the results folder read, `importer` and `importer_version`: the translation that wrote it."""

    source: Text
    path: Text
    importer: Text
    importer_version: Text
    source_commit: Text | None = None
    imported_utc: Time | None = None


class CampaignRecord(Configuration):
    """campaign.json, written once by tasks.campaign.record_campaign. `variant_order`: the variants in
    launch order, one list per repeat (randomised by the spec's seed). It has no status: each finished run
    adds a RunRecord, and the warehouse derives the status from the latest (docs/warehouse.md). `imported`:
    set only on a campaign translated from another harness's results (tasks.imports); absent otherwise.
    """

    campaign_id: Text
    name: Text | None = None
    label: Text | None = None
    spec_sha256: Text | None = None
    spec: SpecFacts
    variant_order: list[list[Text]] | None = None
    deployments: list[PlannedSlot] | None = None
    created_utc: Time
    tool: ToolFacts | None = None
    host: HostFacts | None = None
    imported: ImportFacts | None = None


class RunRecord(Configuration):
    """runs/<stamp>-<pid>-<nn>.json, one per finished run of the campaign (tasks.campaign.record_run).
    `failed_cells`: the cells that did not end ok in that run (cell id -> status; older records: a list)."""

    campaign_id: Text | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None
    deployments: list[Any] | None = None
    failed_cells: dict[str, Any] | list[Any] | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None


# ---------------------------------------------------------------------------------------------- captures


class CorpusFacts(Document):
    file: Text | None = None
    sha256: Text | None = None


class CaptureMeta(Document):
    """captures/<capture_id>/meta.json (tasks.capture): greedy outputs of one deployment for the gate.
    Capture ids are unique within a campaign only. Older captures name the variant by its name alone and
    the corpus as `corpus_file` / `corpus_sha256`."""

    format: Whole | None = None
    capture_id: Text
    campaign_id: Text | None = None
    deployment_id: Text | None = None
    variant: VariantFacts | Text | None = None
    corpus: CorpusFacts | None = None
    corpus_file: Text | None = None
    corpus_sha256: Text | None = None
    prompt_ids: list[Any] | None = None
    prompt_sha256: dict[str, Any] | None = None
    sampling: dict[str, Any] | None = None
    max_tokens: Whole | None = None
    greedy: Flag | None = None
    endpoint: Text | None = None
    sequential: Flag | None = None
    requests: dict[str, Any] | None = None
    warnings: list[Any] | None = None
    speculation: dict[str, Any] | None = None
    deployment: EngineFacts | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None
    wall_s: Number | None = None

    @property
    def variant_name(self) -> str | None:
        return self.variant if isinstance(self.variant, str) or self.variant is None else self.variant.name


# ---------------------------------------------------------------------------------------------- verdicts


class CaptureRef(Document):
    capture_id: Text
    campaign_id: Text | None = None
    deployment_id: Text | None = None
    variant: Text | None = None
    path: Text | None = None


class Agreement(Document):
    """How two captures agree (tasks.gate.Aggregate): the figures the warehouse keeps."""

    exact_match_rate: Number | None = None
    mean_prefix_fraction: Number | None = None
    mean_edit_distance: Number | None = None
    median_first_divergence: Number | None = None


class ComparedPair(Document):
    a: CaptureRef
    b: CaptureRef
    overall: Agreement | None = None


class ControlPair(ComparedPair):
    label: Text | None = None
    kind: Text  # same_deployment | cross_deployment


class GateRule(Document):
    alpha: Number | None = None
    min_prompts: Whole | None = None
    forced: Flag | None = None


class Range(Document):
    min: Number | None = None
    max: Number | None = None


class Envelope(Document):
    """Range of each figure over the controls: how far one configuration diverges from itself."""

    exact_match_rate: Range | None = None


class GateVerdictDocument(Document):
    """gates/<verdict_id>.json, written once by tasks.gate.write_verdict (docs/gate.md): a speculative
    variant's greedy outputs against plain's, judged against the controls. `passed` exactly when `outcome`
    is consistent; `checks` each say name, value, threshold and whether they passed."""

    format: Whole | None = None
    verdict_id: Text
    campaign_id: Text
    created_utc: Time | None = None
    tool: ToolFacts | None = None
    treatment_variant: Text
    outcome: Text  # consistent | diverged | incomplete
    passed: Flag
    claim: Text
    rule: GateRule | None = None
    n_prompts: Whole
    sampling: dict[str, Any] | None = None
    treatment: ComparedPair
    controls: list[ControlPair] = Field(min_length=1)
    checks: list[dict[str, Any]]
    envelope: Envelope | None = None
    per_stratum: dict[str, Any] | None = None
    worst_cases: list[Any] | None = None
    notes: list[Any] | None = None


# ---------------------------------------------------------------------------------------------- profiles


class ProfileWorkload(Document):
    file: Text | None = None
    sha256: Text | None = None
    stratum: Text | None = None  # null: every prompt of the file
    prompt_ids: list[Any] | None = None


class ProfileLoad(Document):
    mode: Text | None = None
    concurrency: Whole | None = None
    requests: Whole | None = None


class ProfileRequests(Document):
    total: Whole | None = None
    ok: Whole | None = None
    failed: Whole | None = None


class TraceRef(Document):
    """The engine's trace: a copy inside the artifact (`file`) or, when too large, where it is (`pointer`)."""

    file: Text | None = None
    pointer: Text | None = None
    sha256: Text | None = None
    bytes: Whole | None = None


class ProfileMeta(Document):
    """profiles/<profile_id>/meta.json (tasks.profile.window): one profiled window of one deployment. A
    failed window (`status` failed, `error` says why) has no breakdown.json."""

    format: Whole | None = None
    profile_id: Text
    campaign_id: Text
    deployment_id: Text | None = None
    variant: VariantFacts
    profiler: Text  # torch-profiler | nsys
    workload: ProfileWorkload | None = None
    load: ProfileLoad | None = None
    sampling: dict[str, Any] | None = None
    endpoint: Text | None = None
    deployment: EngineFacts | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None
    started_utc: Time | None = None
    window_started_utc: Time | None = None
    window_ended_utc: Time | None = None
    stop_profile_s: Number | None = None
    ended_utc: Time | None = None
    status: Text  # ok | failed
    error: Text | None = None
    requests: ProfileRequests | None = None
    notes: list[Any] | None = None
    trace: TraceRef | None = None


class ProfileCounters(Document):
    drafts: Whole | None = None
    draft_tokens: Whole | None = None
    accepted_tokens: Whole | None = None
    acceptance_rate: Number | None = None
    accepted_per_position: list[Whole] | None = None


class CounterCheck(Document):
    ok: Any = None


class ProfileCrossChecks(Document):
    draft_tokens: CounterCheck | None = None
    drafts: CounterCheck | None = None


class TraceCounts(Document):
    steps: Whole | None = None


class ProfileBreakdown(Document):
    """profiles/<profile_id>/breakdown.json (tasks.profile.breakdown.Breakdown.to_json, docs/profiling.md):
    engine time split into drafting, verification, rejection and other, in `seconds` and in `shares` of
    engine time, with the speculation counters of the window."""

    trace_counts: TraceCounts | None = None
    seconds: dict[str, Number | None] | None = None
    shares: dict[str, Number | None] | None = None
    apportioning: Text | None = None
    counters: ProfileCounters | None = None
    cross_checks: ProfileCrossChecks | None = None


# ---------------------------------------------------------------------------------------- capacity search


class SearchBound(Document):
    """One metric's quantile at a search point (tasks.capacity.Bound): observed, its order-statistic
    confidence bounds (null: too few requests for that side), the limit and the verdict."""

    observed: Number | None = None
    lower: Number | None = None
    upper: Number | None = None
    limit: Number
    verdict: Text  # met | violated | undecided


class SearchPoint(Document):
    rate: Number
    cell_id: Text
    requests: Whole
    failed: Whole
    achieved_rps: Number | None = None
    goodput_rps: Number | None = None
    ttft: SearchBound
    tpot: SearchBound
    status: Text
    verdict: Text  # met | violated | undecided


class SearchLimits(Document):
    ttft_s: Number
    tpot_s: Number
    quantile: Number
    confidence: Number


class CapacitySearchDocument(Document):
    """capacity/<search_id>.json, written once by tasks.capacity.search_deployment: a deployment's capacity
    search under the spec's p99 limits, every point in the order it ran (each point also a cell)."""

    search_id: Text
    campaign_id: Text
    deployment_id: Text
    variant: VariantFacts
    repeat: Whole
    workload: WorkloadFacts
    sampling: dict[str, Any] | None = None
    requests_per_point: Whole
    warmup_per_point: Whole
    limits: SearchLimits
    settings: dict[str, Any]
    capacity_rps: Number | None = None
    first_failing_rps: Number | None = None
    converged: Flag
    stopped_because: Text
    points: list[SearchPoint]
    tool: ToolFacts | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None


# ------------------------------------------------------------------------------------- client calibration


class ClientCalibrationDocument(Document):
    """calibration/<calibration_id>.json, written once at a campaign's start by tasks.load.calibration: the
    client's TTFT and TPOT error (measured - injected), its send lag and the emulator's own lateness, at the
    campaign's heaviest load against the emulator on the machine that runs the campaign's load."""

    calibration_id: Text
    campaign_id: Text
    started_utc: Time | None = None
    ended_utc: Time | None = None
    mode: Text  # closed | open
    concurrency: Whole
    rate: Number | None = None
    requests: Whole
    requests_ok: Whole
    requests_failed: Whole
    injected_ttft_s: Number
    injected_step_s: Number
    ttft_error_p50_s: Number | None = None
    ttft_error_p99_s: Number | None = None
    tpot_error_p50_s: Number | None = None
    tpot_error_p99_s: Number | None = None
    send_lag_p50_s: Number | None = None
    send_lag_p99_s: Number | None = None
    emulator_late_p50_s: Number | None = None
    emulator_late_p99_s: Number | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None


# ------------------------------------------------------------------------------------ adaptation confirmation


class HeadFacts(Document):
    """One drafter head of an adaptation: `label` old | new, the path it was loaded from, its content hash
    (specgauge.checkpoints.drafter_digest) and, for a drafter artifact, its id."""

    label: Text
    path: Text
    sha256: Text | None = None
    drafter_id: Text | None = None


class SwapFacts(Document):
    """One hot swap (tasks.drafters.swap.SwapRecord): when, the serving head's hash before and after."""

    at: Time
    old_sha256: Text | None = None
    new_sha256: Text | None = None
    head: Text


class AdaptationBlock(Document):
    """One block of the randomised schedule: `head` served while the stratum's cells ran (one per load);
    `swap` the swap made before it (null: the head was serving already); `serving_sha256` the hash the
    server reported before the cells ran."""

    position: Whole
    repeat: Whole
    head: Text
    stratum: Text
    cells: list[Text]
    statuses: list[Text] | None = None
    swap: SwapFacts | None = None
    serving_sha256: Text | None = None


class AdaptationComparison(Document):
    """New head against old on one stratum, load and metric: the geometric mean of the per-repeat ratios
    (oriented > 1 = better for the new head) with its t interval over repeats (analysis.stats.ratio_interval)."""

    stratum: Text
    load_label: Text
    metric: Text  # mean_acceptance_length | throughput | tpot_p50
    estimate: Number | None = None
    ci_low: Number | None = None
    ci_high: Number | None = None
    n_repeats: Whole
    interval: Text
    ratios: list[Number]
    repeats: list[Whole]
    old_mean: Number | None = None
    new_mean: Number | None = None


class AdaptationVerdict(Document):
    """The benefit rule on one stratum and load (analysis.adaptation.judge): `adopt` when the gain's
    interval lies above 1 + min_effect, no other stratum's gain estimate is below 1 - max_harm, the new
    head's cells all succeeded and the gate after the swap passed; `reason` says why not."""

    stratum: Text
    load_label: Text
    target: Flag
    gain_metric: Text
    estimate: Number | None = None
    ci_low: Number | None = None
    ci_high: Number | None = None
    n_repeats: Whole
    harm_ok: Flag
    worst_other: Text | None = None
    success_ok: Flag
    gate_passed: Flag | None = None
    adopt: Flag
    reason: Text


class AdaptationGate(Document):
    """The greedy-correctness verdict taken with the new head serving (tasks.gate), or why there is none."""

    verdict_id: Text | None = None
    passed: Flag | None = None
    outcome: Text | None = None
    claim: Text | None = None
    plain_campaign_id: Text | None = None
    capture_id: Text | None = None
    error: Text | None = None


class AdaptationDocument(Document):
    """adaptations/<adaptation_id>.json, written once by tasks.adapt.write_adaptation: one deployment's
    confirmation that a swapped-in head pays (docs/adaptation.md). Its cells are ordinary cells of the same
    campaign (ids: artifacts.ids.adapted_cell_id), each carrying the serving head's hash."""

    adaptation_id: Text
    campaign_id: Text
    deployment_id: Text
    variant: Text
    target_stratum: Text
    strata: list[Text]
    loads: list[Text]
    repeats: Whole
    seed: Whole
    min_effect: Number
    max_harm: Number
    confidence: Number
    gain_metric: Text
    old_head: HeadFacts
    new_head: HeadFacts
    schedule: list[AdaptationBlock]
    swaps: list[SwapFacts]
    swapped_back: Flag
    final_sha256: Text | None = None
    gate: AdaptationGate | None = None
    comparisons: list[AdaptationComparison]
    verdicts: list[AdaptationVerdict]
    adopt_strata: list[Text]
    summary: Text
    status: Text  # ok | failed
    error: Text | None = None
    started_utc: Time | None = None
    ended_utc: Time | None = None
    tool: ToolFacts | None = None
    host: HostFacts | None = None


# ------------------------------------------------------------------------------- effective engine config


class EffectiveEngineConfig(Document):
    """deployment.json's `extra.effective_config`: the settings the engine states it runs with (its
    /server_info, start-up log and /metrics info gauges: tasks.metrics.engine_config), not the flags it was
    given. A setting no source stated is absent (unknown), never assumed. `sources`: what was read."""

    async_scheduling: Flag | None = None
    max_num_batched_tokens: Whole | None = None
    max_num_scheduled_tokens: Whole | None = None
    max_num_seqs: Whole | None = None
    chunked_prefill: Flag | None = None
    prefix_caching: Flag | None = None
    compilation_mode: Text | None = None
    cudagraph_mode: Text | None = None
    enforce_eager: Flag | None = None
    kv_cache_tokens: Whole | None = None
    dtype: Text | None = None
    kv_cache_dtype: Text | None = None
    tensor_parallel_size: Whole | None = None
    data_parallel_size: Whole | None = None
    speculative_method: Text | None = None
    speculative_tokens: Whole | None = None
    sources: list[Text] = []

    # what speculation itself changes: never a confound
    SPECULATIVE: ClassVar[frozenset[str]] = frozenset({"speculative_method", "speculative_tokens"})

    def stated(self) -> dict[str, Any]:
        """The settings a source stated, speculation's own left out."""
        data = self.model_dump(exclude_unset=True, exclude={"sources"})
        return {k: v for k, v in data.items() if k not in self.SPECULATIVE and k in type(self).model_fields}

    def key(self) -> str | None:
        """A hash of `stated()`: two deployments with equal keys ran with equal settings beyond speculation
        (None: nothing was stated)."""
        stated = self.stated()
        if not stated:
            return None
        return hashlib.sha256(json.dumps(stated, sort_keys=True).encode()).hexdigest()[:16]

    def differences(self, other: EffectiveEngineConfig) -> list[str]:
        """'setting: mine -> other's' for each setting beyond speculation that differs, and 'setting: not
        stated by <side>' where only one side states it (vLLM logs a change, not the value it kept)."""
        mine, theirs = self.stated(), other.stated()
        out = []
        for name in type(self).model_fields:
            if name in self.SPECULATIVE or name == "sources":
                continue
            if name in mine and name in theirs:
                if mine[name] != theirs[name]:
                    out.append(f"{name}: {mine[name]} -> {theirs[name]}")
            elif name in mine or name in theirs:
                out.append(f"{name}: not stated by {'plain' if name not in mine else 'speculative'}")
        return out


# ---------------------------------------------------------------------------------------------- drafters


class DrafterSide(Document):
    """One side (train or held out) of a head's training data."""

    examples: Whole
    prompt_tokens: Whole
    output_tokens: Whole
    strata: dict[str, int] = Field(default_factory=dict)  # examples per stratum


class DrafterData(Document):
    """What went into a head (tasks.drafters.training_data.data_summary): `sha256` over every example's
    id, content hash and side, so two heads trained on the same examples name the same data."""

    sha256: Text
    train: DrafterSide
    held_out: DrafterSide
    sources: dict[str, int] = Field(
        default_factory=dict
    )  # examples per source kind (capture, a JSONL's name)
    files: dict[str, str] = Field(default_factory=dict)  # each input file or capture -> its sha256


class DrafterLosses(Document):
    """The training's outcome on the held-out examples (the trainer's own offline check: the simulated
    acceptance length is what a greedy chain of `ttt_steps` would accept, from teacher-forced agreement)."""

    kept_step: Whole  # -1: no step beat the starting head, which is kept as it was
    final_train_loss: Number | None = None
    initial_held_out_mal: Number | None = None  # the parent's (or the untrained head's)
    kept_held_out_mal: Number | None = None
    initial_held_out: dict[str, Any] | None = None  # soft CE and top-1 per draft step, MAL per stratum
    kept_held_out: dict[str, Any] | None = None


class DrafterCard(Document):
    """RAW/drafters/<drafter_id>/card.json: how a head was made, written once when it is done
    (tasks.drafters.training). The head itself is head/ beside it, its curve curve.parquet."""

    drafter_id: Text
    created_utc: Time
    method: Text  # eagle3
    mode: Literal["finetune", "scratch"]
    target_path: Text
    target_sha256: Text  # specgauge.checkpoints.drafter_digest of the target's weights and config
    parent_path: Text | None = None
    parent_sha256: Text | None = None
    aux_layers: list[int]
    data: DrafterData
    hyperparameters: dict[str, Any]
    inputs_sha256: Text  # target, parent, data and hyperparameters: the id is made from it
    head_sha256: Text  # drafter_digest of head/: what deployments record as drafter_sha256
    losses: DrafterLosses
    runner: Text  # local, slurm
    device: Text | None = None
    torch_version: Text | None = None
    train_seconds: Number | None = None
    command: Text | None = None  # how to re-run it


CURVE_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),  # -1: the starting head, before any step
    "loss": pl.Float64(),  # the step's training loss (TTT, weighted over draft steps)
    "lr": pl.Float64(),
    "seconds": pl.Float64(),  # since training started
    "held_out_mal": pl.Float64(),  # simulated acceptance length on the held-out examples (evaluated steps)
    "held_out_top1": pl.List(pl.Float64()),  # top-1 agreement with the target per draft step
    "held_out_soft_ce": pl.List(pl.Float64()),
}
