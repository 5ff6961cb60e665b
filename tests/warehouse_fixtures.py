"""Synthetic raw artifacts in exactly the documented layout (docs/design.md), for warehouse tests and the
warehouse benchmark. Written with the project's own writers and contract: experiments.plan (ids, variant
order), tasks.campaign_state (campaign.json, run records), artifacts (layout, store, documents),
tasks.load.records.records_frame, tasks.launch.base.Deployment.

Each variant has a known speed (VariantProfile), so tests can predict speedups; the summary figures are
computed from the generated request rows, as the real summary does (successful measured requests only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from artifacts import ids, layout
from artifacts.documents import GAUGE_SCHEMA, REQUEST_SCHEMA
from artifacts.store import atomic_dir, write_json
from experiments.plan import CampaignPlan, CellPlan, DeploymentPlan, plan_campaign
from experiments.spec import ExperimentSpec, parse_spec
from specgauge.checkpoints import drafter_record
from specgauge.provenance import utc_now
from tasks.campaign_state import record_campaign, record_run
from tasks.launch.base import Deployment
from tasks.launch.command import served_name, vllm_args
from tasks.load.records import RequestRecord, records_frame
from tasks.profile.breakdown import Breakdown, counters_from_metrics
from tasks.profile.torch_trace import analyze_trace


def make_spec(
    name: str = "synth",
    *,
    concurrencies: tuple[int, ...] = (1, 4),
    rates: tuple[float, ...] = (),
    repeats: int = 1,
    requests: int = 8,
    warmup: int = 2,
    strata: tuple[str, ...] = ("chat",),
    variants: list[dict[str, Any]] | None = None,
    aa_control: bool = False,
) -> ExperimentSpec:
    """A planted campaign's spec; without the A/A arm unless asked (the builders plant the variants listed)."""
    return parse_spec(
        {
            "name": name,
            "target": {"model": "models/tiny-target", "served_model_name": "tiny", "max_model_len": 2048},
            "variants": variants
            or [
                {"name": "plain", "method": "none"},
                {
                    "name": "ngram-k3",
                    "method": "ngram",
                    "k": 3,
                    "prompt_lookup_min": 1,
                    "prompt_lookup_max": 4,
                },
                {"name": "draft-k3", "method": "draft_model", "k": 3, "draft_model": "models/tiny-draft"},
            ],
            "workloads": [{"file": "workloads/smoke.jsonl", "strata": list(strata)}],
            "load": {
                "concurrencies": list(concurrencies),
                "rates": list(rates),
                "requests": requests,
                "warmup": warmup,
                "allow_short_cells": True,  # planted data: no cell is measured, small counts keep it fast
            },
            "sampling": {"temperature": 0.0, "seed": 0},
            "repeats": repeats,
            "capture": {"corpus": "workloads/capture.jsonl", "plain_controls": 1},
            "slo": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1},
            "validity": {"aa_control": aa_control},
        },
        "synthetic",
    )


def aa_spec(name: str, *, repeats: int) -> ExperimentSpec:
    """A planted campaign of plain, n-gram k=3 and an A/A arm (plain again, the validity control): one load
    (C = 1), 16 requests a cell."""
    return make_spec(
        name,
        repeats=repeats,
        concurrencies=(1,),
        requests=16,
        variants=[
            {"name": "plain", "method": "none"},
            {"name": "ngram-k3", "method": "ngram", "k": 3},
            {"name": "plain-aa", "method": "none", "aa_control": True},
        ],
    )


@dataclass(frozen=True)
class VariantProfile:
    """How fast a synthetic variant serves: TTFT, time per output token, tokens per streamed chunk."""

    ttft_s: float
    tpot_s: float
    tokens_per_chunk: float
    acceptance_rate: float | None = None  # speculative variants only


# The tables a RawBuilder tree fills (every artifact kind it writes).
DATA_TABLES = (
    "campaigns",
    "deployments",
    "cells",
    "requests",
    "gauges",
    "spec_decode",
    "spec_decode_positions",
    "captures",
    "capture_outputs",
)

DEFAULT_PROFILES = {
    "plain": VariantProfile(ttft_s=0.050, tpot_s=0.020, tokens_per_chunk=1.0),
    "ngram-k3": VariantProfile(ttft_s=0.055, tpot_s=0.016, tokens_per_chunk=1.6, acceptance_rate=0.30),
    "draft-k3": VariantProfile(ttft_s=0.060, tpot_s=0.012, tokens_per_chunk=2.2, acceptance_rate=0.55),
}
REPO = Path(__file__).resolve().parent.parent
T0 = "2026-11-30T16:50:00.000Z"


@dataclass
class RawBuilder:
    """Writes a campaign's raw tree as the campaign flow does: the plan (experiments.plan), campaign.json and
    run records (tasks.campaign_state), one launch per deployment slot (`<slot>.l1`), cells and captures."""

    raw_dir: Path
    spec: ExperimentSpec = field(default_factory=make_spec)
    label: str | None = None
    profiles: dict[str, VariantProfile] = field(default_factory=lambda: dict(DEFAULT_PROFILES))
    completion_tokens: int = 32
    seed: int = 0
    fast_frames: bool = False  # vectorised request frames (benchmarks); tests use records_frame

    def __post_init__(self) -> None:
        self.raw_dir = Path(self.raw_dir)
        self.plan: CampaignPlan = plan_campaign(self.spec, self.label)

    @property
    def campaign_id(self) -> str:
        return self.plan.campaign_id

    @property
    def campaign_dir(self) -> Path:
        return self.raw_dir / self.campaign_id

    def slot(self, variant: str, repeat: int) -> DeploymentPlan:
        return next(
            d
            for d in self.plan.deployments
            if d.variant.name == variant and d.repeat == repeat and d.role == "arm"
        )

    def arms(self) -> list[DeploymentPlan]:
        return [d for d in self.plan.deployments if d.role == "arm"]

    # ------------------------------------------------------------------------------------------ campaign

    def write_campaign(self) -> Path:
        return layout.campaign_file(record_campaign(self.plan, self.spec, self.raw_dir))

    def write_run(self, failed_cells: dict[str, str] | None = None) -> Path:
        return record_run(
            self.campaign_dir,
            {
                "campaign_id": self.campaign_id,
                "started_utc": T0,
                "ended_utc": utc_now(),
                "deployments": [],
                "failed_cells": failed_cells or {},
            },
        )

    # ----------------------------------------------------------------------------------------- deployment

    def deployment(self, slot: DeploymentPlan, launch: int = 1) -> Deployment:
        variant = slot.variant
        deployment_id = ids.launch_id(slot.deployment_id, launch)
        directory = layout.deployment_dir(self.campaign_dir, deployment_id)
        port = 8000 + slot.position
        command = [
            "/opt/engine/bin/python",
            "-m",
            "vllm.entrypoints.openai.api_server",
            *vllm_args(
                self.spec.target_of(variant),
                variant,
                served_model_name=served_name(self.spec.target, variant),
                host="127.0.0.1",
                port=port,
            ),
        ]
        return Deployment(
            id=deployment_id,
            launcher="local",
            variant=variant,
            served_model_name=served_name(self.spec.target, variant),
            base_url=f"http://127.0.0.1:{port}",
            metrics_url=f"http://127.0.0.1:{port}/metrics",
            directory=directory,
            command=command,
            log_path=directory / "engine.log",
            started_at="2026-11-30T16:46:00.000Z",
            status="stopped",
            ready_s=61.5,
            engine_version="0.32.0",
            kv_cache_tokens=43690,
            max_model_len=2048,
            pid=4242,
            stopped_at="2026-11-30T17:10:00.000Z",
            teardown="terminated",
            drafter=drafter_record(variant.method, variant.drafter, REPO / variant.drafter)
            if variant.drafter
            else None,
            extra={"port": port, "kv_cache_gib": 1.0},
        )

    def write_deployment(self, slot: DeploymentPlan, launch: int = 1, **changes: Any) -> Path:
        deployment = self.deployment(slot, launch)
        for key, value in changes.items():
            setattr(deployment, key, value)
        deployment.save()
        (deployment.directory / layout.ENGINE_LOG).write_text("INFO CPU KV cache size: 43,690 tokens\n")
        (deployment.directory / layout.COMMAND_FILE).write_text(" ".join(deployment.command) + "\n")
        return deployment.directory

    # ---------------------------------------------------------------------------------------------- cells

    def requests_frame(
        self,
        variant: str,
        workload: str,
        n_measured: int,
        n_warmup: int,
        rng: np.random.Generator,
        failed: int = 0,
    ) -> pl.DataFrame:
        profile = self.profiles[variant]
        n = n_warmup + n_measured
        tokens = np.full(n, self.completion_tokens, dtype=np.int64)
        chunks = np.maximum(1, np.round(tokens / profile.tokens_per_chunk)).astype(np.int64)
        ttft = profile.ttft_s * rng.uniform(0.8, 1.2, n)
        tpot = profile.tpot_s * rng.uniform(0.9, 1.1, n)
        e2e = ttft + tpot * (tokens - 1)
        sent = np.cumsum(rng.uniform(0.0, 0.01, n)) + np.arange(n) * 0.001
        ok = np.ones(n, dtype=bool)
        if failed:
            ok[-failed:] = False
        prompt_ids = [f"{workload}-{i % 4:03d}" for i in range(n)]
        if not self.fast_frames:
            records = []
            for i in range(n):
                c = int(chunks[i])
                per_chunk = [int(tokens[i]) // c] * c
                per_chunk[-1] += int(tokens[i]) - sum(per_chunk)
                good = bool(ok[i])
                records.append(
                    RequestRecord(
                        index=i,
                        prompt_id=prompt_ids[i],
                        workload=workload,
                        phase="warmup" if i < n_warmup else "measured",
                        endpoint="chat",
                        queued_s=float(sent[i]),
                        sent_s=float(sent[i]),
                        first_token_s=float(sent[i] + ttft[i]) if good else None,
                        last_token_s=float(sent[i] + e2e[i]) if good else None,
                        ended_s=float(sent[i] + e2e[i]) + 0.001 if good else float(sent[i]) + 0.5,
                        ttft_s=float(ttft[i]) if good else None,
                        e2e_s=float(e2e[i]) if good else None,
                        tpot_s=float(tpot[i]) if good else None,
                        prompt_tokens=24,
                        completion_tokens=int(tokens[i]) if good else None,
                        chunks=c if good else 0,
                        chunk_offsets_s=[float(x) for x in np.linspace(ttft[i], e2e[i], c)] if good else [],
                        chunk_tokens=per_chunk if good else [],
                        tokens_exact=True,
                        finish_reason="length" if good else None,
                        http_status=200 if good else 503,
                        ok=good,
                        error_class=None if good else "http_status",
                        error=None if good else "HTTP 503 Service Unavailable",
                    )
                )
            return records_frame(records)
        # Vectorised: the columns and types of records_frame (REQUEST_SCHEMA), without per-row objects.
        c = int(chunks[0])
        steps = np.linspace(0.0, 1.0, c)
        offsets = ttft[:, None] + (e2e - ttft)[:, None] * steps[None, :]
        per_chunk = np.full((n, c), int(tokens[0]) // c, dtype=np.int32)
        per_chunk[:, -1] += int(tokens[0]) - per_chunk[0].sum()
        return pl.DataFrame(
            {
                "index": np.arange(n, dtype=np.int32),
                "prompt_id": prompt_ids,
                "workload": [workload] * n,
                "phase": ["warmup"] * n_warmup + ["measured"] * n_measured,
                "endpoint": ["chat"] * n,
                "queued_s": sent,
                "scheduled_s": None,
                "sent_s": sent,
                "first_token_s": sent + ttft,
                "last_token_s": sent + e2e,
                "ended_s": sent + e2e + 0.001,
                "client_queue_s": np.zeros(n),
                "ttft_s": ttft,
                "e2e_s": e2e,
                "tpot_s": tpot,
                "prompt_tokens": np.full(n, 24, dtype=np.int64),
                "completion_tokens": tokens,
                "chunks": np.full(n, c, dtype=np.int32),
                "chunk_offsets_s": pl.Series(offsets, dtype=pl.Array(pl.Float64, c)).cast(
                    pl.List(pl.Float64)
                ),
                "chunk_tokens": pl.Series(per_chunk, dtype=pl.Array(pl.Int32, c)).cast(pl.List(pl.Int32)),
                "tokens_exact": np.ones(n, dtype=bool),
                "finish_reason": ["length"] * n,
                "http_status": np.full(n, 200, dtype=np.int32),
                "ok": ok,
                "error_class": None,
                "error": None,
                "token_ids": None,
                "text": None,
                # per-request acceptance: null, as records_frame leaves it for requests without it
                **dict.fromkeys(("spec_steps", "spec_draft_tokens", "spec_accepted_tokens")),
                "spec_acceptance_histogram": None,
            },
            schema=REQUEST_SCHEMA,
        )

    def summary(
        self, variant: str, requests: pl.DataFrame, gauges: pl.DataFrame, status: str, error: str | None
    ) -> dict[str, Any]:
        """The figures of summary.json, from the rows (measured, successful), as the real summary does."""
        measured = requests.filter(pl.col("phase") == "measured")
        good = measured.filter(pl.col("ok"))
        total, n_ok = measured.height, good.height
        wall = float(measured["ended_s"].max() - measured["sent_s"].min()) if total else None
        tokens = int(good["completion_tokens"].sum()) if n_ok else 0

        def stats(column: str) -> dict[str, float] | None:
            values = good[column].drop_nulls().to_numpy()
            if not len(values):
                return None
            quantiles = {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 95, 99)}
            return {"mean": float(values.mean()), **quantiles, "n": len(values)}

        profile = self.profiles[variant]
        speculation = None
        if profile.acceptance_rate is not None:
            k = next(v.k for v in self.spec.variants if v.name == variant) or 1
            drafts = max(1, round(tokens / profile.tokens_per_chunk))
            draft_tokens = drafts * k
            accepted = round(draft_tokens * profile.acceptance_rate)
            speculation = {
                "drafts": drafts,
                "draft_tokens": draft_tokens,
                "accepted_tokens": accepted,
                "acceptance_rate": accepted / draft_tokens,
                "mean_acceptance_length": 1 + accepted / drafts,
                "acceptance_rate_per_position": {
                    str(i): round(min(1.0, profile.acceptance_rate * 1.2 * 0.8**i), 6) for i in range(k)
                },
                "decode_steps": tokens - accepted,
                "inferred_step_time_s": profile.tpot_s * tokens / max(tokens - accepted, 1),
            }
        slo = self.spec.slo
        within = good.filter(
            (pl.col("ttft_s") <= slo.ttft_p99_s) & (pl.col("tpot_s") <= slo.tpot_p99_s)
        ).height
        has_gauges = gauges.height > 0
        return {
            "status": status,
            "error": error,
            "requests": {
                "total": total,
                "ok": n_ok,
                "failed": total - n_ok,
                "success_rate": n_ok / total if total else None,
                "errors": {"http_status": total - n_ok} if total - n_ok else {},
            },
            "wall_s": wall,
            "output_throughput_tok_s": tokens / wall if wall else None,
            "request_throughput_rps": n_ok / wall if wall else None,
            "completion_tokens": tokens,
            "prompt_tokens": int(good["prompt_tokens"].sum()) if n_ok else 0,
            "latency_s": {
                "ttft": stats("ttft_s"),
                "tpot": stats("tpot_s"),
                "e2e": stats("e2e_s"),
                "chunk_gap": None,
                "itl_per_token": None,
            },
            "tokens_per_chunk_mean": profile.tokens_per_chunk,
            "tokens_exact": True,
            "goodput": {
                "ttft_slo_s": slo.ttft_p99_s,
                "tpot_slo_s": slo.tpot_p99_s,
                "share": within / total if total else None,
                "rate_rps": within / wall if wall else None,
                "good": within,
            },
            "speculation": speculation,
            "cross_checks": {
                "tokens_per_chunk_vs_acceptance_length": {
                    "client": profile.tokens_per_chunk,
                    "server": speculation["mean_acceptance_length"] if speculation else 1.0,
                    "rel_diff": -0.01,
                    "ok": True,
                },
                "completion_tokens_vs_generation_tokens": {
                    "client": tokens,
                    "server": tokens,
                    "rel_diff": 0.0,
                    "ok": True,
                },
            },
            "gauges": {
                "kv_cache_usage_max": float(gauges["kv_cache_usage"].max()) if has_gauges else None,
                "kv_cache_usage_mean": float(gauges["kv_cache_usage"].mean()) if has_gauges else None,
                "running_max": int(gauges["running"].max()) if has_gauges else None,
                "waiting_max": int(gauges["waiting"].max()) if has_gauges else None,
                "preemptions": 0,
                "samples": gauges.height,
                "scrape_failures": 0,
            },
            "server_valid": True,
            "server_problem": None,
        }

    def write_cell(
        self,
        slot: DeploymentPlan,
        cell: CellPlan,
        *,
        launch: int = 1,
        status: str = "ok",
        n_measured: int | None = None,
        failed_requests: int = 0,
        mutate_requests: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
        mutate_summary: Callable[[dict[str, Any]], None] | None = None,
        mutate_meta: Callable[[dict[str, Any]], None] | None = None,
    ) -> Path:
        """The next attempt of one cell, in the layout of tasks/cell.py. `mutate_*` corrupt it on purpose."""
        final = layout.next_cell_dir(layout.cells_dir(self.campaign_dir), cell.cell_id)
        _, attempt = ids.parse_attempt_name(final.name)  # type: ignore[misc]
        variant = slot.variant.name
        digest = hashlib.sha256(f"{self.seed}/{final.name}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:4], "little"))
        load = self.spec.load
        n_measured = load.requests_at(cell.concurrency) if n_measured is None else n_measured
        warmup = load.warmup_at(cell.concurrency)
        requests = self.requests_frame(variant, cell.workload, n_measured, warmup, rng, failed_requests)
        n_gauges = 8
        gauges = pl.DataFrame(
            {
                "t_s": np.arange(n_gauges) * 0.5,
                "kv_cache_usage": rng.uniform(0.05, 0.4, n_gauges),
                "running": rng.integers(0, 4, n_gauges),
                "waiting": np.zeros(n_gauges, dtype=np.int64),
                "preemptions_total": np.zeros(n_gauges, dtype=np.int64),
            },
            schema=GAUGE_SCHEMA,
        )
        error = None if status == "ok" else "EngineDied: the engine exited during the cell"
        summary = self.summary(variant, requests, gauges, status, error)
        if mutate_summary is not None:
            mutate_summary(summary)
        if mutate_requests is not None:  # after the summary: a requests file broken on its own
            requests = mutate_requests(requests)
        deployment = self.deployment(slot, launch)
        corpus = self.plan.corpora[cell.corpus_file]
        meta = {
            "cell_id": cell.cell_id,
            "campaign_id": self.campaign_id,
            "deployment_id": deployment.id,
            "variant": slot.variant.model_dump(mode="json"),
            "repeat": slot.repeat,
            "workload": {
                "file": cell.corpus_file,
                "sha256": corpus.sha256,
                "stratum": cell.workload,
                "prompt_ids": [f"{cell.workload}-{i:03d}" for i in range(4)],
            },
            "load": {
                "mode": cell.mode,
                "concurrency": cell.concurrency,
                "rate": cell.rate,
                "arrival": load.arrival,
                "requests": n_measured,
                "warmup": warmup,
                "time_cap_s": load.time_cap_s,
                "request_timeout_s": load.request_timeout_s,
                "seed": self.spec.seed,
            },
            "sampling": self.spec.sampling_of(slot.variant).model_dump(mode="json"),
            "endpoint": "chat",
            "deployment": deployment.to_json(),
            "tool": {"specgauge_version": "0.1.0", "git_revision": "synthetic"},
            "host": {"hostname": "synthetic-host", "platform": "Linux", "python": "3.11", "cpus": 2},
            "t0_utc": T0,
            "started_utc": T0,
            "ended_utc": "2026-11-30T16:51:00.000Z",
            "capped": False,
            "attempt": attempt,
        }
        if mutate_meta is not None:
            mutate_meta(meta)
        with atomic_dir(final) as tmp:
            write_json(tmp / layout.META, meta)
            write_json(tmp / layout.SUMMARY, summary)
            requests.write_parquet(tmp / layout.REQUESTS)
            gauges.write_parquet(tmp / layout.GAUGES)
            (tmp / layout.METRICS_BEFORE).write_text("vllm:generation_tokens_total 0\n")
            (tmp / layout.METRICS_AFTER).write_text(
                f"vllm:generation_tokens_total {summary['completion_tokens']}\n"
            )
        return final

    # ------------------------------------------------------------------------------------------- captures

    def write_capture(
        self, slot: DeploymentPlan, capture_id: str, n_prompts: int = 4, launch: int = 1
    ) -> Path:
        deployment = self.deployment(slot, launch)
        outputs = pl.DataFrame(
            {
                "prompt_id": [f"cap-{i:03d}" for i in range(n_prompts)],
                "workload": ["code"] * n_prompts,
                "ok": [True] * n_prompts,
                "error": [None] * n_prompts,
                "text": [f"def f{i}(): return {i}" for i in range(n_prompts)],
                "token_ids": [[1, 2, 3, i] for i in range(n_prompts)],
                "finish_reason": ["stop"] * n_prompts,
                "prompt_tokens": [12] * n_prompts,
                "completion_tokens": [4] * n_prompts,
            },
            schema_overrides={"error": pl.String, "token_ids": pl.List(pl.Int64)},
        )
        meta = {
            "capture_id": capture_id,
            "campaign_id": self.campaign_id,
            "deployment_id": deployment.id,
            "variant": slot.variant.model_dump(mode="json"),
            "corpus": {
                "file": self.spec.capture.corpus,
                "sha256": self.plan.corpora[self.spec.capture.corpus].sha256,
            },
            "prompt_ids": outputs["prompt_id"].to_list(),
            "sampling": {"temperature": 0.0, "seed": 0, "max_tokens": 64},
            "deployment": deployment.to_json(),
            "tool": {"specgauge_version": "0.1.0", "git_revision": "synthetic"},
            "started_utc": T0,
            "ended_utc": "2026-11-30T16:52:00.000Z",
        }
        final = layout.capture_dir(self.campaign_dir, capture_id)
        with atomic_dir(final) as tmp:
            write_json(tmp / layout.META, meta)
            outputs.write_parquet(tmp / layout.OUTPUTS)
        return final

    # ---------------------------------------------------------------------------------------- everything

    def write_all(self, captures: bool = True, run: bool = True) -> None:
        """campaign.json, one launch per deployment slot, every planned cell and capture, a run record."""
        self.write_campaign()
        for slot in self.plan.deployments:
            self.write_deployment(slot)
            for cell in slot.cells:
                self.write_cell(slot, cell)
            if captures:
                for capture_id in slot.captures:
                    self.write_capture(slot, capture_id)
        if run:
            self.write_run()


# -------------------------------------------------------------------------------------------------- profiles

PROFILE_DATA = REPO / "tests" / "data" / "profile"
PROFILE_TRACE = PROFILE_DATA / "draft-k3.code.c2.worker.pt.trace.json.gz"


def real_profile_breakdown() -> Breakdown:
    """The breakdown of the real profiled window kept in tests/data/profile (draft-k3, code, concurrency 2)."""
    counters = counters_from_metrics(
        (PROFILE_DATA / "metrics_before.txt").read_text(),
        (PROFILE_DATA / "metrics_after.txt").read_text(),
        "tiny-draft-k3",
    )
    return analyze_trace(PROFILE_TRACE, counters, k=3)


def profile_meta(
    campaign_id: str,
    profile_id: str,
    *,
    status: str = "ok",
    started: str = "2026-11-30T17:13:00.000Z",
    ended: str | None = None,
) -> dict[str, Any]:
    """The meta.json of that window as tasks.profile.window writes it (a failed one says why); ended: started
    unless given."""
    return {
        "format": 1,
        "profile_id": profile_id,
        "campaign_id": campaign_id,
        "deployment_id": f"{campaign_id}.draft-k3.profile.l1",
        "variant": {"name": "draft-k3", "method": "draft_model", "k": 3, "draft_model": "models/tiny-draft"},
        "profiler": "torch-profiler",
        "workload": {
            "file": "workloads/smoke.jsonl",
            "sha256": "0" * 64,
            "stratum": "code",
            "prompt_ids": [],
        },
        "load": {"mode": "closed", "concurrency": 2, "requests": 4, "warmup": 2},
        "deployment": {"launcher": "local", "engine_version": "0.32.0"},
        "tool": {"specgauge_version": "0.1.0", "git_revision": "x"},
        "host": {"hostname": "h"},
        "started_utc": started,
        "ended_utc": ended or started,
        "status": status,
        "error": None if status == "ok" else "POST /start_profile: HTTP 404",
        "requests": {"total": 4, "ok": 4, "failed": 0},
        "trace": None,
    }
