"""A campaign's record on disk: campaign.json (written once), one record per run, and what is done already.

The raw tree is the campaign's memory: a re-run reads it to skip cells whose latest attempt is ok and
captures that exist, and to give each new launch a fresh deployment id.

One writer per campaign: a run holds `campaign_writer` (artifacts.store) from planning to its run record, so a
second run of the same campaign is refused at once naming the holder (exit 2) instead of measuring the same
cells on the same servers at the same time; taking it removes the half-written artifacts a killed run left.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from artifacts import layout
from artifacts.documents import CampaignRecord, CellSummary, RunRecord
from artifacts.store import CampaignBusy as CampaignBusy  # the campaign's lock, for flows and the CLI
from artifacts.store import campaign_writer as campaign_writer
from artifacts.store import read_document, read_json, write_json_atomic
from experiments.plan import CampaignPlan, CellPlan, DeploymentPlan
from experiments.spec import ExperimentSpec
from specgauge.errors import ArtifactError
from specgauge.provenance import host_facts, tool_facts, utc_now, utc_stamp
from specgauge.settings import get_settings


def campaign_dir(campaign_id: str, raw_dir: Path | None = None) -> Path:
    return layout.campaign_dir(raw_dir or get_settings().raw_dir, campaign_id)


def record_campaign(plan: CampaignPlan, spec: ExperimentSpec, raw_dir: Path | None = None) -> Path:
    """Write campaign.json once; a re-run of the same campaign finds it and leaves it alone."""
    directory = campaign_dir(plan.campaign_id, raw_dir)
    path = layout.campaign_file(directory)
    if path.exists():
        return directory
    record = CampaignRecord.model_validate(
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
        }
    )
    try:
        write_json_atomic(path, record)
    except ArtifactError:
        if not path.exists():
            raise
        # Another run of the same campaign wrote it first (two runs started together): not a failure here;
        # the campaign's writer lock then decides which of the two runs.
    return directory


def record_run(directory: Path, record: dict[str, Any]) -> Path:
    """One immutable record per run of the campaign (status, timings, what was skipped or failed)."""
    # Names sort in run order; the counter keeps two runs of one process within one second apart.
    stem = f"{utc_stamp()}-{os.getpid()}"
    number = 1
    while (path := layout.run_file(directory, f"{stem}-{number:02d}")).exists():
        number += 1
    write_json_atomic(path, RunRecord.model_validate({**record, "tool": tool_facts(), "host": host_facts()}))
    return path


def cells_dir(directory: Path) -> Path:
    return layout.cells_dir(directory)


def cell_is_complete_ok(path: Path) -> bool:
    """A cell attempt that needs no re-run: every file present and its summary says ok."""
    if not all((path / name).exists() for name in layout.CELL_FILES):
        return False
    try:
        return read_document(path / layout.SUMMARY, CellSummary).status == "ok"
    except (OSError, ValueError):  # unreadable, not JSON, not a summary (ValidationError is a ValueError)
        return False


def cell_done(directory: Path, cell: CellPlan) -> bool:
    attempts = layout.cell_attempts(cells_dir(directory), cell.cell_id)
    return bool(attempts) and cell_is_complete_ok(attempts[-1])


def capture_done(directory: Path, capture_id: str) -> bool:
    return layout.capture_complete(layout.capture_dir(directory, capture_id))


def search_done(directory: Path, search_id: str) -> bool:
    return layout.search_file(directory, search_id).exists()


def deployment_done(directory: Path, deployment: DeploymentPlan) -> bool:
    return (
        all(cell_done(directory, c) for c in deployment.cells)
        and all(capture_done(directory, c) for c in deployment.captures)
        and (deployment.search is None or search_done(directory, deployment.search.search_id))
    )


def next_launch_id(directory: Path, slot: str) -> str:
    """Each launch of a deployment slot gets its own id (slot.l1, slot.l2, ...): directories stay immutable."""
    return layout.next_launch_id(directory, slot)


def latest_campaigns(raw_dir: Path | None = None) -> list[dict[str, Any]]:
    found = []
    for path in layout.campaign_files(raw_dir or get_settings().raw_dir):
        try:
            found.append(read_json(path))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda c: c.get("created_utc", ""))


def headline_rows(directory: Path, plan: CampaignPlan) -> list[dict[str, Any]]:
    """One row per planned cell with its latest attempt's headline figures (for tables and artifacts)."""
    rows = []
    for slot, cell in plan.cells():
        attempts = layout.cell_attempts(cells_dir(directory), cell.cell_id)
        summary = read_document(attempts[-1] / layout.SUMMARY, CellSummary) if attempts else None
        rows.append(headline_row(slot, cell, summary))
    return rows


def headline_row(slot: DeploymentPlan, cell: CellPlan, summary: CellSummary | None) -> dict[str, Any]:
    """A cell's headline figures (`status: not run` without a summary)."""
    row: dict[str, Any] = {
        "variant": slot.variant.name,
        "repeat": slot.repeat,
        "workload": cell.workload,
        "load": cell.load_label,
    }
    if summary is None:
        return {**row, "status": "not run"}
    counts, latency, spec = summary.requests, summary.latency_s, summary.speculation
    return {
        **row,
        "status": summary.status,
        "ok": f"{counts.ok}/{counts.total}" if counts else "",
        "tok/s": _fmt(summary.output_throughput_tok_s),
        "TTFT p50 s": _fmt(latency.ttft.p50 if latency and latency.ttft else None, 3),
        "TPOT p50 s": _fmt(latency.tpot.p50 if latency and latency.tpot else None, 4),
        "acceptance": _fmt(spec.acceptance_rate if spec else None, 3),
        "mean acc. len": _fmt(spec.mean_acceptance_length if spec else None, 2),
    }


def _fmt(value: Any, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"
