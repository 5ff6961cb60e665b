"""pandera models (polars backend): what every frame must satisfy before it is written to the warehouse.

One model per table. Frames are checked with `strict` (exactly these columns) and `coerce` (e.g. an int64
`index` in a parquet file becomes INTEGER). Frame-level checks name their column before a colon in their
error text, so a quarantine entry can say which column failed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Any, get_args

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from tasks.load.records import ErrorClass

ERROR_CLASSES = list(get_args(ErrorClass))
CELL_STATUSES = ["ok", "failed"]
# created: no run has finished yet (one is running, or crashed); complete: the latest run left no failed
# cell; incomplete: it did. An explicit `status` in campaign.json must be one of these too.
CAMPAIGN_STATUSES = ["created", "complete", "incomplete"]
LOAD_MODES = ["closed", "open"]
# experiments/spec.py SpecMethod (tests/test_spec.py checks that the two agree)
METHODS = ["none", "ngram", "draft_model", "eagle3", "suffix", "dspark", "dflash", "mtp"]


def _ok_implies(column: str) -> pl.Expr:
    return ~pl.col("ok") | pl.col(column).is_not_null()


class Strict:
    """Exactly the model's columns; values coerced to the model's types."""

    strict = True
    coerce = True


class Exact:
    """Exactly the model's columns, already of the model's types (warehouse.raw builds and casts them):
    pandera's coercion costs a polars collect per column per call, which dominates small batches."""

    strict = True
    coerce = False


class CampaignModel(pa.DataFrameModel):
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1}, unique=True)
    spec_name: pl.String = pa.Field(str_length={"min_value": 1})
    label: pl.String = pa.Field(nullable=True)
    spec_sha256: pl.String = pa.Field(nullable=True)
    status: pl.String = pa.Field(isin=CAMPAIGN_STATUSES)
    created_utc: pl.Datetime = pa.Field()
    runs: pl.Int32 = pa.Field(ge=0)
    last_run_utc: pl.Datetime = pa.Field(nullable=True)
    failed_cells: pl.List(pl.String) = pa.Field(nullable=True)
    repeats: pl.Int32 = pa.Field(nullable=True, gt=0)
    variant_order: pl.List(pl.List(pl.String)) = pa.Field(nullable=True)
    slo_ttft_p99_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    slo_tpot_p99_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    spec: pl.String = pa.Field()
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    hostname: pl.String = pa.Field(nullable=True)
    host: pl.String = pa.Field(nullable=True)
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

    Config = Exact


class DeploymentModel(pa.DataFrameModel):
    deployment_id: pl.String = pa.Field(str_length={"min_value": 1}, unique=True)
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
    variant: pl.String = pa.Field(str_length={"min_value": 1})
    method: pl.String = pa.Field(isin=METHODS)
    k: pl.Int32 = pa.Field(nullable=True, gt=0)
    variant_config: pl.String = pa.Field()
    slot: pl.String = pa.Field(str_length={"min_value": 1})
    repeat: pl.Int32 = pa.Field(nullable=True, ge=0)
    control: pl.Int32 = pa.Field(nullable=True, ge=1)
    launch: pl.Int32 = pa.Field(nullable=True, ge=1)
    launcher: pl.String = pa.Field(str_length={"min_value": 1})
    served_model_name: pl.String = pa.Field(nullable=True)
    base_url: pl.String = pa.Field(nullable=True)
    engine_command: pl.List(pl.String) = pa.Field(nullable=True)
    engine_settings: pl.String = pa.Field(nullable=True)
    engine_key: pl.String = pa.Field(nullable=True)
    engine_version: pl.String = pa.Field(nullable=True)
    kv_cache_tokens: pl.Int64 = pa.Field(nullable=True, gt=0)
    max_model_len: pl.Int32 = pa.Field(nullable=True, gt=0)
    status: pl.String = pa.Field(isin=["starting", "ready", "failed", "stopped"])
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ready_s: pl.Float64 = pa.Field(nullable=True, ge=0)
    stopped_utc: pl.Datetime = pa.Field(nullable=True)
    teardown: pl.String = pa.Field(nullable=True)
    job_id: pl.String = pa.Field(nullable=True)
    pid: pl.Int64 = pa.Field(nullable=True)
    extra: pl.String = pa.Field(nullable=True)
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

    Config = Exact


_NonNegative = {"nullable": True, "ge": 0}


class CellModel(pa.DataFrameModel):
    """One row per cell attempt: meta.json and summary.json flattened."""

    cell_key: pl.String = pa.Field(unique=True)
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
    cell_id: pl.String = pa.Field(str_length={"min_value": 1})
    attempt: pl.Int32 = pa.Field(ge=1)
    deployment_id: pl.String = pa.Field(str_length={"min_value": 1})
    variant: pl.String = pa.Field(str_length={"min_value": 1})
    method: pl.String = pa.Field(isin=METHODS)
    k: pl.Int32 = pa.Field(nullable=True, gt=0)
    variant_config: pl.String = pa.Field(nullable=True)
    repeat: pl.Int32 = pa.Field(ge=0)
    workload: pl.String = pa.Field(str_length={"min_value": 1})
    workload_file: pl.String = pa.Field(nullable=True)
    workload_sha256: pl.String = pa.Field(nullable=True)
    prompt_ids: pl.List(pl.String) = pa.Field(nullable=True)
    load_label: pl.String = pa.Field(str_length={"min_value": 1})
    load_mode: pl.String = pa.Field(isin=LOAD_MODES)
    concurrency: pl.Int32 = pa.Field(nullable=True, gt=0)
    rate: pl.Float64 = pa.Field(nullable=True, gt=0)
    arrival: pl.String = pa.Field(nullable=True)
    requests_planned: pl.Int32 = pa.Field(nullable=True, ge=0)
    warmup: pl.Int32 = pa.Field(nullable=True, ge=0)
    time_cap_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    request_timeout_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    endpoint: pl.String = pa.Field(nullable=True, isin=["chat", "completions"])
    sampling: pl.String = pa.Field(nullable=True)
    sampling_key: pl.String = pa.Field()
    temperature: pl.Float64 = pa.Field(nullable=True, ge=0)
    max_tokens: pl.Int32 = pa.Field(nullable=True, gt=0)
    engine_settings: pl.String = pa.Field(nullable=True)
    engine_key: pl.String = pa.Field()
    engine_version: pl.String = pa.Field(nullable=True)
    kv_cache_tokens: pl.Int64 = pa.Field(nullable=True, gt=0)
    launcher: pl.String = pa.Field(nullable=True)
    job_id: pl.String = pa.Field(nullable=True)
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    hostname: pl.String = pa.Field(nullable=True)
    t0_utc: pl.Datetime = pa.Field(nullable=True)
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ended_utc: pl.Datetime = pa.Field(nullable=True)
    capped: pl.Boolean = pa.Field(nullable=True)
    status: pl.String = pa.Field(isin=CELL_STATUSES)
    error: pl.String = pa.Field(nullable=True)
    requests_total: pl.Int32 = pa.Field(**_NonNegative)
    requests_ok: pl.Int32 = pa.Field(**_NonNegative)
    requests_failed: pl.Int32 = pa.Field(**_NonNegative)
    success_rate: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    request_errors: pl.String = pa.Field(nullable=True)
    wall_s: pl.Float64 = pa.Field(**_NonNegative)
    output_throughput_tok_s: pl.Float64 = pa.Field(**_NonNegative)
    request_throughput_rps: pl.Float64 = pa.Field(**_NonNegative)
    completion_tokens: pl.Int64 = pa.Field(**_NonNegative)
    prompt_tokens: pl.Int64 = pa.Field(**_NonNegative)
    # latency_s.<metric>.{mean,p50,p90,p95,p99,n} for ttft, tpot, e2e, chunk_gap, itl_per_token
    latency: pl.Float64 = pa.Field(
        alias=r"^(ttft|tpot|e2e|chunk_gap|itl_per_token)_(mean|p50|p90|p95|p99)_s$",
        regex=True,
        **_NonNegative,
    )
    latency_n: pl.Int32 = pa.Field(
        alias=r"^(ttft|tpot|e2e|chunk_gap|itl_per_token)_n$", regex=True, **_NonNegative
    )
    tokens_per_chunk_mean: pl.Float64 = pa.Field(**_NonNegative)
    tokens_exact: pl.Boolean = pa.Field(nullable=True)
    goodput_ttft_slo_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    goodput_tpot_slo_s: pl.Float64 = pa.Field(nullable=True, gt=0)
    goodput_share: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    goodput_rate_rps: pl.Float64 = pa.Field(**_NonNegative)
    check_tokens_per_chunk_client: pl.Float64 = pa.Field(nullable=True)
    check_tokens_per_chunk_server: pl.Float64 = pa.Field(nullable=True)
    check_tokens_per_chunk_rel_diff: pl.Float64 = pa.Field(nullable=True)
    check_tokens_per_chunk_ok: pl.Boolean = pa.Field(nullable=True)
    check_completion_tokens_client: pl.Float64 = pa.Field(nullable=True)
    check_completion_tokens_server: pl.Float64 = pa.Field(nullable=True)
    check_completion_tokens_rel_diff: pl.Float64 = pa.Field(nullable=True)
    check_completion_tokens_ok: pl.Boolean = pa.Field(nullable=True)
    gauge_kv_cache_usage_max: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    gauge_kv_cache_usage_mean: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    gauge_running_max: pl.Float64 = pa.Field(**_NonNegative)
    gauge_waiting_max: pl.Float64 = pa.Field(**_NonNegative)
    gauge_preemptions: pl.Float64 = pa.Field(**_NonNegative)
    gauge_samples: pl.Int32 = pa.Field(**_NonNegative)
    server_valid: pl.Boolean = pa.Field(nullable=True)
    server_problem: pl.String = pa.Field(nullable=True)
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

    @pa.dataframe_check(error="load_mode: a closed-loop cell needs concurrency, an open-loop cell a rate")
    def load_has_its_parameter(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.when(pl.col("load_mode") == "closed")
            .then(pl.col("concurrency").is_not_null())
            .otherwise(pl.col("rate").is_not_null())
        )

    @pa.dataframe_check(error="requests_total: must equal requests_ok + requests_failed")
    def request_counts_add_up(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("requests_total").is_null()
            | (pl.col("requests_total") == pl.col("requests_ok") + pl.col("requests_failed"))
        )

    @pa.dataframe_check(error="wall_s: an ok cell needs wall_s and its request counts")
    def ok_cell_has_figures(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            (pl.col("status") != "ok")
            | (pl.col("wall_s").is_not_null() & pl.col("requests_total").is_not_null())
        )

    @pa.dataframe_check(error="method: a speculative variant needs k, plain must not have one")
    def method_and_k(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select((pl.col("method") == "none") == pl.col("k").is_null())

    Config = Exact


class RequestModel(pa.DataFrameModel):
    """requests.parquet (tasks.load.records.REQUEST_SCHEMA), `index` renamed request_index."""

    cell_key: pl.String = pa.Field()
    request_index: pl.Int32 = pa.Field(ge=0)
    prompt_id: pl.String = pa.Field()
    workload: pl.String = pa.Field()
    phase: pl.String = pa.Field(isin=["warmup", "measured"])
    endpoint: pl.String = pa.Field(isin=["chat", "completions"])
    queued_s: pl.Float64 = pa.Field(ge=0)
    scheduled_s: pl.Float64 = pa.Field(**_NonNegative)
    sent_s: pl.Float64 = pa.Field(**_NonNegative)
    first_token_s: pl.Float64 = pa.Field(**_NonNegative)
    last_token_s: pl.Float64 = pa.Field(**_NonNegative)
    ended_s: pl.Float64 = pa.Field(**_NonNegative)
    client_queue_s: pl.Float64 = pa.Field(**_NonNegative)
    ttft_s: pl.Float64 = pa.Field(**_NonNegative)
    e2e_s: pl.Float64 = pa.Field(**_NonNegative)
    tpot_s: pl.Float64 = pa.Field(**_NonNegative)
    prompt_tokens: pl.Int64 = pa.Field(**_NonNegative)
    completion_tokens: pl.Int64 = pa.Field(**_NonNegative)
    chunks: pl.Int32 = pa.Field(ge=0)
    chunk_offsets_s: pl.List(pl.Float64) = pa.Field(nullable=True)
    chunk_tokens: pl.List(pl.Int32) = pa.Field(nullable=True)
    tokens_exact: pl.Boolean = pa.Field(nullable=True)
    finish_reason: pl.String = pa.Field(nullable=True)
    http_status: pl.Int32 = pa.Field(nullable=True, ge=100, le=599)
    ok: pl.Boolean = pa.Field()
    error_class: pl.String = pa.Field(nullable=True, isin=ERROR_CLASSES)
    error: pl.String = pa.Field(nullable=True)
    token_ids: pl.List(pl.Int64) = pa.Field(nullable=True)
    text: pl.String = pa.Field(nullable=True)

    @pa.dataframe_check(error="request_index: each request index appears once per cell")
    def unique_index(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("cell_key", "request_index").is_duplicated())

    @pa.dataframe_check(error="completion_tokens: an ok request needs completion_tokens (from usage)")
    def ok_have_usage(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(_ok_implies("completion_tokens"))

    @pa.dataframe_check(error="ttft_s: must not exceed e2e_s")
    def ttft_within_e2e(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            (pl.col("ttft_s") <= pl.col("e2e_s") + 1e-9).fill_null(True)  # null: not both measured
        )

    @pa.dataframe_check(error="chunk_offsets_s: one offset per token-bearing chunk (length == chunks)")
    def offsets_per_chunk(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col("chunk_offsets_s").is_null() | (pl.col("chunk_offsets_s").list.len() == pl.col("chunks"))
        )

    Config = Exact


class GaugeModel(pa.DataFrameModel):
    """gauges.parquet: engine gauges sampled during the cell."""

    cell_key: pl.String = pa.Field()
    t_s: pl.Float64 = pa.Field(ge=0)
    kv_cache_usage: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    running: pl.Int64 = pa.Field(**_NonNegative)
    waiting: pl.Int64 = pa.Field(**_NonNegative)
    preemptions_total: pl.Int64 = pa.Field(**_NonNegative)

    Config = Exact


class SpecDecodeModel(pa.DataFrameModel):
    """summary.json's speculation block (counter deltas over the measured window)."""

    cell_key: pl.String = pa.Field(unique=True)
    drafts: pl.Int64 = pa.Field(**_NonNegative)
    draft_tokens: pl.Int64 = pa.Field(**_NonNegative)
    accepted_tokens: pl.Int64 = pa.Field(**_NonNegative)
    acceptance_rate: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)
    mean_acceptance_length: pl.Float64 = pa.Field(nullable=True, ge=1)
    decode_steps: pl.Int64 = pa.Field(**_NonNegative)
    inferred_step_time_s: pl.Float64 = pa.Field(**_NonNegative)

    @pa.dataframe_check(error="accepted_tokens: cannot exceed draft_tokens")
    def accepted_within_drafted(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select((pl.col("accepted_tokens") <= pl.col("draft_tokens")).fill_null(True))

    Config = Exact


class SpecDecodePositionModel(pa.DataFrameModel):
    cell_key: pl.String = pa.Field()
    position: pl.Int32 = pa.Field(ge=0)
    acceptance_rate: pl.Float64 = pa.Field(nullable=True, ge=0, le=1)

    @pa.dataframe_check(error="position: each draft position appears once per cell")
    def unique_position(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("cell_key", "position").is_duplicated())

    Config = Exact


class CaptureModel(pa.DataFrameModel):
    capture_key: pl.String = pa.Field(unique=True)
    capture_id: pl.String = pa.Field(str_length={"min_value": 1})
    campaign_id: pl.String = pa.Field(str_length={"min_value": 1})
    deployment_id: pl.String = pa.Field(nullable=True)
    variant: pl.String = pa.Field(nullable=True)
    corpus_file: pl.String = pa.Field(nullable=True)
    corpus_sha256: pl.String = pa.Field(nullable=True)
    prompt_ids: pl.List(pl.String) = pa.Field(nullable=True)
    sampling: pl.String = pa.Field(nullable=True)
    sampling_key: pl.String = pa.Field(nullable=True)
    engine_version: pl.String = pa.Field(nullable=True)
    specgauge_version: pl.String = pa.Field(nullable=True)
    git_revision: pl.String = pa.Field(nullable=True)
    started_utc: pl.Datetime = pa.Field(nullable=True)
    ended_utc: pl.Datetime = pa.Field(nullable=True)
    outputs: pl.Int32 = pa.Field(ge=0)
    outputs_ok: pl.Int32 = pa.Field(ge=0)
    source_path: pl.String = pa.Field()
    sha256: pl.String = pa.Field(str_length={"min_value": 64, "max_value": 64})

    Config = Exact


class CaptureOutputModel(pa.DataFrameModel):
    """outputs.parquet of a greedy capture, one row per prompt."""

    capture_key: pl.String = pa.Field()
    prompt_id: pl.String = pa.Field()
    workload: pl.String = pa.Field(nullable=True)
    ok: pl.Boolean = pa.Field()
    error: pl.String = pa.Field(nullable=True)
    text: pl.String = pa.Field(nullable=True)
    token_ids: pl.List(pl.Int64) = pa.Field(nullable=True)
    finish_reason: pl.String = pa.Field(nullable=True)
    prompt_tokens: pl.Int64 = pa.Field(**_NonNegative)
    completion_tokens: pl.Int64 = pa.Field(**_NonNegative)

    @pa.dataframe_check(error="prompt_id: each prompt appears once per capture")
    def one_output_per_prompt(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("capture_key", "prompt_id").is_duplicated())

    @pa.dataframe_check(error="error: a failed output must say why")
    def failed_say_why(cls, data: PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("ok") | pl.col("error").is_not_null())

    Config = Exact


# Which model checks the frames bound for which table.
MODELS: dict[str, type[pa.DataFrameModel]] = {
    "campaigns": CampaignModel,
    "deployments": DeploymentModel,
    "cells": CellModel,
    "requests": RequestModel,
    "gauges": GaugeModel,
    "spec_decode": SpecDecodeModel,
    "spec_decode_positions": SpecDecodePositionModel,
    "captures": CaptureModel,
    "capture_outputs": CaptureOutputModel,
}


# -- all checks in one query -----------------------------------------------------------------------------------


@cache
def one_query(model: type[pa.DataFrameModel]) -> pa.DataFrameSchema:
    """`model`'s schema with every check it can fuse (its columns' checks, non-null and unique constraints, and
    its frame-level checks) run as one polars query.

    pandera runs each check as its own query, two `collect`s apiece: for the 107 columns of CellModel about
    280 queries, 0.15 s per batch whatever its rows, a third of the ingest's reading thread. A valid batch
    needs only a yes, which one query gives; a batch that fails is validated again with `model` itself, whose
    errors name the column and the check (warehouse.ingest._checked). Each check keeps pandera's own
    function and null handling, so both accept exactly the same frames (tests/test_warehouse_models.py).
    Types and the exact set of columns are still checked by pandera, from the frame's schema alone.
    """
    schema = model.to_schema()
    fused: list[tuple[str, pa.Check | str]] = []  # (column selector or "*", check | "not_null" | "unique")
    updates: dict[str, dict[str, object]] = {}
    for name, column in schema.columns.items():
        keep = [c for c in column.checks if not _fusable(c)]
        fused += [(column.selector, c) for c in column.checks if _fusable(c)]
        if not column.nullable:
            fused.append((column.selector, "not_null"))
        if column.unique:
            fused.append((column.selector, "unique"))
        updates[name] = {"checks": keep, "nullable": True, "unique": False}
    frame_checks = [c for c in schema.checks if _fusable(c)]
    fused += [("*", c) for c in frame_checks]
    if not fused:
        return schema
    out = schema.update_columns(updates)
    out.checks = [*(c for c in schema.checks if not _fusable(c)), _all_at_once(fused, model.__name__)]
    return out


def _fusable(check: pa.Check) -> bool:
    # element-wise checks run a Python function per value: no query to fuse
    return check._check_fn is not None and not check.element_wise and not check.groupby


def _function(check: pa.Check) -> Callable[..., Any]:
    # A built-in check's function is looked up when it runs, as pandera's Check.__call__ does: the polars
    # implementations register themselves when the polars backend is first used, after the model was built.
    name = getattr(check._check_fn, "__name__", None)
    if name is not None and check.is_builtin_check(name):
        return check.get_builtin_check_fn(name)
    return check._check_fn


def _all_at_once(fused: list[tuple[str, pa.Check | str]], model_name: str) -> pa.Check:
    def check(data: PolarsData) -> pl.LazyFrame:
        frame = data.lazyframe
        schema = frame.collect_schema()
        exprs: list[pl.Expr] = []
        for selector, what in fused:
            if what == "not_null":  # pandera's nullable check: a float must not be NaN either
                for name in _names(selector, schema):
                    expr = pl.col(name).is_not_null()
                    exprs.append(expr & pl.col(name).is_not_nan() if schema[name].is_float() else expr)
            elif what == "unique":
                exprs.append(~pl.col(selector).is_duplicated())
            else:
                assert isinstance(what, pa.Check)
                exprs.append(_expression(what, frame, selector).fill_null(what.ignore_na))
        return frame.select(pl.all_horizontal(exprs).alias("passed"))

    return pa.Check(check, name=f"{model_name}: all checks at once")


def _names(selector: str, schema: pl.Schema) -> list[str]:
    # pandera's regex columns are "^...$" selectors, which polars also reads as a regex
    if selector.startswith("^") and selector.endswith("$"):
        return [name for name in schema.names() if re.fullmatch(selector, name)]
    return [selector]


class _Select:
    """Stands in for the LazyFrame a check function selects from, to capture the expression it builds."""

    def select(self, *exprs: pl.Expr) -> list[pl.Expr]:
        return list(exprs)


def _expression(check: pa.Check, frame: pl.LazyFrame, selector: str) -> pl.Expr:
    """The boolean expression of a check (one output per selected column). pandera's built-in checks and
    ours are `data.lazyframe.select(expression)`: capture that. Any other shape is run for real, as its
    own query, and joined back row by row."""
    function = _function(check)
    try:
        captured = function(PolarsData(_Select(), selector), **check._check_kwargs)  # type: ignore[arg-type]
    except (AttributeError, TypeError):
        captured = None
    if isinstance(captured, list) and captured and all(isinstance(e, pl.Expr) for e in captured):
        return pl.all_horizontal(captured) if len(captured) > 1 else captured[0]
    result = function(PolarsData(frame, selector), **check._check_kwargs)
    if isinstance(result, bool):
        return pl.repeat(result, pl.len())
    return pl.lit(result.select(pl.all_horizontal(pl.all())).collect().to_series())
