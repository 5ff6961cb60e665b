"""Verifying a recommendation (analysis.recommend): the spec of the campaign that launches the recommended
depth schedule beside plain and the best fixed depth, and the verdict once that campaign is in the warehouse.
Plain functions; flows/verify.py runs them around the campaign flow."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from analysis.data import AnalysisSettings, load_campaign
from analysis.recommend import Verdict, best_fixed_k, recommend, verification, verification_spec
from analysis.speedup import speedup_table
from specgauge.errors import InputError
from specgauge.settings import get_settings
from warehouse.db import reader


def specs_dir() -> Path:
    return get_settings().home / "specs"


def write_verification_spec(
    campaign_id: str | None, workload: str | None = None, db: Path | str | None = None
) -> Path:
    """Write the verification campaign's spec for one recommendation of `campaign_id` (the latest campaign
    when None) under SPECGAUGE_HOME/specs/, and return its path. The same recommendation gives the same file."""
    with reader(db) as con:
        data = load_campaign(con, campaign_id)
    settings = AnalysisSettings()
    speedups = speedup_table(data, settings)  # once: the recommendation and the best fixed depth read it
    found = [r for r in recommend(data, settings, speedups=speedups) if workload in (None, r.workload)]
    if not found:
        raise InputError(
            f"campaign {data.campaign_id}: no recommendation to verify"
            + (f" on workload {workload!r}" if workload else "")
            + " (it needs closed-loop speedups of a speculative variant)"
        )
    if len(found) > 1:
        choices = ", ".join(f"{r.family} on {r.workload}" for r in found)
        raise InputError(
            f"campaign {data.campaign_id} has {len(found)} recommendations ({choices}): give --workload"
        )
    rec = found[0]
    spec = verification_spec(data.spec, rec, best_fixed_k(rec, data, settings, speedups=speedups))
    path = specs_dir() / f"{data.campaign_id}-verify-{rec.workload}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".yaml.{os.getpid()}.tmp")
    partial.write_text(yaml.safe_dump(spec, sort_keys=False))
    partial.replace(path)  # whole or not at all
    return path


def verdicts_of(campaign_id: str, db: Path | str | None = None) -> list[Verdict]:
    with reader(db) as con:
        return verification(load_campaign(con, campaign_id), AnalysisSettings())
