"""A campaign's record on disk: campaign.json (written once), one record per run, and what is done already.

The raw tree is the campaign's memory: a re-run reads it to skip cells whose latest attempt is ok and
captures that exist, and to give each new launch a fresh deployment id.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from experiments.plan import CampaignPlan, CellPlan, DeploymentPlan
from experiments.spec import ExperimentSpec
from specgauge.provenance import host_facts, tool_facts, utc_now, utc_stamp
from specgauge.settings import get_settings
from tasks.artifacts import cell_attempts, cell_is_complete_ok, read_json, write_json_atomic


def campaign_dir(campaign_id: str, raw_dir: Path | None = None) -> Path:
    return (raw_dir or get_settings().raw_dir) / campaign_id


def record_campaign(plan: CampaignPlan, spec: ExperimentSpec, raw_dir: Path | None = None) -> Path:
    """Write campaign.json once; a re-run of the same campaign finds it and leaves it alone."""
    directory = campaign_dir(plan.campaign_id, raw_dir)
    path = directory / "campaign.json"
    if path.exists():
        return directory
    write_json_atomic(
        path,
        {
            "campaign_id": plan.campaign_id,
            "name": spec.name,
            "label": plan.label,
            "spec_sha256": plan.spec_sha256,
            "spec": spec.model_dump(mode="json"),
            "variant_order": [list(order) for order in plan.orders],
            "deployments": [
                {
                    "slot": d.deployment_id,
                    "variant": d.variant.name,
                    "repeat": d.repeat,
                    "role": d.role,
                    "position": d.position,
                    "cells": [c.cell_id for c in d.cells],
                    "captures": list(d.captures),
                }
                for d in plan.deployments
            ],
            "created_utc": utc_now(),
            "tool": tool_facts(),
            "host": host_facts(),
        },
    )
    return directory


def record_run(directory: Path, record: dict[str, Any]) -> Path:
    """One immutable record per run of the campaign (status, timings, what was skipped or failed)."""
    # Names sort in run order; the counter keeps two runs of one process within one second apart.
    stem = f"{utc_stamp()}-{os.getpid()}"
    number = 1
    while (path := directory / "runs" / f"{stem}-{number:02d}.json").exists():
        number += 1
    write_json_atomic(path, {**record, "tool": tool_facts(), "host": host_facts()})
    return path


def cells_dir(directory: Path) -> Path:
    return directory / "cells"


def cell_done(directory: Path, cell: CellPlan) -> bool:
    attempts = cell_attempts(cells_dir(directory), cell.cell_id)
    return bool(attempts) and cell_is_complete_ok(attempts[-1])


def capture_done(directory: Path, capture_id: str) -> bool:
    path = directory / "captures" / capture_id
    return (path / "meta.json").exists() and (path / "outputs.parquet").exists()


def deployment_done(directory: Path, deployment: DeploymentPlan) -> bool:
    return all(cell_done(directory, c) for c in deployment.cells) and all(
        capture_done(directory, c) for c in deployment.captures
    )


def next_launch_id(directory: Path, slot: str) -> str:
    """Each launch of a deployment slot gets its own id (slot.l1, slot.l2, ...): directories stay immutable."""
    base = directory / "deployments"
    n = 1
    while (base / f"{slot}.l{n}").exists():
        n += 1
    return f"{slot}.l{n}"


def latest_campaigns(raw_dir: Path | None = None) -> list[dict[str, Any]]:
    root = raw_dir or get_settings().raw_dir
    found = []
    for path in root.glob("*/campaign.json") if root.exists() else []:
        try:
            found.append(read_json(path))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda c: c.get("created_utc", ""))


def headline_rows(directory: Path, plan: CampaignPlan) -> list[dict[str, Any]]:
    """One row per planned cell with its latest attempt's headline figures (for tables and artifacts)."""
    rows = []
    for slot, cell in plan.cells():
        attempts = cell_attempts(cells_dir(directory), cell.cell_id)
        if not attempts:
            rows.append(
                {
                    "variant": slot.variant.name,
                    "repeat": slot.repeat,
                    "workload": cell.workload,
                    "load": cell.load_label,
                    "status": "not run",
                }
            )
            continue
        summary = read_json(attempts[-1] / "summary.json")
        spec = summary.get("speculation") or {}
        rows.append(
            {
                "variant": slot.variant.name,
                "repeat": slot.repeat,
                "workload": cell.workload,
                "load": cell.load_label,
                "status": summary["status"],
                "ok": f"{summary['requests']['ok']}/{summary['requests']['total']}",
                "tok/s": _fmt(summary.get("output_throughput_tok_s")),
                "TTFT p50 s": _fmt(summary["latency_s"]["ttft"]["p50"], 3),
                "TPOT p50 s": _fmt(summary["latency_s"]["tpot"]["p50"], 4),
                "acceptance": _fmt(spec.get("acceptance_rate"), 3),
                "mean acc. len": _fmt(spec.get("mean_acceptance_length"), 2),
            }
        )
    return rows


def _fmt(value: Any, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"
