"""Regression checks: a run of a spec against its reference run, with intervals, not single numbers.

For each speculative variant, workload and load, and each guarded figure (throughput speedup against
plain, TPOT p50 speedup, acceptance rate, mean acceptance length), the ratio current / reference is
estimated as the ratio of geometric means with Student's two-sample t interval (pooled variance) on the logs of the runs'
independently launched repeats. A figure REGRESSED
when the whole interval lies below 1 - tolerance: the evidence says it moved down by more than the
tolerance, not merely that one number came out lower. With one repeat on either side, or all repeats equal,
there is no interval (a point, or zero width): such a figure is NOT_JUDGED, never regressed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb
import polars as pl

from analysis.stats import has_interval, ratio_of_means_interval
from specgauge.provenance import utc_now, utc_stamp

GUARDED = ("throughput_speedup", "tpot_p50_speedup", "acceptance_rate", "mean_acceptance_length")
NOT_JUDGED = "not enough repeats to judge"  # a point or a zero-width interval: no verdict, no alert


@dataclass(frozen=True)
class Change:
    variant: str
    workload: str
    load: str
    figure: str
    reference_mean: float
    current_mean: float
    ratio: float
    low: float
    high: float
    repeats: int
    method: str
    regressed: bool
    judged: bool = True  # False: a point or a zero-width interval (NOT_JUDGED)


def figures(con: duckdb.DuckDBPyConnection, campaign_id: str) -> pl.DataFrame:
    """Per-repeat guarded figures of a campaign's speculative cells (from v_speedup)."""
    return con.sql(
        f"SELECT variant, workload, load_label, repeat, {', '.join(GUARDED)} FROM v_speedup "
        "WHERE campaign_id = $c ORDER BY variant, workload, load_label, repeat",
        params={"c": campaign_id},
    ).pl()


def compare_campaigns(
    con: duckdb.DuckDBPyConnection,
    current: str,
    reference: str,
    *,
    tolerance: float = 0.10,
    confidence: float = 0.95,
) -> list[Change]:
    cur, ref = figures(con, current), figures(con, reference)
    if cur.is_empty():
        raise ValueError(f"campaign {current} has no speculative cells paired with plain in the warehouse")
    if ref.is_empty():
        raise ValueError(f"reference campaign {reference} has no speculative cells in the warehouse")
    changes = []
    keys = ("variant", "workload", "load_label")
    for group_key, now in cur.group_by(keys, maintain_order=True):
        variant, workload, load = group_key
        before = ref.filter(
            (pl.col("variant") == variant) & (pl.col("workload") == workload) & (pl.col("load_label") == load)
        )
        if before.is_empty():
            continue
        for figure in GUARDED:
            a = now[figure].drop_nulls().to_list()
            b = before[figure].drop_nulls().to_list()
            if not a or not b:
                continue
            interval = ratio_of_means_interval(a, b, confidence=confidence)
            judged = has_interval(interval)
            changes.append(
                Change(
                    variant=variant,
                    workload=workload,
                    load=load,
                    figure=figure,
                    reference_mean=sum(b) / len(b),
                    current_mean=sum(a) / len(a),
                    ratio=interval.estimate,
                    low=interval.low,
                    high=interval.high,
                    repeats=interval.n,
                    method=interval.method,
                    regressed=judged and interval.high < 1 - tolerance,
                    judged=judged,
                )
            )
    return changes


def markdown(current: str, reference: str, changes: list[Change], tolerance: float) -> str:
    regressed = [c for c in changes if c.regressed]
    lines = [
        f"# Regression check: `{current}` against reference `{reference}`",
        "",
        f"Tolerance {tolerance:.0%}: a figure regressed when its whole interval of current/reference lies "
        f"below {1 - tolerance:.2f}.",
        "",
        f"**{len(regressed)} regressed** of {len(changes)} figures checked.",
        "",
        "| variant | workload | load | figure | reference | current | ratio [interval] | regressed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(changes, key=lambda c: (not c.regressed, c.variant, c.workload, c.load, c.figure)):
        lines.append(
            f"| {c.variant} | {c.workload} | {c.load} | {c.figure} | {c.reference_mean:.3f} | {c.current_mean:.3f}"
            f" | {c.ratio:.3f} [{c.low:.3f}, {c.high:.3f}] ({c.method}) | "
            + ("**yes**" if c.regressed else "no" if c.judged else NOT_JUDGED)
            + " |"
        )
    return "\n".join(lines)


def references_dir(home: Path) -> Path:
    """Beside the raw tree, not in it: a reference names a campaign, it is not a measurement."""
    return home / "references"


def current_reference(home: Path, spec_name: str) -> str | None:
    """The latest reference set for a spec (append-only records: setting one never rewrites another)."""
    directory = references_dir(home) / spec_name
    records = sorted(directory.glob("*.json")) if directory.exists() else []
    return json.loads(records[-1].read_text())["campaign_id"] if records else None


def set_reference(home: Path, spec_name: str, campaign_id: str, reason: str) -> Path:
    directory = references_dir(home) / spec_name
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{utc_stamp()}.json"
    path.write_text(
        json.dumps({"campaign_id": campaign_id, "reason": reason, "set_utc": utc_now()}, indent=2)
    )
    return path


def as_rows(changes: list[Change]) -> list[dict]:
    return [asdict(c) for c in changes]
