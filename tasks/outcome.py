"""What a campaign run did, as the flow reports it: per deployment slot (cells, captures, launches, error),
the cells not ok, the run record and the markdown the Prefect UI shows. Plain data and text, no Prefect:
the campaign flow composes these, tests read them without a server."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artifacts.documents import CellSummary
from experiments.plan import CampaignPlan


@dataclass
class SlotOutcome:
    """One deployment slot: each planned cell's status, the captures taken and every launch's id."""

    slot: str
    cells: dict[str, str] = field(default_factory=dict)
    captures: list[str] = field(default_factory=list)
    launches: list[str] = field(default_factory=list)
    node: str | None = None  # where its (last) launch ran
    error: str | None = None

    def not_run(self, cell_ids: list[str], why: str) -> None:
        for cell_id in cell_ids:
            self.cells[cell_id] = f"not run ({why})"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "slot": self.slot,
            "cells": self.cells,
            "captures": self.captures,
            "launches": self.launches,
        }
        if self.node is not None:
            out["node"] = self.node
        if self.error is not None:
            out["error"] = self.error
        return out


SKIPPED = "skipped"  # a planned cell the campaign chose not to run (adaptive repeats stopped): not a failure


def failed_cells(slots: list[dict[str, Any]]) -> dict[str, str]:
    """Every cell whose status is not ok (`ok` or `ok (earlier run)`) nor skipped, with its status."""
    return {
        cell: status
        for s in slots
        for cell, status in s["cells"].items()
        if not status.startswith(("ok", SKIPPED))
    }


def _ms(seconds: float | None) -> str:
    """A latency for people: milliseconds to one decimal, or n/a."""
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"


def cell_log_line(cell_id: str, status: str, summary: CellSummary) -> str:
    """One line for the run log: a cell's headline figures, rounded and with their units, or why it failed."""
    if status != "ok":
        return f"{cell_id} failed: {summary.error}"
    requests, latency = summary.requests, summary.latency_s
    ttft = latency.ttft.p50 if latency and latency.ttft else None
    tpot = latency.tpot.p50 if latency and latency.tpot else None
    throughput = summary.output_throughput_tok_s
    rate = "n/a" if throughput is None else f"{throughput:.1f}"
    return (
        f"{cell_id}: {requests.ok if requests else 0}/{requests.total if requests else 0} ok, "
        f"{rate} tok/s, TTFT p50 {_ms(ttft)}, TPOT p50 {_ms(tpot)}"
    )


def artifact_key(campaign_id: str) -> str:
    """A Prefect artifact key for the campaign: lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() else "-" for ch in campaign_id.lower())


def report_markdown(plan: CampaignPlan, directory: Path, report: str | None, failed: dict[str, str]) -> str:
    """Where the results of a campaign are (the raw tree, the report page: a URL, through the report server
    when one serves it, else file://) and which cells are not ok."""
    lines = [f"# Campaign {plan.campaign_id}", "", f"Raw artifacts: `{directory}`"]
    if report and report.startswith("file:"):
        lines.append(f"Report: [{report}]({report})  (a page on the worker's disk; it renders offline)")
    elif report:
        lines.append(f"Report: [{report}]({report})")
    if failed:
        lines += ["", "## Cells not ok", *[f"- `{cell}`: {status}" for cell, status in failed.items()]]
    return "\n".join(lines)
