"""Is the campaign itself trustworthy? Its A/A gap, its repeats' spread and its client's own error.

- **A/A gap** (`validity.aa_control: true` adds `<plain>-aa`, a second plain arm launched the same way): per
  repeat, the geometric mean over workloads and loads of the control's output throughput over plain's (v_aa);
  the campaign's figure is the geometric mean over repeats with its t interval (analysis.stats.ratio_interval),
  and its gap |figure - 1|. Two arms that must be equal differ by this much: a smaller speedup is noise.
- **Repeat spread**: plain's cells (workload x load x setting) with two or more repeats; per cell
  (max - min) / mean of the repeats' output throughput; the campaign's figure is the median over cells.
- **Client error**: the client calibration stored at the campaign's start (tasks/load/calibration.py,
  warehouse table client_calibrations): TTFT and TPOT error p50/p99 and send lag against the emulator. It is
  flagged when its p99 exceeds a tenth of the smallest TTFT or TPOT difference between a variant and plain that
  the campaign reports (a difference that small is within reach of the client's own error).

- **Contention**: each cell records the shares of the host's CPU that its own process tree (client, load
  workers, a local engine) and every other process used while it measured (tasks/metrics/host_load.py). A
  cell during which others took more than `validity.max_other_cpu_share` (10%) did not measure the engine
  alone: such cells make the campaign at best inconclusive, and invalid when they are a quarter or more of
  its cells. (The tests' campaign in CI, whose A/A gap was 34.9%, ran beside the suite's second pytest
  worker: docs/analysis.md, "Contention", has the measurement.)
- **Steal**: each cell also records the share of the host's CPU the hypervisor gave to other tenants of a
  virtual machine's host while it measured (kept apart from other processes). More than
  `validity.max_steal_share` (5%) during a cell: the same verdict effect as contention.
- **Load reached**: each cell records its achieved concurrency (measured requests in flight, time-weighted
  over its window: tasks/metrics/summary.py). A closed-loop cell below `validity.min_concurrency_fill` (90%)
  of its C did not put the load it names on the engine: the same verdict effect as contention. Open-loop
  cells are not judged here; cells measured before these figures were recorded are skipped, not counted.

- **Provenance**: the two arms of each comparison (a variant or the A/A arm, and its plain) must have run
  the same target weights, engine packages, overlays and hardware (deployment.json's `provenance`,
  v_cells.target_digest, env_digest, overlays_digest, hardware); a difference, or a fact recorded for one
  arm only, makes the campaign at best inconclusive, naming the field.

- **Confounds**: each speculative deployment's effective engine configuration (what the engine stated it runs
  with: tasks/metrics/engine_config.py) against its plain baseline's of the same repeat and setting; every
  setting beyond speculation that differs is listed (`v_speedup.confounded` flags the pairs).

The verdict reads the A/A figure's interval (pooled from history where the warehouse has earlier campaigns
launched the same way: analysis.history), against the limit L = `validity.max_aa_gap` (1.5%):
- **valid**: the A/A interval lies within 1 +- L (the two plain arms are shown to agree to within L);
- **invalid**: the A/A point gap exceeds L, or the interval lies wholly beyond 1 +- L, or the repeat spread
  exceeds `validity.max_repeat_spread` (10%);
- **inconclusive**: the interval straddles the limit, or there is none (one repeat and no history), or no
  A/A arm was launched (the gap is unknown). An unknown figure never makes a campaign valid.
`reasons` says which, in words. The decision rule recommends nothing from an invalid campaign
(analysis.decision); an inconclusive one is reported as such beside every recommendation.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import polars as pl

from analysis.data import AnalysisSettings, CampaignData
from analysis.stats import Interval, has_interval, interval_label, pooled_ratio_interval
from artifacts.documents import EffectiveEngineConfig
from experiments.spec import ValiditySpec

VALIDITY_SCHEMA = {
    "aa_variant": pl.String,
    "aa_estimate": pl.Float64,
    "aa_low": pl.Float64,
    "aa_high": pl.Float64,
    "aa_gap": pl.Float64,
    "aa_repeats": pl.Int32,
    "aa_interval": pl.String,
    "max_aa_gap": pl.Float64,
    "repeat_spread": pl.Float64,
    "repeat_spread_cells": pl.Int32,
    "max_repeat_spread": pl.Float64,
    "client_ttft_error_p50_s": pl.Float64,
    "client_ttft_error_p99_s": pl.Float64,
    "client_tpot_error_p50_s": pl.Float64,
    "client_tpot_error_p99_s": pl.Float64,
    "client_send_lag_p99_s": pl.Float64,
    "client_concurrency": pl.Int32,
    "smallest_latency_difference_s": pl.Float64,
    "client_error_ok": pl.Boolean,
    "valid": pl.Boolean,
    "reasons": pl.String,
    "verdict": pl.String,
}


def validity_rules(data: CampaignData) -> ValiditySpec:
    return ValiditySpec.model_validate(data.spec.get("validity") or {})


def aa_figure(data: CampaignData, settings: AnalysisSettings) -> tuple[str | None, Any]:
    """(the control's variant, its throughput-ratio Interval over repeats), (None, None) without A/A cells."""
    pairs = data.aa.filter(pl.col("throughput_speedup").is_not_null() & (pl.col("throughput_speedup") > 0))
    if pairs.is_empty():
        return None, None
    per_repeat = (
        pairs.group_by("repeat")
        .agg(pl.col("throughput_speedup").log().mean().exp().alias("ratio"))
        .sort("repeat")["ratio"]
        .to_list()
    )
    return str(pairs["variant"][0]), pooled_ratio_interval(
        per_repeat, data.history, confidence=settings.confidence
    )


def repeat_spread(data: CampaignData) -> tuple[float | None, int]:
    """(median over plain cells of (max - min) / mean output throughput across repeats, cells counted)."""
    plain = data.cells.filter((pl.col("method") == "none") & pl.col("output_throughput_tok_s").is_not_null())
    if plain.is_empty():
        return None, 0
    spreads = (
        plain.group_by("variant", "workload", "load_label")
        .agg(
            pl.len().alias("n"),
            (
                (pl.col("output_throughput_tok_s").max() - pl.col("output_throughput_tok_s").min())
                / pl.col("output_throughput_tok_s").mean()
            ).alias("spread"),
        )
        .filter(pl.col("n") >= 2)
    )
    if spreads.is_empty():
        return None, 0
    return float(np.median(spreads["spread"].to_numpy())), spreads.height


def smallest_latency_difference(data: CampaignData) -> float | None:
    """The smallest |variant - plain| TTFT p50 or TPOT p50 difference over the campaign's speedup pairs."""
    if data.speedup.is_empty():
        return None
    differences = data.speedup.select(
        (pl.col("ttft_p50_s") - pl.col("baseline_ttft_p50_s")).abs().alias("ttft"),
        (pl.col("tpot_p50_s") - pl.col("baseline_tpot_p50_s")).abs().alias("tpot"),
    )
    values = [v for column in ("ttft", "tpot") for v in differences[column].drop_nulls().to_list() if v > 0]
    return min(values) if values else None


def contended_cells(data: CampaignData, limit: float) -> tuple[int, int, float, str] | None:
    """(cells over the limit, cells with a figure, the largest share, the worst cell's id) where other
    processes took more than `limit` of the host's CPU during some cell; None when none did (or no cell
    recorded it: measured before it was recorded, or not on Linux)."""
    frame = data.host_load
    if frame.is_empty() or "host_other_share" not in frame.columns:
        return None
    known = frame.filter(pl.col("host_other_share").is_not_null())
    over = known.filter(pl.col("host_other_share") > limit).sort("host_other_share", descending=True)
    if over.is_empty():
        return None
    worst = over.row(0, named=True)
    return over.height, known.height, float(worst["host_other_share"]), str(worst["cell_id"])


def steal_heavy_cells(data: CampaignData, limit: float) -> tuple[int, int, float, str] | None:
    """(cells over the limit, cells with a figure, the largest share, the worst cell's id) where the hypervisor
    stole more than `limit` of the host's CPU during some cell; None when it never did (or no cell recorded it)."""
    frame = data.host_load
    if frame.is_empty() or "host_steal_share" not in frame.columns:
        return None
    known = frame.filter(pl.col("host_steal_share").is_not_null())
    over = known.filter(pl.col("host_steal_share") > limit).sort("host_steal_share", descending=True)
    if over.is_empty():
        return None
    worst = over.row(0, named=True)
    return over.height, known.height, float(worst["host_steal_share"]), str(worst["cell_id"])


def underfilled_cells(data: CampaignData, min_fill: float) -> tuple[int, int, float, int, str] | None:
    """(closed-loop cells whose achieved concurrency is below `min_fill` of their C, closed-loop cells with a
    figure, the worst cell's achieved concurrency, its C, its id); None when every such cell reached its load
    (open-loop cells have no C to reach; a cell without the figure predates it)."""
    frame = data.host_load
    if frame.is_empty() or "achieved_concurrency" not in frame.columns:
        return None
    known = frame.filter(
        (pl.col("load_mode") == "closed")
        & pl.col("concurrency").is_not_null()
        & pl.col("achieved_concurrency").is_not_null()
    ).with_columns((pl.col("achieved_concurrency") / pl.col("concurrency")).alias("fill"))
    under = known.filter(pl.col("fill") < min_fill).sort("fill")
    if under.is_empty():
        return None
    worst = under.row(0, named=True)
    return (
        under.height,
        known.height,
        float(worst["achieved_concurrency"]),
        int(worst["concurrency"]),
        str(worst["cell_id"]),
    )


def _cells_reason(verdict: str, reasons: list[str], failing: int, known: int, text: str) -> str:
    """Add the reason for cells that failed a per-cell check; the verdict it leaves: invalid when they are a
    quarter or more of the cells with a figure, else at best inconclusive."""
    if failing / known >= 0.25:
        reasons.append(f"invalid: {text}")
        return "invalid"
    reasons.append(f"inconclusive: {text}")
    return "inconclusive" if verdict == "valid" else verdict


def _cell_reasons(data: CampaignData, rules: ValiditySpec, verdict: str, reasons: list[str]) -> str:
    """The per-cell checks (contention, steal, load reached): their reasons, and the verdict they leave."""
    contention = contended_cells(data, rules.max_other_cpu_share)
    if contention is not None:
        n, known, share, cell = contention
        text = (
            f"other processes used more than {rules.max_other_cpu_share:.0%} of the host's CPU during "
            f"{n} of {known} cells (up to {share:.0%}: {cell}): the engine did not have the machine to itself"
        )
        verdict = _cells_reason(verdict, reasons, n, known, text)
    steal = steal_heavy_cells(data, rules.max_steal_share)
    if steal is not None:
        n, known, share, cell = steal
        text = (
            f"the hypervisor stole more than {rules.max_steal_share:.0%} of the host's CPU during {n} of "
            f"{known} cells (up to {share:.1%}: {cell}): other tenants of the virtual machine's host took "
            "time from the engine"
        )
        verdict = _cells_reason(verdict, reasons, n, known, text)
    underfilled = underfilled_cells(data, rules.min_concurrency_fill)
    if underfilled is not None:
        n, known, achieved, concurrency, cell = underfilled
        text = (
            f"{n} of {known} closed-loop cells reached less than {rules.min_concurrency_fill:.0%} of their "
            f"concurrency (worst: cell {cell} reached {achieved:.1f} of its C={concurrency} in flight "
            f"({achieved / concurrency:.0%})): the engine did not get the load they name"
        )
        verdict = _cells_reason(verdict, reasons, n, known, text)
    return verdict


def split_blocks(data: CampaignData) -> dict[int, list[str]]:
    """Repeat blocks whose launches ran on more than one node (repeat -> nodes): their speedups are not
    paired within a node (a relaunch that the cluster placed elsewhere, or `sml`, which cannot pin one)."""
    frame = data.deployments
    if frame.is_empty() or "node" not in frame.columns:
        return {}
    blocks = (
        frame.filter(
            pl.col("control").is_null() & pl.col("node").is_not_null() & pl.col("repeat").is_not_null()
        )
        .group_by("repeat")
        .agg(pl.col("node").unique().sort())
        .filter(pl.col("node").list.len() > 1)
        .sort("repeat")
    )
    return {int(r): list(nodes) for r, nodes in blocks.iter_rows()}


# What can change a result besides the variant (v_cells, migration 0018; tasks/launch/provenance.py).
PROVENANCE_FIELDS = {
    "target_digest": "the target's weights, config and tokenizer",
    "env_digest": "the engine's package lock",
    "overlays_digest": "the vLLM overlays applied",
    "hardware": "the CPU/GPU model and driver",
}


def provenance_mismatches(data: CampaignData) -> list[tuple[str, str, str, list[int]]]:
    """(variant, its plain, field, repeats) wherever the two arms of one comparison (a speculative or A/A
    cell and its plain cell, v_against_plain.provenance_differences) ran on deployments that differ in a
    provenance field, or where only one of them recorded it."""
    frames = [
        f.select("variant", "baseline_variant", "repeat", "provenance_differences")
        for f in (data.speedup, data.aa)
        if not f.is_empty() and "provenance_differences" in f.columns
    ]
    if not frames:
        return []
    found = (
        pl.concat(frames)
        .explode("provenance_differences")
        .drop_nulls("provenance_differences")
        .group_by("variant", "baseline_variant", "provenance_differences")
        .agg(pl.col("repeat").unique().sort())
        .sort("variant", "provenance_differences")
    )
    return [(v, b, name, list(repeats)) for v, b, name, repeats in found.iter_rows()]


def validity_table(data: CampaignData, settings: AnalysisSettings | None = None) -> pl.DataFrame:
    """One row: the campaign's A/A figure, repeat spread, client error and whether it is valid (and why not)."""
    settings = settings or AnalysisSettings()
    rules = validity_rules(data)
    aa_variant, aa = aa_figure(data, settings)
    drawn = aa is not None and has_interval(aa)
    gap = abs(aa.estimate - 1.0) if aa is not None else None
    verdict, why = aa_verdict(aa, rules.max_aa_gap)
    reasons: list[str] = [why]
    spread, spread_cells = repeat_spread(data)
    if spread is None:
        reasons.append("fewer than 2 repeats of plain: the repeat spread is unknown")
    elif spread > rules.max_repeat_spread:
        verdict = "invalid"
        reasons.append(f"invalid: repeat spread {spread:.1%} > {rules.max_repeat_spread:.0%}")
    verdict = _cell_reasons(data, rules, verdict, reasons)
    for repeat, nodes in split_blocks(data).items():
        reasons.append(
            f"repeat block r{repeat} ran on {len(nodes)} nodes ({', '.join(nodes)}): its speedups mix nodes"
        )
    for variant, baseline, name, repeats in provenance_mismatches(data):
        verdict = "inconclusive" if verdict == "valid" else verdict
        reasons.append(
            f"inconclusive: {variant} and {baseline} ran with a different {name} ({PROVENANCE_FIELDS[name]}) in "
            f"{', '.join(f'r{r}' for r in repeats)}: the comparison includes that difference"
        )
    client = data.client_calibration
    smallest = smallest_latency_difference(data)
    client_ok = None
    if client:
        worst = max(
            (v for v in (client.get("ttft_error_p99_s"), client.get("tpot_error_p99_s")) if v is not None),
            default=None,
        )
        if worst is not None and smallest is not None:
            client_ok = abs(worst) <= smallest / 10
            if not client_ok:
                reasons.append(
                    f"the client's p99 error {worst * 1e3:.2f} ms exceeds a tenth of the smallest latency "
                    f"difference reported ({smallest * 1e3:.2f} ms): read such differences as noise"
                )
    else:
        reasons.append("no client calibration stored for this campaign")
    # the reasons for the verdict first (a report's one line, an alert's summary), the rest after
    reasons.sort(key=lambda reason: not reason.startswith(f"{verdict}:"))
    row = {
        "aa_variant": aa_variant,
        "aa_estimate": aa.estimate if aa is not None else None,
        "aa_low": aa.low if drawn else None,
        "aa_high": aa.high if drawn else None,
        "aa_gap": gap,
        "aa_repeats": aa.n if aa is not None else 0,
        "aa_interval": interval_label(aa) if aa is not None else "no A/A control",
        "max_aa_gap": rules.max_aa_gap,
        "repeat_spread": spread,
        "repeat_spread_cells": spread_cells,
        "max_repeat_spread": rules.max_repeat_spread,
        "client_ttft_error_p50_s": client.get("ttft_error_p50_s") if client else None,
        "client_ttft_error_p99_s": client.get("ttft_error_p99_s") if client else None,
        "client_tpot_error_p50_s": client.get("tpot_error_p50_s") if client else None,
        "client_tpot_error_p99_s": client.get("tpot_error_p99_s") if client else None,
        "client_send_lag_p99_s": client.get("send_lag_p99_s") if client else None,
        "client_concurrency": client.get("concurrency") if client else None,
        "smallest_latency_difference_s": smallest,
        "client_error_ok": client_ok,
        "valid": verdict == "valid",
        "verdict": verdict,
        "reasons": "; ".join(reasons),
    }
    return pl.DataFrame([row], schema=VALIDITY_SCHEMA)


def aa_verdict(aa: Interval | None, limit: float) -> tuple[str, str]:
    """(valid | invalid | inconclusive, why in words) from the A/A figure's interval against 1 +- limit."""
    if aa is None:
        return "inconclusive", (
            "inconclusive: no A/A control (validity.aa_control: true adds one), so the A/A gap is unknown"
        )
    gap = abs(aa.estimate - 1.0)
    label = interval_label(aa)
    if not has_interval(aa):
        if gap > limit:
            return "invalid", f"invalid: A/A gap {gap:.1%} > {limit:.1%} ({label})"
        return "inconclusive", (
            f"inconclusive: A/A gap {gap:.1%} has no interval ({label}): two identical plain arms are not "
            f"shown to agree within {limit:.1%}"
        )
    shown = f"A/A {aa.estimate:.3f} [{aa.low:.3f}, {aa.high:.3f}] ({label})"
    if gap > limit:
        return "invalid", f"invalid: A/A gap {gap:.1%} > {limit:.1%}: {shown}"
    if aa.low > 1.0 + limit or aa.high < 1.0 - limit:
        return "invalid", f"invalid: the whole A/A interval lies beyond 1 +- {limit:.1%}: {shown}"
    if aa.low >= 1.0 - limit and aa.high <= 1.0 + limit:
        return "valid", f"valid: the A/A interval lies within 1 +- {limit:.1%}: {shown}"
    return "inconclusive", (
        f"inconclusive: the A/A interval straddles the {limit:.1%} limit: {shown}; more repeats (or history "
        "from earlier campaigns launched the same way) narrow it"
    )


def verdict_of(validity: pl.DataFrame) -> str | None:
    """The campaign's validity verdict (None: not judged)."""
    if validity.is_empty() or "verdict" not in validity.columns:
        return None
    return str(validity["verdict"][0])


def is_valid(validity: pl.DataFrame) -> bool | None:
    """For the decision rule: False when invalid, True when valid, None when inconclusive or not judged
    (which does not block a recommendation; the report says the campaign is inconclusive beside it)."""
    verdict = verdict_of(validity)
    return None if verdict in (None, "inconclusive") else verdict == "valid"


CONFOUND_SCHEMA = {
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int32,
    "baseline_variant": pl.String,
    "repeat": pl.Int32,
    "differences": pl.List(pl.String),
    "sources": pl.String,
}


def _config(value: str | None) -> EffectiveEngineConfig | None:
    return EffectiveEngineConfig.model_validate(json.loads(value)) if value else None


def confound_table(data: CampaignData) -> pl.DataFrame:
    """Per speculative deployment (the latest launch of each variant and repeat): the settings beyond
    speculation in which its engine ran differently from plain's deployment of the same repeat and setting."""
    d = data.deployments
    if d.is_empty() or "effective_config" not in d.columns:
        return pl.DataFrame(schema=CONFOUND_SCHEMA)
    arms = d.filter(pl.col("control").is_null() | (pl.col("control") == 0)) if "control" in d.columns else d
    latest = arms.sort("deployment_id").group_by("variant", "repeat", maintain_order=True).last()
    plains = {
        (data.setting_of(r["variant"]), r["repeat"]): r
        for r in latest.filter(pl.col("method") == "none").iter_rows(named=True)
    }
    rows = []
    for r in latest.filter(pl.col("method") != "none").sort("variant", "repeat").iter_rows(named=True):
        plain = plains.get((data.setting_of(r["variant"]), r["repeat"]))
        mine, base = _config(r["effective_config"]), _config(plain["effective_config"] if plain else None)
        if mine is None or base is None:
            continue
        rows.append(
            {
                "variant": r["variant"],
                "method": r["method"],
                "k": r["k"],
                "baseline_variant": plain["variant"],
                "repeat": r["repeat"],
                "differences": base.differences(mine),
                "sources": " / ".join(["+".join(base.sources), "+".join(mine.sources)]),
            }
        )
    return pl.DataFrame(rows, schema=CONFOUND_SCHEMA)
