"""Whole campaigns in a test: a small plain + n-gram spec on the test emulator, a run of the campaign flow in
this process (needs the `prefect_harness` and `home` fixtures) and warehouse queries about one campaign."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def emulated_campaign(name: str, emulator_url: str, **fields: Any) -> dict[str, Any]:
    """A spec of plain and n-gram k=3 on the emulator at `emulator_url` (endpoint launcher): one repeat, no
    capture, no A/A arm; `fields` gives the rest (workloads, load, sampling) or replaces any of these."""
    return {
        "name": name,
        "target": {"model": "emulated", "served_model_name": "emulated"},
        "variants": [
            {"name": "plain", "method": "none"},
            {"name": "ngram-k3", "method": "ngram", "k": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4},
        ],
        "capture": {"enabled": False},
        "validity": {"aa_control": False},
        "launcher": {"kind": "endpoint", "base_url": emulator_url},
        "repeats": 1,
        **fields,
    }


def run_campaign(spec_path: Path, spec: dict[str, Any] | str, **request: Any) -> dict[str, Any]:
    """Write `spec` (a mapping, or YAML text as is) to `spec_path` and run the campaign flow on it without the
    gate (`request`: CampaignRequest's other fields); a failed cell fails the test, naming it."""
    from flows.campaign import CampaignRequest, campaign

    spec_path.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec))
    result = campaign(CampaignRequest(spec_path=str(spec_path), gate=False, **request))
    assert result["failed_cells"] == {}, result
    return result


def campaign_rows(sql: str, campaign_id: str) -> list[tuple[Any, ...]]:
    """The rows of a warehouse query whose one parameter (`?`) is the campaign id."""
    from warehouse.db import reader

    with reader() as con:
        return con.execute(sql, [campaign_id]).fetchall()
