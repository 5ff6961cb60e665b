"""Raw artifacts (docs/design.md) into typed polars frames, one dict of frames per artifact.

Pure functions of the artifact's file bytes: no database here. Problems raise ArtifactInvalid naming the file
and the JSON field or column; value checks are the pandera models' job (warehouse.models).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tasks.load.records import REQUEST_SCHEMA
from warehouse.errors import ArtifactInvalid
from warehouse.models import MODELS

LATENCY_METRICS = ("ttft", "tpot", "e2e", "chunk_gap", "itl_per_token")
LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99")
CELL_DIR = re.compile(r"^(?P<cell_id>.+)\.a(?P<attempt>\d+)$")
# <campaign_id>.<variant>.r<repeat> or .ctl<n> (a control launch), then .l<n> (the n-th launch of that slot)
DEPLOYMENT_TAIL = re.compile(r"(?:\.r(?P<repeat>\d+))?(?:\.ctl(?P<control>\d+))?(?:\.l(?P<launch>\d+))?$")
# Engine arguments that differ between deployments of one configuration, or that define the variant:
# left out of engine_settings, which must match for a speculative cell to be compared with a plain one.
_PER_DEPLOYMENT_FLAGS = ("--host", "--port", "--served-model-name", "--speculative-config", "--api-key")
_SECRET_FLAGS = ("--api-key",)

Files = Mapping[str, bytes]


# --------------------------------------------------------------------------------------------- file helpers


def read_files(directory: Path, names: Sequence[str] | None = None) -> dict[str, bytes]:
    """The artifact's files by name (relative to `directory`): `names` (those present), or every regular,
    non-hidden file directly in it."""
    directory = Path(directory)
    if names is None:
        names = sorted(p.name for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    out: dict[str, bytes] = {}
    for name in names:
        path = directory / name
        if not path.is_file():
            continue
        try:
            out[name] = path.read_bytes()
        except OSError as exc:
            raise ArtifactInvalid(f"cannot read: {exc.strerror or exc}", file=name) from None
    return out


def artifact_sha256(files: Files) -> str:
    """Hash of an artifact: its file names and contents, in name order."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def load_json(files: Files, name: str) -> dict[str, Any]:
    if name not in files:
        raise ArtifactInvalid("file missing", file=name)
    try:
        data = json.loads(files[name])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise ArtifactInvalid(f"not valid JSON{where}: {exc}", file=name) from None
    if not isinstance(data, dict):
        raise ArtifactInvalid(f"expected a JSON object, got {type(data).__name__}", file=name)
    return data


def load_parquet(files: Files, name: str, required: Sequence[str]) -> pl.DataFrame:
    if name not in files:
        raise ArtifactInvalid("file missing", file=name)
    try:
        frame = pl.read_parquet(io.BytesIO(files[name]))
    except Exception as exc:  # polars raises several kinds for a corrupt file
        raise ArtifactInvalid(f"not a readable parquet file: {exc}", file=name) from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ArtifactInvalid(f"missing column(s): {', '.join(missing)}", file=name, column=missing[0])
    return frame


class Doc:
    """A JSON document with field access that says which file and field is wrong."""

    def __init__(self, data: Mapping[str, Any] | None, file: str, prefix: str = "") -> None:
        self.data, self.file, self.prefix = data or {}, file, prefix

    def field(self, path: str) -> str:
        return f"{self.prefix}{path}"

    def get(self, path: str, default: Any = None, *, required: bool = False) -> Any:
        node: Any = self.data
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node or node[part] is None:
                if required:
                    raise ArtifactInvalid("required field missing", file=self.file, column=self.field(path))
                return default
            node = node[part]
        return node

    def sub(self, path: str) -> Doc:
        value = self.get(path)
        if value is not None and not isinstance(value, Mapping):
            raise ArtifactInvalid("expected an object", file=self.file, column=self.field(path))
        return Doc(value, self.file, self.field(path) + ".")

    def number(self, path: str, *, required: bool = False, integer: bool = False) -> float | int | None:
        value = self.get(path, required=required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ArtifactInvalid(
                f"expected a number, got {value!r}", file=self.file, column=self.field(path)
            )
        if integer:
            if float(value) != int(value):
                raise ArtifactInvalid(
                    f"expected a whole number, got {value!r}", file=self.file, column=self.field(path)
                )
            return int(value)
        return float(value)

    def text(self, path: str, *, required: bool = False) -> str | None:
        value = self.get(path, required=required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ArtifactInvalid(
                f"expected a string, got {value!r}", file=self.file, column=self.field(path)
            )
        return value

    def flag(self, path: str) -> bool | None:
        value = self.get(path)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise ArtifactInvalid(
                f"expected true/false, got {value!r}", file=self.file, column=self.field(path)
            )
        return value

    def time(self, path: str, *, required: bool = False) -> datetime | None:
        """An ISO-8601 time ('...Z' or with an offset) as naive UTC."""
        value = self.text(path, required=required)
        if value is None:
            return None
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ArtifactInvalid(
                f"not an ISO-8601 time: {value!r}", file=self.file, column=self.field(path)
            ) from None
        if parsed.tzinfo is not None:
            parsed = parsed.astimezone(UTC).replace(tzinfo=None)
        return parsed

    def json(self, path: str) -> str | None:
        value = self.get(path)
        return None if value is None else canonical_json(value)


Rows = list[dict[str, Any]]
Part = (
    pl.DataFrame | Rows
)  # what an artifact contributes to a table: a frame, or rows made into one per batch


def to_frame(table: str, part: Part) -> pl.DataFrame:
    if isinstance(part, pl.DataFrame):
        return part
    if isinstance(part, ParquetPart):
        return part.read(table)
    return pl.DataFrame(part, schema=table_schema(table), orient="row")


def conform(frame: pl.DataFrame, table: str, file: str) -> pl.DataFrame:
    """The table's columns, in its order and of its types. A value that does not convert (text in a number
    column, say) is an ArtifactInvalid naming the column and the first rows concerned."""
    schema = table_schema(table)
    have = dict(zip(frame.columns, frame.dtypes, strict=True))  # cheaper than frame.schema
    if list(have) == list(schema) and all(have[n] == d for n, d in schema.items()):
        return frame
    casts = []
    for name, dtype in schema.items():
        if have[name] == dtype:
            casts.append(pl.col(name))
            continue
        try:
            frame.select(pl.col(name).cast(dtype, strict=True))
        except (pl.exceptions.PolarsError, TypeError, ValueError):
            lost = frame.with_row_index("_row").filter(
                pl.col(name).is_not_null() & pl.col(name).cast(dtype, strict=False).is_null()
            )
            rows = lost.get_column("_row").head(5).to_list()
            raise ArtifactInvalid(
                f"{have[name]} values do not convert to {dtype}", file=file, column=name, rows=rows
            ) from None
        casts.append(pl.col(name).cast(dtype, strict=True))
    return frame.select(casts)


_SCHEMAS: dict[str, dict[str, pl.DataType]] = {}


def table_schema(table: str) -> dict[str, pl.DataType]:
    """Polars column types of a table, from its pandera model (latency columns expanded)."""
    if table not in _SCHEMAS:
        schema: dict[str, pl.DataType] = {}
        for name, column in MODELS[table].to_schema().columns.items():
            dtype = column.dtype.type
            if name.startswith("^(ttft"):
                stats = ("n",) if name.endswith("_n$") else LATENCY_STATS
                for metric in LATENCY_METRICS:
                    for stat in stats:
                        schema[f"{metric}_{stat}" if stat == "n" else f"{metric}_{stat}_s"] = dtype
                continue
            schema[name] = dtype
        if table == "cells":  # keep the latency block where the table has it
            ordered = {k: v for k, v in schema.items() if not k.startswith(LATENCY_METRICS)}
            schema = ordered | {k: v for k, v in schema.items() if k.startswith(LATENCY_METRICS)}
        _SCHEMAS[table] = schema
    return _SCHEMAS[table]


@dataclass(frozen=True)
class ParquetPart:
    """An artifact's parquet file, left on disk so that a batch reads all its files of one table at once
    (polars reads many small files in one call for a fraction of the per-file cost)."""

    path: Path
    file: str  # its name within the artifact
    key_column: str
    key: str
    columns: tuple[tuple[str, str], ...]  # (column in the file, column in the table), after the key
    size: int = 0  # bytes: sizes batches (about 250 bytes a request row)

    def read(self, table: str) -> pl.DataFrame:
        """This file alone; problems are ArtifactInvalid naming the file and column."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise ArtifactInvalid(f"cannot read: {exc.strerror or exc}", file=self.file) from None
        frame = load_parquet({self.file: data}, self.file, [c for c, _ in self.columns])
        frame = frame.select(
            pl.lit(self.key, pl.String).alias(self.key_column), *[pl.col(c).alias(t) for c, t in self.columns]
        )
        return conform(frame, table, self.file)


@dataclass
class ReadParts:
    """What `read_parquet_parts` read: each part's rows (or its problem) and, when every file was read in one
    call, the whole frame those rows are consecutive slices of (one chunk per column), so that a batch
    needs no concatenation or copy before validating and writing it."""

    results: list[pl.DataFrame | ArtifactInvalid]
    whole: pl.DataFrame | None = None


def read_parquet_parts(table: str, parts: Sequence[ParquetPart]) -> ReadParts:
    """Each part's rows (or its problem), reading all the files in one polars call when they agree; when
    they do not (a missing column, a corrupt file, a bad value), file by file to find which one is wrong."""
    if len(parts) > 1 and len({p.columns for p in parts}) == 1 and len({p.path for p in parts}) == len(parts):
        try:
            return _read_together(table, parts)
        except (pl.exceptions.PolarsError, OSError, ArtifactInvalid, ValueError):
            pass
    out: list[pl.DataFrame | ArtifactInvalid] = []
    for part in parts:
        try:
            out.append(part.read(table))
        except ArtifactInvalid as exc:
            out.append(exc)
    return ReadParts(out)


def _read_together(table: str, parts: Sequence[ParquetPart]) -> ReadParts:
    first = parts[0]
    paths = [str(p.path) for p in parts]
    # The first file's schema for all (a file that differs raises, and is then found file by file): polars
    # then skips inferring each file's schema, about a sixth of the read.
    schema = pl.read_parquet_schema(paths[0])
    combined = (
        pl.scan_parquet(paths, schema=schema, include_file_paths="_path")
        .select(*[c for c, _ in first.columns], "_path")
        .collect()
    )
    runs = combined.get_column("_path").rle()
    files = runs.struct.field("value").to_list()
    counts = runs.struct.field("len").to_list()
    present = set(files)
    if files != [p for p in paths if p in present]:
        raise ValueError("rows did not come back in file order")
    # The key column by file index, not by mapping every row's path: no hashing of a million strings.
    key_of = {str(p.path): p.key for p in parts}
    keys = pl.Series(first.key_column, [key_of[f] for f in files], dtype=pl.String)
    combined = combined.select(
        keys.gather(np.repeat(np.arange(len(files)), counts)),
        *[pl.col(c).alias(t) for c, t in first.columns],
    )
    combined = conform(combined, table, first.file).rechunk()
    rows_of = dict(zip(files, counts, strict=True))
    out: list[pl.DataFrame | ArtifactInvalid] = []
    offset = 0
    for path in paths:
        n = rows_of.get(path, 0)
        out.append(combined.slice(offset, n))
        offset += n
    return ReadParts(out, combined)


# ------------------------------------------------------------------------------------------- engine facts


def engine_settings(
    command: Sequence[str] | None,
    launcher: str | None,
    extra: Mapping[str, Any] | None,
    variant_extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """What must be equal for two deployments to be 'launched the same way': the engine arguments minus
    what differs per deployment (host, port, served name) or defines the variant (speculative config,
    the variant's own extra args), plus the launcher kind and its KV-cache size."""
    args = list(command or [])
    start = next((i for i, a in enumerate(args) if a.startswith("--")), len(args))
    args = args[start:]
    if variant_extra_args and args[-len(variant_extra_args) :] == list(variant_extra_args):
        args = args[: -len(variant_extra_args)]
    kept: list[str] = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in _PER_DEPLOYMENT_FLAGS:
            skip_next = "=" not in arg
            continue
        kept.append(arg)
    return {
        "args": kept,
        "launcher": launcher,
        "kv_cache_gib": (extra or {}).get("kv_cache_gib"),
    }


def mask_secrets(command: Sequence[str] | None) -> list[str] | None:
    if command is None:
        return None
    out, hide = [], False
    for arg in command:
        flag = arg.split("=", 1)[0]
        if hide:
            out.append("***")
            hide = False
        elif flag in _SECRET_FLAGS:
            out.append(f"{flag}=***" if "=" in arg else arg)
            hide = "=" not in arg
        else:
            out.append(str(arg))
    return out


def load_label(mode: str | None, concurrency: int | None, rate: float | None) -> str:
    return f"c{concurrency}" if mode == "closed" else f"rate{rate:g}" if rate is not None else "rate?"


# ----------------------------------------------------------------------------------------------- campaigns


def campaign_frames(source_path: str, campaign_id: str, files: Files, sha256: str) -> dict[str, Part]:
    """campaign.json (written once) and its run records runs/*.json (one per finished run)."""
    name = "campaign.json"
    doc = Doc(load_json(files, name), name)
    declared = doc.text("campaign_id", required=True)
    if declared != campaign_id:
        raise ArtifactInvalid(
            f"campaign_id {declared!r} does not match its directory {campaign_id!r}",
            file=name,
            column="campaign_id",
        )
    spec = doc.sub("spec")
    order = doc.get("variant_order")
    if order is not None and not (
        isinstance(order, list)
        and all(isinstance(r, list) and all(isinstance(v, str) for v in r) for r in order)
    ):
        raise ArtifactInvalid(
            "expected a list (one per repeat) of lists of variant names", file=name, column="variant_order"
        )
    runs = sorted(
        (Doc(load_json(files, f), f) for f in files if f.startswith("runs/")),
        key=lambda run: (run.get("ended_utc") or "", run.file),
    )
    last = runs[-1] if runs else None
    failed = last.get("failed_cells") if last else None
    if failed is not None and not isinstance(failed, list | dict):
        raise ArtifactInvalid(
            "expected a list or an object of cell ids", file=last.file, column="failed_cells"
        )
    failed_cells = sorted(str(c) for c in failed) if failed is not None else None
    status = doc.text("status") or (
        "created" if last is None else "incomplete" if failed_cells else "complete"
    )
    row = {
        "campaign_id": campaign_id,
        "spec_name": doc.text("spec_name") or doc.text("name") or spec.text("name", required=True),
        "label": doc.text("label"),
        "spec_sha256": doc.text("spec_sha256"),
        "status": status,
        "created_utc": doc.time("created_utc", required=True),
        "runs": len(runs),
        "last_run_utc": last.time("ended_utc") if last else None,
        "failed_cells": failed_cells,
        "repeats": spec.number("repeats", integer=True),
        "variant_order": order,
        "slo_ttft_p99_s": spec.number("slo.ttft_p99_s"),
        "slo_tpot_p99_s": spec.number("slo.tpot_p99_s"),
        "spec": doc.json("spec") or _missing(name, "spec"),
        "specgauge_version": doc.text("tool.specgauge_version"),
        "git_revision": doc.text("tool.git_revision"),
        "hostname": doc.text("host.hostname"),
        "host": doc.json("host"),
        "source_path": source_path,
        "sha256": sha256,
    }
    return {"campaigns": [row]}


def _missing(file: str, field: str) -> Any:
    raise ArtifactInvalid("required field missing", file=file, column=field)


# --------------------------------------------------------------------------------------------- deployments


def deployment_frames(
    source_path: str, campaign_id: str, deployment_id: str, files: Files, sha256: str
) -> dict[str, Part]:
    name = "deployment.json"
    doc = Doc(load_json(files, name), name)
    declared = doc.text("id", required=True)
    if declared != deployment_id:
        raise ArtifactInvalid(
            f"id {declared!r} does not match its directory {deployment_id!r}", file=name, column="id"
        )
    variant = doc.sub("variant")
    tail = DEPLOYMENT_TAIL.search(deployment_id)
    command = doc.get("command")
    if command is not None and not (isinstance(command, list) and all(isinstance(a, str) for a in command)):
        raise ArtifactInvalid("expected a list of strings", file=name, column="command")
    settings = engine_settings(
        command, doc.text("launcher"), doc.get("extra"), variant.get("extra_args") or ()
    )
    row = {
        "deployment_id": deployment_id,
        "campaign_id": campaign_id,
        "variant": variant.text("name", required=True),
        "method": variant.text("method") or "none",
        "k": variant.number("k", integer=True),
        "variant_config": doc.json("variant"),
        "slot": deployment_id[: tail.start("launch") - 2] if tail and tail["launch"] else deployment_id,
        "repeat": int(tail["repeat"]) if tail and tail["repeat"] else None,
        "control": int(tail["control"]) if tail and tail["control"] else None,
        "launch": int(tail["launch"]) if tail and tail["launch"] else None,
        "launcher": doc.text("launcher", required=True),
        "served_model_name": doc.text("served_model_name"),
        "base_url": doc.text("base_url"),
        "engine_command": mask_secrets(command),
        "engine_settings": canonical_json(settings),
        "engine_key": short_hash(settings),
        "engine_version": doc.text("engine_version"),
        "kv_cache_tokens": doc.number("kv_cache_tokens", integer=True),
        "max_model_len": doc.number("max_model_len", integer=True),
        "status": doc.text("status", required=True),
        "started_utc": doc.time("started_at"),
        "ready_s": doc.number("ready_s"),
        "stopped_utc": doc.time("stopped_at"),
        "teardown": doc.text("teardown"),
        "job_id": None if doc.get("job_id") is None else str(doc.get("job_id")),
        "pid": doc.number("pid", integer=True),
        "extra": doc.json("extra"),
        "source_path": source_path,
        "sha256": sha256,
    }
    return {"deployments": [row]}


# --------------------------------------------------------------------------------------------------- cells


def parse_cell_dir(name: str) -> tuple[str, int] | None:
    match = CELL_DIR.match(name)
    return (match["cell_id"], int(match["attempt"])) if match else None


def cell_frames(
    source_path: str,
    campaign_id: str,
    dir_name: str,
    files: Files,
    sha256: str,
    directory: Path | None = None,
) -> dict[str, Part]:
    """A cell attempt's rows. With `directory`, its parquet files come back as ParquetParts (read later,
    together with the batch's); without, as frames read from `files`."""
    parsed = parse_cell_dir(dir_name)
    if parsed is None:
        raise ArtifactInvalid(f"{dir_name!r} is not a cell directory name (<cell_id>.a<attempt>)")
    cell_id, attempt = parsed
    cell_key = f"{campaign_id}/{dir_name}"
    meta = Doc(load_json(files, "meta.json"), "meta.json")
    summary = Doc(load_json(files, "summary.json"), "summary.json")
    for field, expected in (("cell_id", cell_id), ("attempt", attempt), ("campaign_id", campaign_id)):
        if meta.get(field, required=True) != expected:
            raise ArtifactInvalid(
                f"{meta.get(field)!r} does not match the directory ({expected!r})",
                file="meta.json",
                column=field,
            )
    status = summary.text("status", required=True)

    variant = meta.sub("variant")
    load = meta.sub("load")
    deployment = meta.sub("deployment")
    sampling = meta.get("sampling") or {}
    mode = load.text("mode", required=True)
    concurrency = load.number("concurrency", integer=True)
    rate = load.number("rate")
    settings = engine_settings(
        deployment.get("command"),
        deployment.text("launcher"),
        deployment.get("extra"),
        variant.get("extra_args") or (),
    )
    prompt_ids = meta.get("workload.prompt_ids")
    row: dict[str, Any] = {
        "cell_key": cell_key,
        "campaign_id": campaign_id,
        "cell_id": cell_id,
        "attempt": attempt,
        "deployment_id": meta.text("deployment_id", required=True),
        "variant": variant.text("name", required=True),
        "method": variant.text("method") or "none",
        "k": variant.number("k", integer=True),
        "variant_config": meta.json("variant"),
        "repeat": meta.number("repeat", required=True, integer=True),
        "workload": meta.text("workload.stratum", required=True),
        "workload_file": meta.text("workload.file"),
        "workload_sha256": meta.text("workload.sha256"),
        "prompt_ids": [str(p) for p in prompt_ids] if isinstance(prompt_ids, list) else None,
        "load_label": load_label(mode, concurrency, rate),
        "load_mode": mode,
        "concurrency": concurrency,
        "rate": rate,
        "arrival": load.text("arrival"),
        "requests_planned": load.number("requests", integer=True),
        "warmup": load.number("warmup", integer=True),
        "time_cap_s": load.number("time_cap_s"),
        "request_timeout_s": load.number("request_timeout_s"),
        "endpoint": meta.text("endpoint"),
        "sampling": canonical_json(sampling),
        "sampling_key": short_hash(sampling),
        "temperature": meta.number("sampling.temperature"),
        "max_tokens": meta.number("sampling.max_tokens", integer=True),
        "engine_settings": canonical_json(settings),
        "engine_key": short_hash(settings),
        "engine_version": deployment.text("engine_version"),
        "kv_cache_tokens": deployment.number("kv_cache_tokens", integer=True),
        "launcher": deployment.text("launcher"),
        "job_id": None if deployment.get("job_id") is None else str(deployment.get("job_id")),
        "specgauge_version": meta.text("tool.specgauge_version"),
        "git_revision": meta.text("tool.git_revision"),
        "hostname": meta.text("host.hostname"),
        "t0_utc": meta.time("t0_utc"),
        "started_utc": meta.time("started_utc"),
        "ended_utc": meta.time("ended_utc"),
        "capped": meta.flag("capped"),
        "status": status,
        "error": summary.text("error"),
        "requests_total": summary.number("requests.total", integer=True),
        "requests_ok": summary.number("requests.ok", integer=True),
        "requests_failed": summary.number("requests.failed", integer=True),
        "success_rate": summary.number("requests.success_rate"),
        "request_errors": summary.json("requests.errors"),
        "wall_s": summary.number("wall_s"),
        "output_throughput_tok_s": summary.number("output_throughput_tok_s"),
        "request_throughput_rps": summary.number("request_throughput_rps"),
        "completion_tokens": summary.number("completion_tokens", integer=True),
        "prompt_tokens": summary.number("prompt_tokens", integer=True),
        "tokens_per_chunk_mean": summary.number("tokens_per_chunk_mean"),
        "tokens_exact": summary.flag("tokens_exact"),
        "goodput_ttft_slo_s": summary.number("goodput.ttft_slo_s"),
        "goodput_tpot_slo_s": summary.number("goodput.tpot_slo_s"),
        "goodput_share": summary.number("goodput.share"),
        "goodput_rate_rps": summary.number("goodput.rate_rps"),
        "gauge_kv_cache_usage_max": summary.number("gauges.kv_cache_usage_max"),
        "gauge_kv_cache_usage_mean": summary.number("gauges.kv_cache_usage_mean"),
        "gauge_running_max": summary.number("gauges.running_max"),
        "gauge_waiting_max": summary.number("gauges.waiting_max"),
        "gauge_preemptions": summary.number("gauges.preemptions"),
        "gauge_samples": summary.number("gauges.samples", integer=True),
        "server_valid": summary.flag("server_valid"),
        "server_problem": summary.text("server_problem"),
        "source_path": source_path,
        "sha256": sha256,
    }
    for check, prefix in (
        ("tokens_per_chunk_vs_acceptance_length", "check_tokens_per_chunk"),
        ("completion_tokens_vs_generation_tokens", "check_completion_tokens"),
    ):
        block = summary.sub(f"cross_checks.{check}")
        row |= {
            f"{prefix}_client": block.number("client"),
            f"{prefix}_server": block.number("server"),
            f"{prefix}_rel_diff": block.number("rel_diff"),
            f"{prefix}_ok": block.flag("ok"),
        }
    for metric in LATENCY_METRICS:
        block = summary.sub(f"latency_s.{metric}")
        for stat in LATENCY_STATS:
            row[f"{metric}_{stat}_s"] = block.number(stat)
        row[f"{metric}_n"] = block.number("n", integer=True)

    frames: dict[str, Part] = {"cells": [row]}
    needs_tables = status == "ok"  # a failed cell may have stopped before writing them
    frames["requests"] = _table_part(
        files, directory, "requests.parquet", "requests", cell_key, _REQUEST_COLUMNS, needs_tables
    )
    frames["gauges"] = _table_part(
        files, directory, "gauges.parquet", "gauges", cell_key, _GAUGE_COLUMNS, needs_tables
    )
    frames |= _speculation(summary, cell_key)
    return frames


_REQUEST_COLUMNS = tuple(
    (c, "request_index" if c == "index" else c) for c in REQUEST_SCHEMA
)  # the file's `index` is the table's request_index
_GAUGE_COLUMNS = tuple((c, c) for c in ("t_s", "kv_cache_usage", "running", "waiting", "preemptions_total"))


def _table_part(
    files: Files, directory: Path | None, file: str, table: str, cell_key: str, columns: tuple, required: bool
) -> Part:
    """requests.parquet / gauges.parquet of a cell: a ParquetPart when the caller reads in batches (it
    gave the directory), else the frame, read from the bytes at hand."""
    if file not in files:
        if required:
            raise ArtifactInvalid("file missing", file=file)
        return pl.DataFrame(schema=table_schema(table))
    if directory is not None:
        return ParquetPart(Path(directory) / file, file, "cell_key", cell_key, columns, len(files[file]))
    frame = load_parquet(files, file, [c for c, _ in columns])
    frame = frame.select(
        pl.lit(cell_key, pl.String).alias("cell_key"), *[pl.col(c).alias(t) for c, t in columns]
    )
    return conform(frame, table, file)


def _speculation(summary: Doc, cell_key: str) -> dict[str, Part]:
    spec = summary.sub("speculation")
    if not spec.data:
        return {}
    row = {
        "cell_key": cell_key,
        "drafts": spec.number("drafts", integer=True),
        "draft_tokens": spec.number("draft_tokens", integer=True),
        "accepted_tokens": spec.number("accepted_tokens", integer=True),
        "acceptance_rate": spec.number("acceptance_rate"),
        "mean_acceptance_length": spec.number("mean_acceptance_length"),
        "decode_steps": spec.number("decode_steps", integer=True),
        "inferred_step_time_s": spec.number("inferred_step_time_s"),
    }
    per_position = spec.get("acceptance_rate_per_position") or {}
    if not isinstance(per_position, Mapping):
        raise ArtifactInvalid(
            "expected an object {position: rate}",
            file=summary.file,
            column=spec.field("acceptance_rate_per_position"),
        )
    positions = []
    for key in per_position:
        if not str(key).isdigit():
            raise ArtifactInvalid(
                f"position {key!r} is not a whole number",
                file=summary.file,
                column=spec.field("acceptance_rate_per_position"),
            )
        positions.append(
            {
                "cell_key": cell_key,
                "position": int(key),
                "acceptance_rate": spec.number(f"acceptance_rate_per_position.{key}"),
            }
        )
    return {
        "spec_decode": [row],
        "spec_decode_positions": sorted(positions, key=lambda p: p["position"]),
    }


# ------------------------------------------------------------------------------------------------ captures

_OUTPUT_COLUMNS = [
    "prompt_id",
    "workload",
    "ok",
    "error",
    "text",
    "token_ids",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
]


def capture_frames(
    source_path: str, campaign_id: str, capture_id: str, files: Files, sha256: str
) -> dict[str, Part]:
    meta = Doc(load_json(files, "meta.json"), "meta.json")
    if meta.get("capture_id", required=True) != capture_id:
        raise ArtifactInvalid(
            f"{meta.get('capture_id')!r} does not match its directory ({capture_id!r})",
            file="meta.json",
            column="capture_id",
        )
    declared_campaign = meta.text("campaign_id")
    if declared_campaign is not None and declared_campaign != campaign_id:
        raise ArtifactInvalid(
            f"{declared_campaign!r} does not match its campaign directory ({campaign_id!r})",
            file="meta.json",
            column="campaign_id",
        )
    capture_key = f"{campaign_id}/{capture_id}"
    outputs = load_parquet(files, "outputs.parquet", _OUTPUT_COLUMNS).select(
        pl.lit(capture_key, pl.String).alias("capture_key"), *[pl.col(c) for c in _OUTPUT_COLUMNS]
    )
    outputs = conform(outputs, "capture_outputs", "outputs.parquet")
    sampling = meta.get("sampling")
    prompt_ids = meta.get("prompt_ids")
    ok_col = outputs.get_column("ok")
    row = {
        "capture_key": capture_key,
        "capture_id": capture_id,
        "campaign_id": campaign_id,
        "deployment_id": meta.text("deployment_id"),
        "variant": meta.text("variant")
        if isinstance(meta.get("variant"), str)
        else meta.text("variant.name"),
        "corpus_file": meta.text("corpus.file")
        if isinstance(meta.get("corpus"), Mapping)
        else meta.text("corpus_file"),
        "corpus_sha256": (
            meta.text("corpus.sha256")
            if isinstance(meta.get("corpus"), Mapping)
            else meta.text("corpus_sha256")
        ),
        "prompt_ids": [str(p) for p in prompt_ids] if isinstance(prompt_ids, list) else None,
        "sampling": None if sampling is None else canonical_json(sampling),
        "sampling_key": None if sampling is None else short_hash(sampling),
        "engine_version": meta.text("deployment.engine_version"),
        "specgauge_version": meta.text("tool.specgauge_version"),
        "git_revision": meta.text("tool.git_revision"),
        "started_utc": meta.time("started_utc"),
        "ended_utc": meta.time("ended_utc"),
        "outputs": outputs.height,
        "outputs_ok": int(ok_col.cast(pl.Boolean, strict=False).fill_null(False).sum()),
        "source_path": source_path,
        "sha256": sha256,
    }
    return {"captures": [row], "capture_outputs": outputs}
