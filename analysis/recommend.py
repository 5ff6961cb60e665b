"""Which speculation config to deploy, at which load: a per-batch-size depth schedule from a campaign's
speedup surface, as vLLM's `--speculative-config` (its dynamic speculative decoding:
`num_speculative_tokens_per_batch_size`, a list of inclusive `[batch_from, batch_to, k]` ranges, k = 0 for
"off"; vllm/v1/spec_decode/dynamic/utils.py validates it).

For one drafter (a method and its checkpoint, measured at one or more depths) and one workload, at each
closed-loop concurrency C of the campaign (under a closed loop the running batch is C):
  - the best depth is the one with the highest mean throughput speedup over plain (paired per repeat, as Q1);
  - its edge over the runner-up depth is the geometric mean of the per-repeat ratios best/runner-up (both
    paired with the same plain cell of that repeat), with its t interval over repeats (log scale);
  - speculation is off (k = 0) at C when even the best depth's speedup is below 1.
Between two measured loads the boundary is their geometric mean; the last range runs to `max_batch`.
Nothing is recommended without its evidence: every range carries the speedup and edge it rests on, and
`caveats` says where the evidence is thin (one load, one repeat, intervals that do not separate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analysis.data import AnalysisSettings, CampaignData
from analysis.decision import decision_rule
from analysis.speedup import gain, paired_ratio, speedup_table
from analysis.stats import has_interval, interval_label
from artifacts.documents.decisions import BELOW_MIN_EFFECT, CONFIRMED, INCONCLUSIVE, REFUTED
from experiments.spec import Variant

MAX_BATCH = 256  # vLLM's default max_num_seqs: the last range runs to it


@dataclass(frozen=True)
class LoadChoice:
    """The depth chosen at one concurrency, and the evidence for it."""

    concurrency: int
    k: int  # 0: speculation off at this load
    best_k: int  # the best measured depth (k is 0 when even it is below 1)
    speedup: float  # best depth's throughput speedup over plain
    speedup_low: float | None  # its t interval over repeats (None with one repeat)
    speedup_high: float | None
    speedup_interval: str
    runner_up_k: int | None
    edge: float | None  # best / runner-up, mean of per-repeat ratios
    edge_low: float | None
    edge_high: float | None
    edge_interval: str
    separated: bool | None  # the edge's interval excludes 1 (None: no interval)


@dataclass
class Recommendation:
    family: str  # e.g. "draft_model models/tiny-draft"
    method: str
    workload: str
    choices: list[LoadChoice]
    schedule: list[list[int]]  # [[batch_from, batch_to, k], ...]
    config: dict[str, Any] | None  # --speculative-config; None: speculation off at every load
    caveats: list[str] = field(default_factory=list)

    def deployable_config(self) -> dict[str, Any] | None:
        """The config as vLLM takes it here: a drafter the spec names relative to the repository (the embedded
        engine's models) as an absolute path, since vLLM reads any other relative path as a hub id."""
        if self.config is None or "model" not in self.config:
            return self.config
        from experiments.plan import resolve_repo_path

        drafter = resolve_repo_path(str(self.config["model"]))
        return {**self.config, "model": str(drafter)} if drafter.exists() else self.config

    def as_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "method": self.method,
            "workload": self.workload,
            "schedule": self.schedule,
            "speculative_config": self.deployable_config(),
            "evidence": [choice.__dict__ for choice in self.choices],
            "caveats": self.caveats,
        }


def boundaries(loads: list[int], max_batch: int = MAX_BATCH) -> list[tuple[int, int]]:
    """Inclusive batch-size ranges, one per measured load (sorted), split at geometric means."""
    ranges = []
    start = 1
    for i, load in enumerate(loads):
        end = max_batch if i == len(loads) - 1 else max(load, math.floor(math.sqrt(load * loads[i + 1])))
        ranges.append((start, max(start, end)))
        start = max(start, end) + 1
    return ranges


def schedule_of(choices: list[LoadChoice], max_batch: int = MAX_BATCH) -> list[list[int]]:
    """vLLM's schedule: the choices' ranges, neighbours with the same depth merged."""
    out: list[list[int]] = []
    ranges = boundaries([c.concurrency for c in choices], max_batch)
    for (start, end), choice in zip(ranges, choices, strict=True):
        if out and out[-1][2] == choice.k:
            out[-1][1] = end
        else:
            out.append([start, end, choice.k])
    return out


def _edge(best: dict[str, Any], runner: dict[str, Any], settings: AnalysisSettings) -> tuple:
    """best / runner-up, paired per repeat (analysis.speedup.paired_ratio): estimate, low, high, label,
    whether the interval excludes 1."""
    interval = paired_ratio(
        dict(zip(best["repeats"], best["per_repeat"], strict=True)),
        dict(zip(runner["repeats"], runner["per_repeat"], strict=True)),
        settings,
    )
    if interval is None:
        return None, None, None, "no common repeat", None
    drawn = has_interval(interval)
    return (
        interval.estimate,
        interval.low if drawn else None,
        interval.high if drawn else None,
        interval_label(interval),
        interval.excludes(1.0) if drawn else None,
    )


def choose(rows: pl.DataFrame, settings: AnalysisSettings) -> list[LoadChoice]:
    """One choice per concurrency from one family's throughput speedups at one workload (closed loop)."""
    choices = []
    for (concurrency,), group in rows.sort("concurrency").group_by(["concurrency"], maintain_order=True):
        ranked = group.sort(["estimate", "k"], descending=[True, False]).to_dicts()
        best = ranked[0]
        runner = ranked[1] if len(ranked) > 1 else None
        edge = _edge(best, runner, settings) if runner else (None, None, None, "one depth measured", None)
        choices.append(
            LoadChoice(
                concurrency=int(concurrency),
                k=int(best["k"]) if best["estimate"] >= 1.0 else 0,
                best_k=int(best["k"]),
                speedup=float(best["estimate"]),
                speedup_low=best["ci_low"],
                speedup_high=best["ci_high"],
                speedup_interval=best["interval"],
                runner_up_k=int(runner["k"]) if runner else None,
                edge=edge[0],
                edge_low=edge[1],
                edge_high=edge[2],
                edge_interval=edge[3],
                separated=edge[4],
            )
        )
    return choices


def caveats_of(choices: list[LoadChoice]) -> list[str]:
    notes = []
    if len(choices) == 1:
        notes.append(
            f"one load measured (C={choices[0].concurrency}): the schedule holds that depth at every batch size"
        )
    for c in choices:
        if c.edge is None and c.runner_up_k is None:
            notes.append(f"C={c.concurrency}: one depth measured, nothing to compare it with")
        elif c.separated is None:
            notes.append(
                f"C={c.concurrency}: {c.edge_interval}: k={c.best_k} over k={c.runner_up_k} is untested"
            )
        elif not c.separated:
            notes.append(
                f"C={c.concurrency}: k={c.best_k} and k={c.runner_up_k} are not separated "
                f"(edge {c.edge:.3f}, {c.edge_interval})"
            )
        if c.k == 0:
            notes.append(
                f"C={c.concurrency}: speculation off (best depth k={c.best_k} at {c.speedup:.3f}x plain)"
            )
    if any(c.k == 0 for c in choices) and any(c.k > 0 for c in choices):
        # Measured: depth-load-verify-5aede039 ran k 0 at C=8 at 0.86x plain (docs/analysis.md).
        notes.append(
            "k 0 is not plain: a deployment with speculation configured keeps its engine settings (vLLM 0.32 "
            "disables asynchronous scheduling for n-gram and draft-model speculation, its log says) and its "
            "drafter where it drafts nothing; verify the schedule "
            "by a launch (`specgauge decide`) before trusting the off ranges"
        )
    return notes


def _families(spec: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """variant name -> (family key, that variant's spec entry) for the speculative variants."""
    out = {}
    for entry in spec.get("variants") or []:
        variant = Variant.model_validate(entry)
        if (
            variant.speculative and variant.synthetic_acceptance_length is None
        ):  # synthetic: cost, not a config
            family = " ".join(part for part in (variant.method, variant.drafter) if part)
            if variant.setting_label:  # a sweep's sampling or layout: a schedule of its own
                family += f" ({variant.setting_label})"
            out[variant.name] = (family, entry)
    return out


def recommend(
    data: CampaignData,
    settings: AnalysisSettings | None = None,
    *,
    speedups: pl.DataFrame | None = None,
    max_batch: int = MAX_BATCH,
) -> list[Recommendation]:
    """A schedule per drafter family and workload, from the campaign's closed-loop throughput speedups
    (`speedups`: analysis.speedup.speedup_table's, when the caller has it already)."""
    settings = settings or AnalysisSettings()
    table = speedup_table(data, settings) if speedups is None else speedups
    speedups = gain(table, "throughput").filter(pl.col("load_mode") == "closed")
    if speedups.is_empty():
        return []
    families = _families(data.spec)
    speedups = speedups.filter(pl.col("variant").is_in(list(families))).with_columns(
        pl.col("variant").replace_strict({v: f for v, (f, _) in families.items()}).alias("family")
    )
    out = []
    for (family, workload), rows in speedups.group_by(["family", "workload"], maintain_order=True):
        choices = choose(rows, settings)
        schedule = schedule_of(choices, max_batch)
        top = max(k for _, _, k in schedule)
        config = None
        if top > 0:
            template = next(entry for v, (f, entry) in families.items() if f == family)
            config = Variant.model_validate({**template, "k": top}).speculative_config() or {}
            if len(schedule) > 1:
                config["num_speculative_tokens_per_batch_size"] = schedule
        method = str(rows["method"][0])
        out.append(
            Recommendation(str(family), method, str(workload), choices, schedule, config, caveats_of(choices))
        )
    return sorted(out, key=lambda r: (r.workload, r.family))


def predicted_gain(rec: Recommendation) -> float:
    """What the schedule should give, from the sweep: the geometric mean over its loads of the best depth's
    speedup where it drafts, and where it is off the best depth's speedup there (below 1) rather than 1: an off
    range is not free, since k 0 keeps the drafter loaded and asynchronous scheduling off (measured 0.81-0.86x
    plain on vLLM 0.32, docs/analysis.md), and the sweep measured no k 0 cell to price it better."""
    logs = [math.log(c.speedup if c.k > 0 else min(c.speedup, 1.0)) for c in rec.choices]
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def best_family(recommendations: list[Recommendation]) -> tuple[Recommendation, list[str]]:
    """The one recommendation to deploy for a workload: one engine serves one method, so the family whose
    schedule predicts the most (`predicted_gain`; ties to the first by family name). The notes say at which
    loads another family measured higher than the chosen one's best depth."""
    if not recommendations:
        raise ValueError("no recommendation to choose from")
    chosen = max(sorted(recommendations, key=lambda r: r.family), key=predicted_gain)
    notes = []
    for choice in chosen.choices:
        rivals = [
            (other.family, c)
            for other in recommendations
            if other is not chosen
            for c in other.choices
            if c.concurrency == choice.concurrency and c.speedup > max(choice.speedup, 1.0)
        ]
        if rivals:
            family, best = max(rivals, key=lambda r: r[1].speedup)
            notes.append(
                f"C={choice.concurrency}: {family} at k={best.best_k} measured {best.speedup:.3f}x, above the "
                f"chosen {chosen.family}'s {choice.speedup:.3f}x (one deployment serves one method)"
            )
    return chosen, notes


# -- verification: the recommended schedule launched beside plain and the best fixed depth --------------------
RECOMMENDED = "recommended"


def best_fixed_k(
    rec: Recommendation,
    data: CampaignData,
    settings: AnalysisSettings | None = None,
    *,
    speedups: pl.DataFrame | None = None,
) -> int:
    """The family's depth with the highest geometric-mean throughput speedup over the recommendation's loads
    (`speedups`: speedup_table's, when the caller has it already)."""
    settings = settings or AnalysisSettings()
    families = _families(data.spec)
    table = speedup_table(data, settings) if speedups is None else speedups
    rows = gain(table, "throughput").filter(
        (pl.col("load_mode") == "closed")
        & (pl.col("workload") == rec.workload)
        & pl.col("variant").is_in([v for v, (f, _) in families.items() if f == rec.family])
    )
    scores = (
        rows.group_by("k").agg(pl.col("estimate").log().mean().alias("score")).sort("score", descending=True)
    )
    return int(scores["k"][0])


def verification_spec(
    spec: dict[str, Any],
    rec: Recommendation,
    fixed_k: int,
    repeats: int | None = None,
    gate: bool = False,
    max_launches: int | None = None,
    aa_control: bool | None = None,
) -> dict[str, Any]:
    """The campaign that checks a recommendation: plain, the best fixed depth and the recommended schedule,
    launched the same way, on the recommendation's workload at the source campaign's closed-loop loads, with
    the source's captures (the schedule must be lossless too; `gate`: capture even where the source did not)
    and launcher, and `repeats` launches of each (default: the source's). With `max_launches` above `repeats`
    it launches until it decides: after `repeats` blocks, one more at a time until every load of the schedule
    has a decided verdict, or `max_launches` per arm (experiments.spec.UntilDecided). `aa_control`: the A/A
    arm on or off regardless of the source's validity settings (None: the source's)."""
    if rec.config is None:
        raise ValueError(f"{rec.family} on {rec.workload}: nothing to verify (speculation off at every load)")
    families = _families(spec)
    template = next(entry for _, (f, entry) in families.items() if f == rec.family)
    top = int(rec.config["num_speculative_tokens"])
    # The plain variant served like the family (its sampling and layout, when the campaign swept them).
    plain = next(
        v
        for v in spec["variants"]
        if v.get("method", "none") == "none"
        and v.get("sampling") == template.get("sampling")
        and v.get("layout") == template.get("layout")
    )
    schedule = rec.config.get("num_speculative_tokens_per_batch_size")
    recommended = {**template, "name": RECOMMENDED, "k": top}
    if schedule is not None:
        recommended["k_schedule"] = schedule
    workloads = [
        {**w, "strata": [rec.workload]}
        for w in spec["workloads"]
        if w.get("strata") is None or rec.workload in w["strata"]
    ]
    load = {
        **spec["load"],
        "concurrencies": [c.concurrency for c in rec.choices],
        "rates": [],
    }
    out = {
        key: value
        for key, value in spec.items()
        if key not in ("variants", "workloads", "load", "profile", "name", "description", "layouts")
    }
    if repeats is not None:
        out["repeats"] = repeats
    if repeats is not None and max_launches is not None and max_launches > repeats:
        out["repeats"] = {"until": "decided", "min": repeats, "max": max_launches, "variants": [RECOMMENDED]}
    if gate:
        out["capture"] = {**(spec.get("capture") or {}), "enabled": True}
    if aa_control is not None:  # the verification's A/A arm, whatever the sweep ran (DecisionSpec)
        out["validity"] = {**(spec.get("validity") or {}), "aa_control": aa_control}
    # A schedule that runs the fixed depth at every measured load is that config: launching both would measure
    # one config twice (issue 41), so the fixed arm goes and the verdict has no edge over it.
    fixed = (
        []
        if all(k_at(schedule, c.concurrency, top) == fixed_k for c in rec.choices)
        else [{**template, "name": f"fixed-k{fixed_k}", "k": fixed_k}]
    )
    return {
        **out,
        "name": f"{spec['name']}-verify"[:48],
        "description": f"Verifies the recommended schedule {schedule or top} for {rec.family} on {rec.workload}.",
        "variants": [plain, *fixed, recommended],
        "workloads": workloads,
        "load": load,
    }


def k_at(schedule: list[list[int]] | tuple | None, batch: int, top: int) -> int:
    """The depth a schedule runs at `batch` (no schedule: the fixed `top`)."""
    if not schedule:
        return top
    return next((int(k) for start, end, k in schedule if int(start) <= batch <= int(end)), 0)


@dataclass(frozen=True)
class Verdict:
    """One load of a verification campaign: what the schedule claims there (k > 0: it beats plain by the
    benefit rule's `min_effect`; k = 0: it is no worse than plain, within `tolerance`, the rule's guardrail)
    and the verdict on that claim (`judge`), from the interval of its throughput over plain (paired per
    repeat). A claim is judged only on an interval of positive width from at least two launches; anything less
    is inconclusive and says why."""

    concurrency: int
    k: int
    over_plain: float
    over_plain_low: float | None
    over_plain_high: float | None
    over_plain_interval: str
    n_repeats: int
    over_fixed: float | None
    over_fixed_low: float | None
    over_fixed_high: float | None
    outcome: str  # artifacts.documents.decisions.OUTCOMES
    reason: str
    tolerance: float
    min_effect: float = 0.10

    @property
    def claim(self) -> str:
        if self.k > 0:
            return f"beats plain by at least {self.min_effect:.0%}"
        return f"no worse than plain (within {self.tolerance:.0%})"

    def text(self) -> str:
        def span(estimate: float | None, low: float | None, high: float | None) -> str:
            if estimate is None:
                return "–"
            return f"{estimate:.3g}x" + (f" [{low:.3g}, {high:.3g}]" if low is not None else " (no interval)")

        depth = f"k={self.k}" if self.k else "off"
        return (
            f"C={self.concurrency} ({depth}, claims it {self.claim}): over plain "
            f"{span(self.over_plain, self.over_plain_low, self.over_plain_high)} ({self.over_plain_interval}), "
            f"over the fixed depth {span(self.over_fixed, self.over_fixed_low, self.over_fixed_high)}: "
            f"{self.outcome.upper()}, {self.reason}"
        )


def judge(
    k: int,
    estimate: float,
    low: float | None,
    high: float | None,
    n: int,
    tolerance: float,
    min_effect: float,
) -> tuple[str, str]:
    """The verdict on one load's claim from its interval over plain, on the benefit rule (docs/decision.md).
    Where the schedule drafts: confirmed when the low bound clears 1 + min_effect, "faster, below the minimum
    effect" when it clears 1 only, refuted when the whole interval lies below 1. Where it is off: confirmed
    when the interval lies above 1 - tolerance, refuted when wholly below. Inconclusive otherwise, and always
    without an interval or with a zero-width one (a point is no evidence)."""
    if low is None or high is None or not high > low:
        why = "one launch" if n < 2 else "a zero-width interval"
        return INCONCLUSIVE, f"not enough repeats to judge: no interval ({why}, point {estimate:.3g}x)"
    if k > 0:
        threshold = 1.0 + min_effect
        if low > threshold:
            return CONFIRMED, f"the whole interval lies above {threshold:.2f} (from {low:.3g}x)"
        if low > 1.0:
            return BELOW_MIN_EFFECT, (
                f"the interval [{low:.3g}, {high:.3g}] lies above 1 but not above {threshold:.2f} "
                f"(the minimum effect {min_effect:.0%})"
            )
        if high < 1.0:
            return REFUTED, f"the whole interval lies below 1 (up to {high:.3g}x)"
        return INCONCLUSIVE, f"the interval [{low:.3g}, {high:.3g}] holds 1"
    floor = 1.0 - tolerance
    if low >= floor:
        return CONFIRMED, f"the interval lies above {floor:.2f} (from {low:.3g}x)"
    if high < floor:
        return REFUTED, (
            f"the schedule with speculation off runs below plain (up to {high:.3g}x): its engine keeps the "
            "drafter and the settings speculation needs; deploy plain in this range"
        )
    return INCONCLUSIVE, f"the interval [{low:.3g}, {high:.3g}] holds {floor:.2f}"


def overall(loads: list) -> str:
    """The decision's outcome from its loads' verdicts: refuted when any load is; confirmed when every load is;
    "faster, below the minimum effect" when every load is that or confirmed; inconclusive otherwise (or with
    no load). `loads`: anything with an `outcome` (Verdict, artifacts.documents.DecisionLoad)."""
    outcomes = {load.outcome for load in loads}
    if REFUTED in outcomes:
        return REFUTED
    if outcomes == {CONFIRMED}:
        return CONFIRMED
    if outcomes and outcomes <= {CONFIRMED, BELOW_MIN_EFFECT}:
        return BELOW_MIN_EFFECT
    return INCONCLUSIVE


def is_verification(data: CampaignData) -> bool:
    """A campaign written by verification_spec: it has the recommended schedule among its variants."""
    return any(entry.get("name") == RECOMMENDED for entry in data.spec.get("variants") or [])


def verification(
    data: CampaignData, settings: AnalysisSettings | None = None, *, speedups: pl.DataFrame | None = None
) -> list[Verdict]:
    """Per load of a verification campaign: the recommended schedule's throughput speedup over plain and its
    edge over the fixed depth (per-repeat ratios), each with its interval, and the outcome of what the
    schedule claims at that load (`judge`) (`speedups`: speedup_table's, when the caller has it already)."""
    settings = settings or AnalysisSettings()
    table = speedup_table(data, settings) if speedups is None else speedups
    rows = gain(table, "throughput").filter(pl.col("load_mode") == "closed")
    entry = next(e for e in data.spec.get("variants") or [] if e.get("name") == RECOMMENDED)
    rule = decision_rule(data)
    tolerance = rule.guardrail
    out = []
    for (concurrency,), group in rows.sort("concurrency").group_by(["concurrency"], maintain_order=True):
        by_variant = {r["variant"]: r for r in group.to_dicts()}
        rec = by_variant.get(RECOMMENDED)
        fixed = next((r for v, r in by_variant.items() if v.startswith("fixed-k")), None)
        if rec is None:
            continue
        edge = _edge(rec, fixed, settings) if fixed else (None, None, None, "", None)
        k = k_at(entry.get("k_schedule"), int(concurrency), int(entry.get("k") or 0))
        estimate, n = float(rec["estimate"]), int(rec["n_repeats"])
        outcome, reason = judge(k, estimate, rec["ci_low"], rec["ci_high"], n, tolerance, rule.min_effect)
        out.append(
            Verdict(
                int(concurrency),
                k,
                estimate,
                rec["ci_low"],
                rec["ci_high"],
                str(rec["interval"]),
                n,
                edge[0],
                edge[1],
                edge[2],
                outcome,
                reason,
                tolerance,
                rule.min_effect,
            )
        )
    return out
