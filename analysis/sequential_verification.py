"""Verification that launches until it decides (issue 41): after `min` launches of every arm, the verification
campaign launches one more repeat block at a time (its arms in the plan's random order) until the verdict at
every load it watches is decided, or `max` launches per arm are spent.

A verdict is analysis.recommend.judge's, on the interval of the schedule's throughput over plain (per-repeat
ratios paired within a block, as analysis.adaptive_repeats reads them from the raw cells, no warehouse needed):
confirmed, "faster, below the minimum effect" and refuted are decided; inconclusive is not.

Stopping at the first look whose intervals decide is a sequential test, and naive 95% intervals then decide
too often where the truth sits on a verdict's edge (1, 1 + min_effect, 1 - tolerance): with looks at 2 to 6
launches they decided wrongly in up to 8% of simulated verifications (a single look: 2.5%) and covered the
truth as little as 84% of the time (benchmarks/sequential_verification.py, docs/analysis.md "Sequential
verification"). The correction that simulation chose: the rule's intervals, for stopping AND for the decision
it reports, split the campaign's alpha over the looks after the first (`look_confidence`: 98.75% for 2 to 6
launches at 95%); at two launches t(1) makes every interval so wide that the first look hardly ever decides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from analysis.adaptive_repeats import Comparison, Observations
from analysis.adaptive_repeats import report_confidence as adaptive_report_confidence
from analysis.recommend import judge, k_at
from analysis.stats import ratio_interval
from artifacts.documents.decisions import INCONCLUSIVE
from experiments.spec import ExperimentSpec, UntilDecided


class DecideRule(Protocol):
    """What the rule reads of its settings (experiments.spec.UntilDecided, or anything with these fields)."""

    @property
    def min(self) -> int: ...
    @property
    def max(self) -> int: ...


def look_confidence(rule: DecideRule, confidence: float = 0.95) -> float:
    """The level of the rule's intervals, for stopping and for the decision it reports: the campaign's alpha
    (1 - confidence) split evenly over the looks after the first (a Bonferroni split; looks at min..max
    launches). 2 to 6 launches at 95%: 98.75%, chosen by benchmarks/sequential_verification.py, where it is
    the widest split whose coverage stays at or above 93% and whose wrong verdicts of either kind stay at or
    under the 2.5% of one look at 95%; min = max (no look): the confidence itself."""
    looks_after_first = max(1, rule.max - rule.min)
    return 1.0 - (1.0 - confidence) / looks_after_first


def report_confidence(spec: Mapping[str, Any], confidence: float = 0.95) -> float:
    """The level a campaign's intervals are reported and judged at, from its recorded spec: look_confidence
    for a verification that launched until it decided (`repeats: {until: decided, ...}`), else
    analysis.adaptive_repeats.report_confidence (the adaptive rule's level, or `confidence`)."""
    repeats = spec.get("repeats")
    if isinstance(repeats, Mapping) and repeats.get("until") == "decided":
        return look_confidence(UntilDecided.model_validate(repeats), confidence)
    return adaptive_report_confidence(spec, confidence)


@dataclass(frozen=True)
class LoadVerdict:
    """judge's verdict on one comparison (a watched variant against plain at one workload and load)."""

    comparison: Comparison
    k: int  # the variant's depth at this load (0: speculation off, judged as "no worse than plain")
    n: int  # paired repeats
    estimate: float | None  # geometric mean of the ratios (None: no pair yet)
    low: float | None
    high: float | None
    outcome: str  # artifacts.documents.decisions.OUTCOMES
    reason: str


@dataclass(frozen=True)
class VerdictDecision:
    """The rule's answer after `repeats_done` blocks: stop launching or not, and why."""

    stop: bool
    repeats_done: int
    confidence: float  # the level of the intervals judged (look_confidence)
    verdicts: tuple[LoadVerdict, ...]
    undecided: tuple[Comparison, ...]
    reason: str

    def record(self) -> dict[str, Any]:
        """The decision as the campaign's run record keeps it."""
        return {
            "repeats_done": self.repeats_done,
            "stop": self.stop,
            "confidence": self.confidence,
            "undecided": [asdict(c) for c in self.undecided],
            "outcomes": {_name(v.comparison): v.outcome for v in self.verdicts},
            "reason": self.reason,
        }


_CLOSED = re.compile(r"^c(\d+)$")  # artifacts.ids.load_label of a closed loop


def claimed_depths(
    variants: Iterable[Any], comparisons: Iterable[Comparison], watched: Collection[str] = ()
) -> dict[Comparison, int]:
    """The depth each watched variant runs at each closed-loop comparison's load (its k_schedule's range, or
    its fixed k), from the spec's variants (anything with name, k and k_schedule). `watched`: the variant
    names whose verdicts decide (empty: every variant); open-loop loads have no batch size to claim for."""
    by_name = {v.name: v for v in variants}
    out = {}
    for comparison in comparisons:
        variant = by_name.get(comparison.variant)
        closed = _CLOSED.match(comparison.load)
        if variant is None or closed is None or (watched and comparison.variant not in watched):
            continue
        out[comparison] = k_at(variant.k_schedule, int(closed.group(1)), int(variant.k or 0))
    return out


def load_verdicts(
    observations: Observations,
    depths: Mapping[Comparison, int],
    *,
    min_effect: float,
    tolerance: float,
    confidence: float,
) -> list[LoadVerdict]:
    """judge's verdict on every comparison in `depths`, from its paired ratios so far at `confidence`."""
    out = []
    for comparison in sorted(depths):
        k = depths[comparison]
        by_repeat = observations.ratios.get(comparison, {})
        ratios = [by_repeat[r] for r in sorted(by_repeat) if by_repeat[r] > 0 and math.isfinite(by_repeat[r])]
        if not ratios:
            out.append(
                LoadVerdict(comparison, k, 0, None, None, None, INCONCLUSIVE, "no pair with plain yet")
            )
            continue
        interval = ratio_interval(ratios, confidence=confidence)
        low, high = (interval.low, interval.high) if interval.n >= 2 else (None, None)
        outcome, reason = judge(k, interval.estimate, low, high, interval.n, tolerance, min_effect)
        out.append(LoadVerdict(comparison, k, interval.n, interval.estimate, low, high, outcome, reason))
    return out


def should_stop(outcomes: Collection[str], done: int, rule: DecideRule) -> bool:
    """The stop rule itself: never before `min` blocks, always at `max`, in between once no watched verdict is
    inconclusive (benchmarks/sequential_verification.py applies exactly this)."""
    if done >= rule.max:
        return True
    if done < rule.min:
        return False
    return INCONCLUSIVE not in outcomes


def until_decided(
    verdicts: list[LoadVerdict], done: int, rule: DecideRule, confidence: float
) -> VerdictDecision:
    """should_stop on these verdicts, with the reason in words (naming the undecided loads)."""
    undecided = tuple(v.comparison for v in verdicts if v.outcome == INCONCLUSIVE)
    stop = should_stop([v.outcome for v in verdicts], done, rule)
    named = ", ".join(_name(c) for c in undecided[:4]) + (" ..." if len(undecided) > 4 else "")
    state = (
        f"{len(undecided)} of {len(verdicts)} loads undecided ({named})"
        if undecided
        else f"every load decided ({len(verdicts)})"
    )
    if done >= rule.max:
        reason = f"{done} launches per arm: the maximum ({rule.max}) is spent; {state}"
    elif done < rule.min:
        reason = f"{done} of at least {rule.min} launches per arm; {state}"
    elif stop:
        reason = f"{done} launches per arm: {state} at {confidence:.1%}"
    else:
        reason = f"{done} launches per arm: {state} at {confidence:.1%}; launching another block"
    return VerdictDecision(stop, done, confidence, tuple(verdicts), undecided, reason)


def verification_decision(
    observations: Observations,
    rule: DecideRule,
    depths: Mapping[Comparison, int],
    *,
    min_effect: float,
    tolerance: float,
    confidence: float = 0.95,
) -> VerdictDecision:
    """Whether a verification stops launching after `observations.repeats_done` blocks: judge every watched
    load (`depths`, claimed_depths) at look_confidence and stop once all are decided (should_stop)."""
    level = look_confidence(rule, confidence)
    verdicts = load_verdicts(
        observations, depths, min_effect=min_effect, tolerance=tolerance, confidence=level
    )
    return until_decided(verdicts, observations.repeats_done, rule, level)


def _name(comparison: Comparison) -> str:
    return f"{comparison.variant} {comparison.workload} {comparison.load}"


def spec_decision(observations: Observations, spec: ExperimentSpec, rule: UntilDecided) -> VerdictDecision:
    """verification_decision for a campaign of this spec (experiments.spec.ExperimentSpec): its variants'
    depths at each load, and its `decision` section's min_effect and guardrail (the off ranges' tolerance),
    as the decision (analysis.verification) will judge them."""
    depths = claimed_depths(spec.variants, observations.ratios, rule.variants)
    rule_of = spec.decision
    return verification_decision(
        observations, rule, depths, min_effect=rule_of.min_effect, tolerance=rule_of.guardrail
    )
