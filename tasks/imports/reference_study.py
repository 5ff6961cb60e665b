"""The reference study's results (github.com/swiss-ai/apertus-speculative-decoding) as a specgauge campaign.

What the reference harness writes (its apertus_bench.runner.run_cell), one folder per cell anywhere under a
results folder (results/70b/diagnostics-20260919/<arm>/<job>/<workload>/c<N>/repeat-NN/,
results/8b/eagle/confirm/<deployment>/cells/<workload>/c<N>/, ...):

    metadata.json            schema_version 1: harness, served `model`, `variant` (name, method,
                             num_speculative_tokens, ...), `cell` (workload, concurrency, requests,
                             warmup_requests, repeat, generation), workload file and sha256, prompt_ids,
                             `extra` (strings: deployment_id, slurm_job_id, vllm_revision, max_model_len, ...)
    summary.json             requests, tokens, latency_ms (count, mean, p50, p95, p99), wall_seconds,
                             speculative_decoding (its own deltas: never read here)
    requests.jsonl           one measured request a line: success, e2e_ms, ttft_ms, tpot_ms,
                             stream_event_gaps_ms, prompt_tokens, completion_tokens, finish_reason, error
    metrics_before.prom, metrics_after.prom    /metrics right before and after the measured requests
                             (absent when the run had no metrics URL)
    metrics_timeseries.jsonl gauge samples (some runs)

Each cell becomes one of our cell attempts (CellMeta, CellSummary, the two /metrics texts copied verbatim),
each reference deployment (served model, i.e. arm and job) one DeploymentFacts, and the whole folder one
campaign `seed-<name>` whose CampaignRecord carries `imported`. Then the normal ingest loads it
(flows.import_reference: this module never touches the warehouse).

Speculation figures are recomputed from the two snapshots by tasks.metrics.prometheus.spec_decode_delta, as
for our own cells. Latency figures come from requests.jsonl through tasks.metrics.summary's code when the
cell has it; otherwise from summary.json field by field (the reference computes mean and linearly
interpolated percentiles as we do; it has no p90, which stays null). requests.parquet is written empty:
the reference records no request times on a common clock (our `queued_s`, `sent_s`), and those are not
guessed. gauges.parquet is written empty: no gauge samples are translated.

Never guessed: a file that cannot be read or validated is reported as damaged and its cell skipped; files
the importer does not read (gate verdicts, captures, load-test summaries, logs) are reported and skipped.
Raw files already written are never rewritten, so a second import adds nothing.

Names from the reference's data that become folder names (variant names, strata) must be safe names
(specgauge.names): one that is not refuses the whole import, naming the file and field, before anything is
written. One import per target at a time: the import holds the campaign's writer lock (artifacts.store
.campaign_writer) while it writes and ingests; a second import of the same tree into the same home waits for
it, then finds every cell written and adds nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from artifacts import ids, layout
from artifacts.documents import (
    GAUGE_SCHEMA,
    REQUEST_SCHEMA,
    CampaignRecord,
    CellMeta,
    CellSummary,
    CrossChecks,
    DeploymentFacts,
    Distribution,
    EngineFacts,
    GenerationTokensCheck,
    ImportFacts,
    Latency,
    LoadFacts,
    RunRecord,
    SamplingFacts,
    SpecFacts,
    ToolFacts,
    VariantFacts,
    WorkloadFacts,
)
from artifacts.store import atomic_dir, read_document, write_json, write_json_atomic
from experiments.methods import REGISTRY
from specgauge.errors import ArtifactError, CounterReset, InputError, MetricsError
from specgauge.names import safe_name_problem
from specgauge.provenance import host_facts, tool_facts, utc_stamp
from tasks.metrics.prometheus import GENERATION_TOKENS, Snapshot, counter_delta, parse, spec_decode_delta
from tasks.metrics.summary import (
    GENERATION_TOKENS_TOLERANCE,
    burst_check,
    cell_status,
    chunk_gaps,
    distribution,
    request_counts,
    speculation_block,
    tokens_per_chunk_check,
)

SOURCE = "github.com/swiss-ai/apertus-speculative-decoding"
IMPORTER = "specgauge import seed"
IMPORTER_VERSION = "1"
CAMPAIGN_PREFIX = "seed-"

METADATA = "metadata.json"
SUMMARY = "summary.json"
REQUESTS = "requests.jsonl"
BEFORE = "metrics_before.prom"
AFTER = "metrics_after.prom"
TIMESERIES = "metrics_timeseries.jsonl"
CELL_FILES = frozenset({METADATA, SUMMARY, REQUESTS, BEFORE, AFTER, TIMESERIES})

# Our CellMeta keeps where an attempt came from, so a second import finds it instead of adding another.
SOURCE_FIELD = "imported_from"


# ------------------------------------------------------------------------------ the reference's documents


class _Reference(BaseModel):
    """A reference document: its fields typed strictly (a wrong type is damage, never converted); fields
    it has beyond these are kept but not read."""

    model_config = ConfigDict(extra="allow", strict=True)


class RefVariant(_Reference):
    name: str = Field(min_length=1)
    method: str
    num_speculative_tokens: int | None = None


class RefGeneration(_Reference):
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    ignore_eos: bool | None = None


class RefCell(_Reference):
    workload: str = Field(min_length=1)
    concurrency: int = Field(gt=0)
    requests: int = Field(ge=0)
    warmup_requests: int = Field(ge=0)
    repeat: int
    generation: RefGeneration


class RefMetadata(_Reference):
    """metadata.json (apertus_bench.runner.run_cell), schema_version 1."""

    schema_version: int
    harness_version: str | None = None
    harness_git_revision: str | None = None
    started_at: str
    ended_at: str
    base_url: str | None = None
    metrics_url: str | None = None
    model: str = Field(min_length=1)
    variant: RefVariant
    cell: RefCell
    workload_file: str | None = None
    workload_file_sha256: str | None = None
    prompt_ids: list[str] | None = None
    extra: dict[str, str] = Field(default_factory=dict)

    @field_validator("started_at", "ended_at")
    @classmethod
    def utc_time(cls, value: str) -> str:
        # Deployments are ordered by these times: an unreadable one is damage, never a crash later.
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            shown = repr(value if len(value) <= 40 else value[:37] + "...")
            raise ValueError(f"{shown} is not an ISO 8601 time") from None
        if parsed.utcoffset() is None:
            raise ValueError(f"{value!r} has no UTC offset (the time would be guessed)")
        return value


class RefDistribution(_Reference):
    count: int = Field(ge=0)
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None


class RefRequestCounts(_Reference):
    attempted: int = Field(ge=0)
    successful: int = Field(ge=0)
    failed: int = Field(ge=0)


class RefTokens(_Reference):
    prompt: int = Field(ge=0)
    completion: int = Field(ge=0)


class RefLatency(_Reference):
    e2e: RefDistribution
    ttft: RefDistribution
    tpot: RefDistribution
    stream_event_gap: RefDistribution


class RefSummary(_Reference):
    """summary.json (apertus_bench.runner.summarize). Its speculative_decoding block is not read: ours is
    recomputed from the snapshots."""

    requests: RefRequestCounts
    tokens: RefTokens
    latency_ms: RefLatency
    wall_seconds: float = Field(gt=0)


class RefRequest(_Reference):
    """One line of requests.jsonl (apertus_bench.client.RequestMeasurement)."""

    request_index: int = Field(ge=0)
    prompt_id: str
    success: bool
    status_code: int | None = None
    e2e_ms: float = Field(ge=0)
    ttft_ms: float | None = Field(default=None, ge=0)
    tpot_ms: float | None = Field(default=None, ge=0)
    stream_event_gaps_ms: list[float] = Field(default_factory=list)
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    finish_reason: str | None = None
    error: str | None = None


# -------------------------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class Skipped:
    """A file the import did not take, and why. `damaged`: it could not be read or validated (as opposed
    to a file the importer does not read, or one left out because its cell was incomplete)."""

    path: Path
    reason: str
    damaged: bool = False


@dataclass
class ReferenceTranslation:
    """What one translation of a reference tree did: cells written now, cells found already imported, and
    what was skipped. (flows.import_reference.SeedImport adds the ingest's report.)"""

    results_dir: Path
    campaign_id: str
    campaign_dir: Path
    written: list[str] = field(default_factory=list)  # cell attempt directories written by this import
    already: list[str] = field(default_factory=list)  # attempts an earlier import wrote
    deployments: list[str] = field(default_factory=list)  # deployment ids written by this import
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def damaged(self) -> list[Skipped]:
        return [s for s in self.skipped if s.damaged]

    @property
    def importable(self) -> bool:
        return bool(self.written or self.already)

    @property
    def exit_code(self) -> int:
        """0: imported, nothing damaged; 1: something damaged (the rest imported); 2: nothing importable."""
        if not self.importable:
            return 2
        return 1 if self.damaged else 0


class _Damaged(Exception):
    """A reference file that cannot be read or fails validation (path and reason)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


# ------------------------------------------------------------------------------------------ reading


def _validation_reason(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "(document)"
    return f"field {where}: {first['msg'].removeprefix('Value error, ')}"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise _Damaged(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _Damaged(path, f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except OSError as exc:
        raise _Damaged(path, f"cannot read: {exc.strerror or exc}") from None


M = TypeVar("M", bound=BaseModel)


def _read_model(path: Path, model: type[M]) -> M:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise _Damaged(path, f"expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _Damaged(path, _validation_reason(exc)) from None


def _read_requests(path: Path) -> list[RefRequest]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _Damaged(path, f"cannot read: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(RefRequest.model_validate_json(line))
        except ValidationError as exc:
            raise _Damaged(path, f"line {number}: {_validation_reason(exc)}") from None
    return out


def _read_snapshot(path: Path) -> tuple[bytes, Snapshot]:
    try:
        raw = path.read_bytes()
        return raw, parse(raw.decode("utf-8"), source=str(path))
    except UnicodeDecodeError as exc:
        raise _Damaged(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise _Damaged(path, f"cannot read: {exc.strerror or exc}") from None
    except MetricsError as exc:
        raise _Damaged(path, str(exc).removeprefix(f"{path}: ")) from None


@dataclass
class _ReferenceCell:
    directory: Path
    relative: str  # the folder, relative to the results folder: the attempt's provenance
    metadata: RefMetadata
    summary: RefSummary
    requests: list[RefRequest] | None
    before: tuple[bytes, Snapshot] | None
    after: tuple[bytes, Snapshot] | None

    @property
    def deployment_key(self) -> str:
        """One reference deployment: its own id when it recorded one, else its served model name (the
        reference names each launch's model uniquely, with a timestamp)."""
        return self.metadata.extra.get("deployment_id") or self.metadata.model

    @property
    def started(self) -> datetime:
        return datetime.fromisoformat(self.metadata.started_at)


def _read_cell(directory: Path, results_dir: Path, skipped: list[Skipped]) -> _ReferenceCell | None:
    """One reference cell folder, or None (with every file of it reported) when it cannot be imported."""
    present = {p.name: p for p in directory.iterdir() if p.is_file() and p.name in CELL_FILES}
    damaged: list[_Damaged] = []

    def attempt(name: str, read: Any) -> Any:
        if name not in present:
            return None
        try:
            return read(present[name])
        except _Damaged as exc:
            damaged.append(exc)
            return None

    metadata: RefMetadata | None = attempt(METADATA, lambda p: _read_model(p, RefMetadata))
    summary: RefSummary | None = attempt(SUMMARY, lambda p: _read_model(p, RefSummary))
    requests: list[RefRequest] | None = attempt(REQUESTS, _read_requests)
    before = attempt(BEFORE, _read_snapshot)
    after = attempt(AFTER, _read_snapshot)
    if metadata is not None:  # names that become folder names: refused outright, whatever else is wrong
        _refuse_unsafe_names(present[METADATA], metadata)
    if metadata is not None and metadata.schema_version != 1:
        damaged.append(
            _Damaged(present[METADATA], f"schema_version {metadata.schema_version}: only 1 is understood")
        )
    if TIMESERIES in present:
        skipped.append(Skipped(present[TIMESERIES], "gauge time series: not translated (gauges stay empty)"))

    def skip_rest(reason: str) -> None:
        bad = {d.path for d in damaged}
        skipped.extend(Skipped(d.path, d.reason, damaged=True) for d in damaged)
        skipped.extend(
            Skipped(path, reason)
            for name, path in sorted(present.items())
            if path not in bad and name != TIMESERIES
        )

    if damaged:
        skip_rest(f"cell skipped: {damaged[0].path.name} in this cell is damaged")
        return None
    missing = [name for name in (METADATA, SUMMARY) if name not in present]
    if missing:
        skip_rest(f"cell incomplete: no {' or '.join(missing)}")
        return None
    if (before is None) != (after is None):
        skip_rest(f"cell incomplete: {AFTER if after is None else BEFORE} missing (snapshots come in pairs)")
        return None
    assert metadata is not None and summary is not None
    problem = _unmappable(metadata)
    if problem:
        skip_rest(f"cell skipped: {problem}")
        return None
    return _ReferenceCell(
        directory=directory,
        relative=directory.relative_to(results_dir).as_posix(),
        metadata=metadata,
        summary=summary,
        requests=requests,
        before=before,
        after=after,
    )


def _unmappable(metadata: RefMetadata) -> str | None:
    """Why a valid reference cell has no place in our tables (None: it has one)."""
    variant = metadata.variant
    if variant.method not in REGISTRY.names:
        return f"metadata.json variant.method {variant.method!r} is not a method specgauge knows ({', '.join(REGISTRY.names)})"
    if (variant.method == "none") != (variant.num_speculative_tokens is None):
        return (
            "metadata.json variant.num_speculative_tokens: plain needs none, a speculative method needs one"
        )
    if "." in metadata.cell.workload:
        return f"metadata.json cell.workload {metadata.cell.workload!r}: a workload name cannot contain '.'"
    return None


def _refuse_unsafe_names(path: Path, metadata: RefMetadata) -> None:
    """InputError naming the file and field of a name from data that cannot be a folder name
    (specgauge.names): such a name would put artifacts outside SPECGAUGE_HOME. Raised while reading, so
    before anything is written."""
    for what, value in (("variant.name", metadata.variant.name), ("cell.workload", metadata.cell.workload)):
        problem = safe_name_problem(value, what)
        if problem:
            raise InputError(f"{path}: field {what}: {problem}; nothing was imported")


def _classify_loose(path: Path) -> Skipped:
    """A file outside a cell folder: what it is, and why it is not imported."""
    if path.suffix != ".json":
        return Skipped(path, "not a reference cell artifact: the importer does not read it")
    try:
        data = _read_json(path)
    except _Damaged as exc:
        return Skipped(path, exc.reason, damaged=True)
    if isinstance(data, dict) and {"criterion", "treatment", "controls", "verdict"} <= data.keys():
        # Its figures are worst cases over prompts between served models; our verdicts hold mean agreement
        # between named captures with per-check thresholds. They do not correspond field for field.
        return Skipped(path, "gate verdict: not mapped (worst-case figures over model names, no capture ids)")
    if isinstance(data, dict) and isinstance(data.get("cases"), list) and "model" in data:
        return Skipped(
            path, "greedy capture: not mapped (no token ids, no deployment id; the gate is not imported)"
        )
    return Skipped(path, "JSON of a kind the importer does not read")


def _walk(results_dir: Path) -> tuple[list[Path], list[Path]]:
    """(cell folders, other files) under the results folder, in path order."""
    cells: set[Path] = set()
    files: list[Path] = []
    for path in sorted(results_dir.rglob("*")):
        if not path.is_file() or any(part.startswith(".") for part in path.relative_to(results_dir).parts):
            continue
        if path.name in CELL_FILES:
            cells.add(path.parent)
        else:
            files.append(path)
    return sorted(cells), files


# ------------------------------------------------------------------------------------------- translating


@dataclass(frozen=True)
class _Deployment:
    variant: str
    key: str  # the reference deployment (_ReferenceCell.deployment_key)
    repeat: int
    cells: tuple[_ReferenceCell, ...]


def _deployments(cells: Iterable[_ReferenceCell]) -> list[_Deployment]:
    """Reference deployments by variant; `repeat` numbers each variant's deployments from 0 in the order
    they ran (their first cell's start), as our repeats number independently launched deployments."""
    groups: dict[tuple[str, str], list[_ReferenceCell]] = {}
    for cell in cells:
        groups.setdefault((cell.metadata.variant.name, cell.deployment_key), []).append(cell)
    by_variant: dict[str, list[tuple[datetime, str, list[_ReferenceCell]]]] = {}
    for (variant, key), members in groups.items():
        members.sort(key=lambda c: (c.started, c.relative))
        by_variant.setdefault(variant, []).append((members[0].started, key, members))
    out = []
    for variant, launches in sorted(by_variant.items()):
        for repeat, (_, key, members) in enumerate(sorted(launches, key=lambda item: (item[0], item[1]))):
            out.append(_Deployment(variant, key, repeat, tuple(members)))
    return out


def _variant(metadata: RefMetadata) -> VariantFacts:
    """Our variant: name, method, k; the reference's other variant fields kept beside them."""
    ref = metadata.variant
    others = {
        k: v for k, v in ref.model_dump().items() if k not in ("name", "method", "num_speculative_tokens")
    }
    return VariantFacts.model_validate(
        {"name": ref.name, "method": ref.method, "k": ref.num_speculative_tokens, **others}
    )


def _whole(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _deployment_facts(deployment: _Deployment, deployment_id: str) -> DeploymentFacts:
    first = deployment.cells[0].metadata
    extra = dict(first.extra)
    extra["reference_deployment"] = deployment.key
    return DeploymentFacts(
        id=deployment_id,
        launcher="reference",  # launched by the reference study's own scripts, not by specgauge
        variant=_variant(first),
        served_model_name=first.model,
        base_url=first.base_url,
        metrics_url=first.metrics_url,
        status="stopped",  # a finished study: nothing of it is running
        engine_version=first.extra.get("vllm_revision"),
        max_model_len=_whole(first.extra.get("max_model_len")),
        job_id=first.extra.get("slurm_job_id"),
        extra=extra,
    )


def _cell_meta(
    cell: _ReferenceCell,
    cell_id: str,
    attempt: int,
    campaign_id: str,
    repeat: int,
    facts: DeploymentFacts,
) -> CellMeta:
    ref = cell.metadata
    generation = ref.cell.generation
    sampling = SamplingFacts.model_validate(
        {
            k: v
            for k, v in generation.model_dump().items()
            if v is not None or k in ("temperature", "max_tokens")
        }
    )
    return CellMeta.model_validate(
        {
            "cell_id": cell_id,
            "campaign_id": campaign_id,
            "deployment_id": facts.id,
            "variant": _variant(ref).as_written(),
            "repeat": repeat,
            "workload": WorkloadFacts(
                file=ref.workload_file,
                sha256=ref.workload_file_sha256,
                stratum=ref.cell.workload,
                prompt_ids=ref.prompt_ids,
            ).as_written(),
            # The reference's workers each send their next request when the last one ends: a closed loop.
            "load": LoadFacts(
                mode="closed",
                concurrency=ref.cell.concurrency,
                requests=ref.cell.requests,
                warmup=ref.cell.warmup_requests,
            ).as_written(),
            "sampling": sampling.as_written(),
            "endpoint": "chat",  # the reference client posts to /v1/chat/completions only
            "deployment": EngineFacts(
                launcher=facts.launcher,
                engine_version=facts.engine_version,
                max_model_len=facts.max_model_len,
                job_id=facts.job_id,
                extra=facts.extra,
            ).as_written(),
            "tool": ToolFacts.model_validate(
                {"harness_version": ref.harness_version, "harness_git_revision": ref.harness_git_revision}
            ).as_written(),
            "started_utc": ref.started_at,
            "ended_utc": ref.ended_at,
            "attempt": attempt,
            SOURCE_FIELD: cell.relative,
            "reference_repeat": ref.cell.repeat,
        }
    )


def _seconds(values: Iterable[float | None]) -> list[float]:
    return [v / 1000.0 for v in values if v is not None]


def _mapped_distribution(ref: RefDistribution) -> Distribution:
    """A reference distribution (milliseconds; mean and linearly interpolated p50/p95/p99, as ours) in
    seconds. It has no p90: null."""

    def s(value: float | None) -> float | None:
        return None if value is None else value / 1000.0

    return Distribution(
        mean=s(ref.mean), p50=s(ref.p50), p90=None, p95=s(ref.p95), p99=s(ref.p99), n=ref.count
    )


def _request_frame(requests: list[RefRequest]) -> pl.DataFrame:
    """The successful requests as the columns tasks.metrics.summary reads: chunk offsets from the send
    (the first token-bearing chunk at TTFT, then each stream event gap), in seconds."""
    rows = []
    for r in requests:
        if not r.success:
            continue
        offsets = None
        if r.ttft_ms is not None:
            offsets, t = [r.ttft_ms / 1000.0], r.ttft_ms / 1000.0
            for gap in r.stream_event_gaps_ms:
                t += gap / 1000.0
                offsets.append(t)
        rows.append(
            {
                "completion_tokens": r.completion_tokens,
                "prompt_tokens": r.prompt_tokens,
                "ttft_s": None if r.ttft_ms is None else r.ttft_ms / 1000.0,
                "tpot_s": None if r.tpot_ms is None else r.tpot_ms / 1000.0,
                "e2e_s": r.e2e_ms / 1000.0,
                "chunk_offsets_s": offsets,
                "chunks": 0 if offsets is None else len(offsets),
            }
        )
    return pl.DataFrame(
        rows,
        schema={
            "completion_tokens": pl.Int64,
            "prompt_tokens": pl.Int64,
            "ttft_s": pl.Float64,
            "tpot_s": pl.Float64,
            "e2e_s": pl.Float64,
            "chunk_offsets_s": pl.List(pl.Float64),
            "chunks": pl.Int32,
        },
    )


def _cell_summary(cell: _ReferenceCell) -> CellSummary:
    """Our summary of a reference cell: speculation from the snapshots (our code), latency from
    requests.jsonl (our code) or else summary.json (mapped), wall time from summary.json."""
    ref, meta = cell.summary, cell.metadata
    wall = ref.wall_seconds
    if cell.requests is not None:
        ok = _request_frame(cell.requests)
        total, n_ok = len(cell.requests), ok.height
        completion = int(ok["completion_tokens"].fill_null(0).sum())
        prompt = int(ok["prompt_tokens"].fill_null(0).sum())
        client_tokens_all = sum(r.completion_tokens or 0 for r in cell.requests)
        failures = total - n_ok
        chunks = int(ok["chunks"].sum())
        tokens_per_chunk = completion / chunks if chunks else None
        latency = Latency(
            ttft=Distribution(**distribution(ok["ttft_s"].drop_nulls().to_numpy())),
            tpot=Distribution(
                **distribution(ok.filter(pl.col("completion_tokens") >= 2)["tpot_s"].drop_nulls().to_numpy())
            ),
            e2e=Distribution(**distribution(ok["e2e_s"].to_numpy())),
            chunk_gap=Distribution(**distribution(chunk_gaps(ok))),
            itl_per_token=None,  # needs each chunk's token count, which the reference did not record
        )
        burst = burst_check(ok)
    else:
        total, n_ok, failures = ref.requests.attempted, ref.requests.successful, ref.requests.failed
        completion, prompt = ref.tokens.completion, ref.tokens.prompt
        client_tokens_all = completion  # the reference counts successful requests' tokens only
        tokens_per_chunk = None
        lat = ref.latency_ms
        latency = Latency(
            ttft=_mapped_distribution(lat.ttft),
            tpot=_mapped_distribution(lat.tpot),
            e2e=_mapped_distribution(lat.e2e),
            chunk_gap=_mapped_distribution(lat.stream_event_gap),  # gaps between token-bearing events
            itl_per_token=None,
        )
        burst = None

    spec, generation_delta, server_problem = None, None, None
    if cell.before is not None and cell.after is not None:
        before, after = cell.before[1], cell.after[1]
        try:
            if meta.variant.method != "none":
                spec = spec_decode_delta(before, after, meta.model)
            if before.has(GENERATION_TOKENS, meta.model) and after.has(GENERATION_TOKENS, meta.model):
                generation_delta = round(counter_delta(before, after, GENERATION_TOKENS, meta.model))
        except CounterReset as exc:
            server_problem = str(exc)
            spec = None
    # T, as in summarize_cell: the server's generated tokens over the window when known, else the client's.
    tokens = generation_delta if generation_delta is not None else client_tokens_all
    tpot_mean = latency.tpot.mean if latency.tpot else None
    speculation = speculation_block(
        spec, tokens, "server" if generation_delta is not None else "client", tpot_mean
    )
    rel = None
    if generation_delta:
        rel = (client_tokens_all - generation_delta) / generation_delta
    status, error = cell_status(total, server_problem)
    return CellSummary(
        status=status,
        error=error,
        # The reference records error text, not our error classes: failures count as `unknown`.
        requests=request_counts(total, n_ok, failures, {"unknown": failures} if failures else {}),
        wall_s=wall,
        output_throughput_tok_s=completion / wall,
        request_throughput_rps=n_ok / wall,
        completion_tokens=completion,
        prompt_tokens=prompt,
        latency_s=latency,
        tokens_per_chunk_mean=tokens_per_chunk,
        tokens_exact=False,  # no per-chunk token ids in the reference's records
        speculation=speculation,
        cross_checks=CrossChecks(
            tokens_per_chunk_vs_acceptance_length=tokens_per_chunk_check(tokens_per_chunk, spec, tokens),
            completion_tokens_vs_generation_tokens=GenerationTokensCheck(
                client=client_tokens_all,
                server=generation_delta,
                rel_diff=rel,
                ok=None if rel is None else abs(rel) <= GENERATION_TOKENS_TOLERANCE,
                tolerance=GENERATION_TOKENS_TOLERANCE,
            ),
            streamed_token_by_token=burst,
        ),
        server_valid=None if cell.before is None else server_problem is None,
        server_problem=server_problem,
    )


# ---------------------------------------------------------------------------------------------- writing


def _existing_sources(cells_dir: Path) -> dict[str, str]:
    """{reference folder: attempt directory name} of the attempts earlier imports wrote."""
    out: dict[str, str] = {}
    for attempt in layout.subdirs(cells_dir):
        try:
            meta = read_document(attempt / layout.META, CellMeta)
        except (OSError, ValueError):
            continue  # not ours to judge here: the ingest reports a broken attempt
        source = (meta.model_extra or {}).get(SOURCE_FIELD)
        if isinstance(source, str):
            out[source] = attempt.name
    return out


def _write_cell(final: Path, meta: CellMeta, summary: CellSummary, cell: _ReferenceCell) -> None:
    with atomic_dir(final) as tmp:
        write_json(tmp / layout.META, meta)
        write_json(tmp / layout.SUMMARY, summary)
        if cell.before is not None and cell.after is not None:
            (tmp / layout.METRICS_BEFORE).write_bytes(cell.before[0])  # the reference's bytes, as scraped
            (tmp / layout.METRICS_AFTER).write_bytes(cell.after[0])
        # Present and empty: no request rows on our clock and no gauge samples can be translated.
        pl.DataFrame(schema=REQUEST_SCHEMA).write_parquet(tmp / layout.REQUESTS)
        pl.DataFrame(schema=GAUGE_SCHEMA).write_parquet(tmp / layout.GAUGES)


def _campaign_record(campaign_id: str, results_dir: Path, cells: list[_ReferenceCell]) -> CampaignRecord:
    return CampaignRecord(
        campaign_id=campaign_id,
        name=campaign_id,
        spec=SpecFacts(name=campaign_id),
        created_utc=min(c.metadata.started_at for c in cells),  # when the study's first cell ran
        tool=ToolFacts.model_validate(tool_facts()),
        imported=ImportFacts(
            source=SOURCE,
            path=str(results_dir),
            importer=IMPORTER,
            importer_version=IMPORTER_VERSION,
            imported_utc=datetime.now(UTC).isoformat(),
        ),
    )


def _ensure_campaign(directory: Path, record: CampaignRecord) -> None:
    path = layout.campaign_file(directory)
    if not path.exists():
        write_json_atomic(path, record)
        return
    try:
        existing = read_document(path, CampaignRecord)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: cannot read the existing campaign record: {exc}") from None
    if existing.imported is None:
        raise ArtifactError(
            f"{path}: campaign {record.campaign_id!r} exists and was not imported; choose another --campaign"
        )


def campaign_id_for(results_dir: Path, campaign: str | None) -> str:
    """`seed-<name>`: name from --campaign, else the results folder's name."""
    name = campaign or Path(results_dir).resolve().name
    problem = safe_name_problem(name, "campaign name")
    if problem or "." in name:  # '.' separates the parts of deployment ids (artifacts.ids)
        raise InputError(
            f"campaign name {name[:60]!r}: use letters, digits, '-' and '_', starting with a letter or digit "
            "(no '.' or '/'; at most 48 characters); choose one with --campaign"
        )
    return name if name.startswith(CAMPAIGN_PREFIX) else f"{CAMPAIGN_PREFIX}{name}"


# ------------------------------------------------------------------------------------------ entry point


def read_reference(result: ReferenceTranslation) -> list[_ReferenceCell]:
    """The cells under the folder `result.results_dir` that can be imported; what cannot goes to
    `result.skipped`. Raises InputError when a name from the data cannot be a folder name (before anything
    is written)."""
    cell_dirs, loose = _walk(result.results_dir)
    result.skipped += [_classify_loose(path) for path in loose]
    return [c for d in cell_dirs if (c := _read_cell(d, result.results_dir, result.skipped)) is not None]


def write_reference(result: ReferenceTranslation, cells: list[_ReferenceCell]) -> None:
    """The raw documents of `cells` not written yet, into `result.campaign_dir` (the caller holds the
    campaign's writer lock: artifacts.store.campaign_writer)."""
    _write_campaign(result, result.campaign_dir, result.campaign_id, result.results_dir, cells)


def _write_campaign(
    result: ReferenceTranslation,
    directory: Path,
    campaign_id: str,
    results_dir: Path,
    cells: list[_ReferenceCell],
) -> None:
    """The raw documents of the imported cells not written yet (the caller holds the campaign's lock)."""
    _ensure_campaign(directory, _campaign_record(campaign_id, results_dir.resolve(), cells))
    cells_dir = layout.cells_dir(directory)
    existing = _existing_sources(cells_dir)
    failed: dict[str, str] = {}
    for deployment in _deployments(cells):
        deployment_id = ids.launch_id(ids.slot_id(campaign_id, deployment.variant, deployment.repeat), 1)
        facts = _deployment_facts(deployment, deployment_id)
        deployment_dir = layout.deployment_dir(directory, deployment_id)
        if not deployment_dir.exists():
            with atomic_dir(deployment_dir) as tmp:
                write_json(tmp / layout.DEPLOYMENT_FILE, facts)
            result.deployments.append(deployment_id)
        for cell in deployment.cells:
            if cell.relative in existing:
                result.already.append(existing[cell.relative])
                continue
            workload, concurrency = cell.metadata.cell.workload, cell.metadata.cell.concurrency
            cell_id = ids.cell_id(deployment.variant, deployment.repeat, workload, f"c{concurrency}")
            # A second cell of one key: its next attempt.
            final, attempt = layout.next_cell_attempt(cells_dir, cell_id)
            summary = _cell_summary(cell)
            meta = _cell_meta(cell, cell_id, attempt, campaign_id, deployment.repeat, facts)
            _write_cell(final, meta, summary, cell)
            result.written.append(final.name)
            if summary.status != "ok":
                failed[cell_id] = summary.status

    if result.written:
        _record_run(directory, campaign_id, failed)


def _record_run(directory: Path, campaign_id: str, failed: dict[str, str]) -> None:
    """The import as one finished run of the campaign (so its status derives as for ours)."""
    now = datetime.now(UTC).isoformat()
    stem = f"{utc_stamp()}-{os.getpid()}"
    number = 1
    while (path := layout.run_file(directory, f"{stem}-{number:02d}")).exists():
        number += 1
    record = RunRecord.model_validate(
        {
            "campaign_id": campaign_id,
            "started_utc": now,
            "ended_utc": now,
            "failed_cells": failed,
            "tool": tool_facts(),
            "host": host_facts(),
            "importer": IMPORTER,
        }
    )
    write_json_atomic(path, record)


__all__ = ["ReferenceTranslation", "Skipped", "campaign_id_for", "read_reference", "write_reference"]
