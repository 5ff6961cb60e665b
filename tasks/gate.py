"""Greedy correctness: compare two captures token by token, and judge a speculative arm against controls.

`compare(a, b)` lines up two captures of one prompt set under one sampling and says, per prompt, whether
the outputs match exactly, where they first diverge, how much of the longer output they share, and how far
apart they are (normalised Levenshtein distance over token ids, or over characters when a side has no ids).

`gate(treatment, controls)` judges a treatment pair (plain vs speculative) against a control envelope: how
far captures of ONE configuration diverge from each other (a same-deployment repeat, and at least one pair
of separately launched deployments). The decision rule is written down in docs/gate.md: paired one-sided
tests over the prompts (McNemar's exact test for the exact-match rate, sign-flip permutation tests for the
shared-prefix fraction and the edit distance), each against the most divergent control.
A verdict that passes says "consistent with lossless speculation"; it never claims a proof.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rapidfuzz.distance import Levenshtein, Prefix
from scipy.stats import binomtest, permutation_test

from artifacts import ids, layout
from artifacts.documents import GateVerdictDocument
from artifacts.documents.captures import Capture, Output, load_capture
from artifacts.store import write_json_atomic
from specgauge.argv import without_options
from specgauge.errors import InputError
from specgauge.provenance import tool_facts, utc_now

GATE_FORMAT = 1
MIN_PROMPTS = 32
DEFAULT_ALPHA = 0.05
WORST_CASES = 5
EXCERPT_CHARS = 60

Unit = Literal["token", "char"]
Status = Literal["match", "diverged", "length", "failed"]
ControlKind = Literal["same_deployment", "cross_deployment"]
Outcome = Literal["consistent", "diverged", "incomplete"]

CaptureLike = Capture | Path | str


class GateRefusal(InputError):
    """The captures cannot be compared or judged as given (different prompts or sampling, no control...)."""


# --- one pair of captures ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptComparison:
    """One prompt, side a (reference, e.g. plain) against side b."""

    prompt_id: str
    workload: str
    exact: bool
    status: Status  # match; diverged; length (one output is a strict prefix of the other); failed
    reason: str | None  # why it is not an exact match, in words
    unit: Unit | None  # what positions count: token ids, or characters when a side has no ids
    len_a: int | None
    len_b: int | None
    first_divergence: int | None  # index of the first differing unit; None when exact
    common_prefix: int  # units both outputs share from the start
    prefix_fraction: float  # common_prefix / the longer output (1.0 when both are empty)
    divergence_relative: float | None  # first_divergence / the longer output; None when exact
    edit_distance: float  # Levenshtein distance / the longer output, 0..1 (1.0 when a side failed)
    completion_tokens_a: int | None
    completion_tokens_b: int | None
    completion_token_diff: int | None  # b - a, from the usage blocks
    finish_reason_a: str | None
    finish_reason_b: str | None
    excerpt_a: str | None = None  # text around the divergence, for reading worst cases
    excerpt_b: str | None = None


def _failure_text(side: str, output: Output) -> str:
    return f"{side} failed: {output.error or 'request failed'}"


def _excerpts(text_a: str, text_b: str) -> tuple[str, str]:
    start = max(Prefix.similarity(text_a, text_b) - 20, 0)
    return text_a[start : start + EXCERPT_CHARS], text_b[start : start + EXCERPT_CHARS]


def compare_outputs(a: Output, b: Output) -> PromptComparison:
    """Compare one prompt's two outputs. A failed side is a mismatch with its reason, never dropped."""
    common: dict[str, Any] = {
        "prompt_id": a.prompt_id,
        "workload": a.workload,
        "completion_tokens_a": a.completion_tokens,
        "completion_tokens_b": b.completion_tokens,
        "finish_reason_a": a.finish_reason,
        "finish_reason_b": b.finish_reason,
    }
    if not a.ok or not b.ok:
        reasons = [_failure_text(side, o) for side, o in (("a", a), ("b", b)) if not o.ok]
        return PromptComparison(
            **common,
            exact=False,
            status="failed",
            reason="; ".join(reasons),
            unit=None,
            len_a=None,
            len_b=None,
            first_divergence=0,
            common_prefix=0,
            prefix_fraction=0.0,
            divergence_relative=0.0,
            edit_distance=1.0,
            completion_token_diff=None,
        )
    seq_a: Sequence[Any]
    seq_b: Sequence[Any]
    if a.token_ids is not None and b.token_ids is not None:
        unit: Unit = "token"
        seq_a, seq_b = a.token_ids, b.token_ids
    else:
        unit = "char"
        seq_a, seq_b = a.text or "", b.text or ""
    longer = max(len(seq_a), len(seq_b))
    prefix = Prefix.similarity(seq_a, seq_b)
    exact = len(seq_a) == len(seq_b) == prefix
    diff = (
        b.completion_tokens - a.completion_tokens
        if a.completion_tokens is not None and b.completion_tokens is not None
        else None
    )
    if exact:
        status: Status = "match"
        reason = None
    elif prefix == min(len(seq_a), len(seq_b)):
        status = "length"
        shorter = "a" if len(seq_a) < len(seq_b) else "b"
        reason = (
            f"{shorter} ended after {prefix} {unit}s, the other went on to {longer} "
            f"(finish {a.finish_reason} vs {b.finish_reason})"
        )
    else:
        status = "diverged"
        reason = f"first differing {unit} at {prefix} of {longer}"
    excerpt_a = excerpt_b = None
    if not exact:
        excerpt_a, excerpt_b = _excerpts(a.text or "", b.text or "")
    return PromptComparison(
        **common,
        exact=exact,
        status=status,
        reason=reason,
        unit=unit,
        len_a=len(seq_a),
        len_b=len(seq_b),
        first_divergence=None if exact else prefix,
        common_prefix=prefix,
        prefix_fraction=1.0 if longer == 0 else prefix / longer,
        divergence_relative=None if exact else prefix / longer,
        edit_distance=float(Levenshtein.normalized_distance(seq_a, seq_b)),
        completion_token_diff=diff,
        excerpt_a=excerpt_a,
        excerpt_b=excerpt_b,
    )


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


@dataclass(frozen=True)
class Aggregate:
    """Summary of a set of prompt comparisons (all prompts, or one stratum)."""

    n: int
    exact: int
    exact_match_rate: float
    failed: int  # prompts where a side's request failed (counted as mismatches)
    diverged: int  # prompts that are not exact matches, failures included
    mean_prefix_fraction: float
    median_prefix_fraction: float
    mean_edit_distance: float
    median_first_divergence: float | None  # over diverged prompts that did not fail; units
    median_divergence_relative: float | None  # the same, as a fraction of the longer output
    mean_abs_completion_token_diff: float | None
    token_level: int  # prompts compared over token ids (the rest over characters, or failed)

    @classmethod
    def of(cls, rows: Sequence[PromptComparison]) -> Aggregate:
        if not rows:
            raise GateRefusal("nothing to aggregate: no prompts")
        n = len(rows)
        exact = sum(r.exact for r in rows)
        ran = [r for r in rows if not r.exact and r.status != "failed"]
        diffs = [abs(r.completion_token_diff) for r in rows if r.completion_token_diff is not None]
        prefix = [r.prefix_fraction for r in rows]
        return cls(
            n=n,
            exact=exact,
            exact_match_rate=exact / n,
            failed=sum(r.status == "failed" for r in rows),
            diverged=n - exact,
            mean_prefix_fraction=float(statistics.fmean(prefix)),
            median_prefix_fraction=float(statistics.median(prefix)),
            mean_edit_distance=float(statistics.fmean(r.edit_distance for r in rows)),
            median_first_divergence=_median([float(r.first_divergence or 0) for r in ran]),
            median_divergence_relative=_median([r.divergence_relative or 0.0 for r in ran]),
            mean_abs_completion_token_diff=_mean([float(d) for d in diffs]),
            token_level=sum(r.unit == "token" for r in rows),
        )


def _differences(a: Capture, b: Capture) -> list[str]:
    """Every reason the two captures cannot be compared prompt by prompt (empty: comparable)."""
    problems: list[str] = []
    if a.path.resolve() == b.path.resolve():
        problems.append(f"both sides are the same capture ({a.path})")
    sa, sb = a.sampling, b.sampling
    for key in sorted(set(sa) | set(sb)):
        if sa.get(key) != sb.get(key):
            problems.append(
                f"sampling.{key} differs: {sa.get(key)!r} ({a.path}) vs {sb.get(key)!r} ({b.path})"
            )
    if a.meta.get("max_tokens") != b.meta.get("max_tokens"):
        problems.append(
            f"max_tokens cap differs: {a.meta.get('max_tokens')!r} ({a.path}) vs {b.meta.get('max_tokens')!r} "
            f"({b.path})"
        )
    ids_a, ids_b = a.by_id(), b.by_id()
    only_a = [p for p in ids_a if p not in ids_b]
    only_b = [p for p in ids_b if p not in ids_a]
    for side, only, capture in (("a", only_a, a), ("b", only_b, b)):
        if only:
            shown = ", ".join(only[:10]) + (f" ... ({len(only)} in all)" if len(only) > 10 else "")
            problems.append(f"prompt ids only in {side} ({capture.path}): {shown}")
    hashes_a, hashes_b = a.meta.get("prompt_sha256") or {}, b.meta.get("prompt_sha256") or {}
    changed = [
        p for p in ids_a if p in ids_b and p in hashes_a and p in hashes_b and hashes_a[p] != hashes_b[p]
    ]
    if changed:
        problems.append(
            f"prompts with the same id but a different request (messages or max_tokens): {changed[:10]}"
        )
    restrata = [p for p in ids_a if p in ids_b and ids_a[p].workload != ids_b[p].workload]
    if restrata:
        problems.append(f"prompts filed under different strata: {restrata[:10]}")
    return problems


def _as_capture(capture: CaptureLike) -> Capture:
    return capture if isinstance(capture, Capture) else load_capture(capture)


@dataclass(frozen=True)
class Comparison:
    a: Capture
    b: Capture
    rows: tuple[PromptComparison, ...]

    @cached_property
    def overall(self) -> Aggregate:
        return Aggregate.of(self.rows)

    @cached_property
    def per_stratum(self) -> dict[str, Aggregate]:
        strata = sorted({r.workload for r in self.rows})
        return {s: Aggregate.of([r for r in self.rows if r.workload == s]) for s in strata}

    def by_id(self) -> dict[str, PromptComparison]:
        return {r.prompt_id: r for r in self.rows}

    def worst(self, k: int = WORST_CASES) -> list[PromptComparison]:
        """The k least similar prompts: earliest relative divergence first, then largest edit distance."""
        bad = [r for r in self.rows if not r.exact]
        return sorted(bad, key=lambda r: (r.prefix_fraction, -r.edit_distance, r.prompt_id))[:k]

    def to_json(self, *, prompts: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "a": self.a.ref(),
            "b": self.b.ref(),
            "sampling": self.a.sampling,
            "n_prompts": len(self.rows),
            "overall": asdict(self.overall),
            "per_stratum": {s: asdict(agg) for s, agg in self.per_stratum.items()},
            "worst_cases": [asdict(r) for r in self.worst()],
        }
        if prompts:
            data["prompts"] = [asdict(r) for r in self.rows]
        return data


def compare(a: CaptureLike, b: CaptureLike) -> Comparison:
    """Compare two captures prompt by prompt (a is the reference side). GateRefusal lists every reason the
    captures are not comparable: different sampling, a different prompt set, a changed prompt."""
    a, b = _as_capture(a), _as_capture(b)
    problems = _differences(a, b)
    if problems:
        raise GateRefusal("captures are not comparable:\n  " + "\n  ".join(problems))
    ids_b = b.by_id()
    rows = tuple(compare_outputs(out, ids_b[out.prompt_id]) for out in a.outputs)
    return Comparison(a=a, b=b, rows=rows)


# --- the gate ---------------------------------------------------------------------------------------------


def _configuration(capture: Capture) -> dict[str, Any]:
    """What makes two deployments 'one configuration': the variant and the engine command, less the
    address it listened on."""
    deployment = capture.meta.get("deployment") or {}
    return {
        "variant": capture.meta.get("variant"),
        "served_model_name": deployment.get("served_model_name"),
        "command": without_options(deployment.get("command") or [], ("--port", "--host"), joined=True),
    }


def control_kind(comparison: Comparison) -> ControlKind:
    """A control pair is two captures of one configuration: on one deployment, or on two launched apart."""
    a, b = comparison.a, comparison.b
    ca, cb = _configuration(a), _configuration(b)
    if ca != cb:
        fields = [k for k in ca if ca[k] != cb[k]]
        raise GateRefusal(
            f"control pair {a.path} / {b.path} is not one configuration ({', '.join(fields)} differ): a control "
            "must compare captures of the same variant and engine command"
        )
    return "same_deployment" if a.deployment_id == b.deployment_id else "cross_deployment"


@dataclass(frozen=True)
class Check:
    """One check of the treatment against the most divergent control (the envelope's edge), paired by prompt.

    value: the treatment's figure; control_value: that control's; threshold: the worst figure that still
    passes; margin: how far the threshold lies beyond the control's figure, derived from the prompt count
    and the per-prompt differences (the one-sided alpha-level critical value of the paired test)."""

    name: str
    description: str
    value: float
    threshold: float
    margin: float
    passed: bool
    p_value: float | None
    alpha: float | None
    against: str | None
    control_value: float | None = None
    higher_is_better: bool = True
    worse: int | None = None  # prompts where the treatment is worse than that control
    better: int | None = None
    per_control: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Metric:
    name: str
    description: str
    per_prompt: Callable[[PromptComparison], float]
    of: Callable[[Aggregate], float]
    higher_is_better: bool
    binary: bool  # exact sign test (McNemar) rather than a sign-flip permutation test


METRICS: tuple[Metric, ...] = (
    Metric(
        "exact_match",
        "exact-match rate; McNemar's exact test on prompts where exactly one of treatment and control matches",
        lambda r: float(r.exact),
        lambda agg: agg.exact_match_rate,
        higher_is_better=True,
        binary=True,
    ),
    Metric(
        "prefix_fraction",
        "mean shared-prefix fraction (how late outputs diverge, relative to length); paired sign-flip test",
        lambda r: r.prefix_fraction,
        lambda agg: agg.mean_prefix_fraction,
        higher_is_better=True,
        binary=False,
    ),
    Metric(
        "edit_distance",
        "mean normalised edit distance to plain; paired sign-flip test",
        lambda r: r.edit_distance,
        lambda agg: agg.mean_edit_distance,
        higher_is_better=False,
        binary=False,
    ),
)
PERMUTATIONS = 2**16  # exact below 17 differing prompts, else this many seeded random sign flips
_EPS = 1e-9


def _p_worse(worse: int, better: int) -> float:
    """One-sided exact sign test: P(at least `worse` of the discordant prompts go against the treatment)."""
    if worse + better == 0:
        return 1.0
    return float(binomtest(worse, worse + better, 0.5, alternative="greater").pvalue)


def tolerated_worse(better: int, n: int, alpha: float) -> int:
    """The most 'worse' prompts that pass at this alpha, given `better` prompts (p falls as worse grows)."""
    most = 0
    for worse in range(0, n - better + 1):
        if _p_worse(worse, better) < alpha:
            break
        most = worse
    return most


def _flip_test(differences: np.ndarray, n: int, alpha: float) -> tuple[float, float]:
    """Paired sign-flip permutation test of mean(differences) > 0 (positive: the treatment is worse).

    Under 'no worse than the control' each prompt's difference is as likely positive as negative. Returns
    the p-value and the margin: the largest mean difference that still passes at alpha."""
    nonzero = differences[np.abs(differences) > _EPS]
    if nonzero.size == 0:
        return 1.0, 0.0
    if nonzero.size == 1:  # two equally likely signs (scipy wants two or more observations)
        size = abs(float(nonzero[0])) / n
        return (0.5 if nonzero[0] > 0 else 1.0), (size if alpha <= 0.5 else -size)
    result = permutation_test(
        (nonzero,),
        lambda x, axis: np.sum(x, axis=axis) / n,
        permutation_type="samples",
        vectorized=True,
        n_resamples=PERMUTATIONS,
        alternative="greater",
        rng=np.random.default_rng(0),
    )
    null = np.sort(np.asarray(result.null_distribution))
    # tail[i] = P(null >= null[i]); the margin is the largest null value whose tail is still >= alpha
    tail = 1.0 - np.searchsorted(null, null - _EPS, side="left") / null.size
    passing = null[tail >= alpha]
    return float(result.pvalue), float(passing.max()) if passing.size else 0.0


def _check(
    metric: Metric, treatment: Comparison, controls: list[tuple[str, Comparison]], alpha: float
) -> Check:
    t_rows = treatment.by_id()
    n = len(t_rows)
    sign = 1.0 if metric.higher_is_better else -1.0
    t_value = metric.of(treatment.overall)
    results = []
    for label, control in controls:
        c_rows = control.by_id()
        # positive: the treatment is worse than the control on this prompt
        diff = np.array(
            [sign * (metric.per_prompt(c_rows[p]) - metric.per_prompt(t_rows[p])) for p in t_rows]
        )
        worse, better = int((diff > _EPS).sum()), int((diff < -_EPS).sum())
        if metric.binary:
            p_value = _p_worse(worse, better)
            margin = (tolerated_worse(better, n, alpha) - better) / n
        else:
            p_value, margin = _flip_test(diff, n, alpha)
        c_value = metric.of(control.overall)
        results.append(
            {
                "control": label,
                "control_value": c_value,
                "worse": worse,
                "better": better,
                "ties": n - worse - better,
                "p_value": p_value,
                "margin": margin,
                "threshold": c_value - sign * margin,
                "passed": p_value >= alpha,
            }
        )
    # The envelope's edge: the control against which the treatment looks least unusual.
    # Ties go to a cross-deployment control: the benign divergence the gate is calibrated on.
    edge = max(results, key=lambda r: (r["p_value"], r["margin"], "cross-deployment" in r["control"]))
    return Check(
        name=metric.name,
        description=metric.description,
        value=t_value,
        threshold=edge["threshold"],
        margin=edge["margin"],
        passed=edge["passed"],
        p_value=edge["p_value"],
        alpha=alpha,
        against=edge["control"],
        control_value=edge["control_value"],
        higher_is_better=metric.higher_is_better,
        worse=edge["worse"],
        better=edge["better"],
        per_control=results,
    )


@dataclass(frozen=True)
class Verdict:
    verdict_id: str
    campaign_id: str
    treatment_variant: str
    outcome: Outcome
    passed: bool
    claim: str
    checks: tuple[Check, ...]
    treatment: Comparison
    controls: tuple[tuple[str, ControlKind, Comparison], ...]
    alpha: float
    min_prompts: int
    forced: bool
    notes: tuple[str, ...]
    created_utc: str

    def envelope(self) -> dict[str, Any]:
        """Range of each figure over the controls: how far one configuration diverges from itself."""
        keys = (
            "exact_match_rate",
            "mean_prefix_fraction",
            "mean_edit_distance",
            "median_first_divergence",
            "median_divergence_relative",
        )
        envelope: dict[str, Any] = {}
        for key in keys:
            values = [getattr(c.overall, key) for _, _, c in self.controls]
            known = [v for v in values if v is not None]
            envelope[key] = {"min": min(known), "max": max(known)} if known else None
        return envelope

    def to_json(self) -> dict[str, Any]:
        t = self.treatment
        return {
            "format": GATE_FORMAT,
            "verdict_id": self.verdict_id,
            "campaign_id": self.campaign_id,
            "created_utc": self.created_utc,
            "tool": tool_facts(),
            "treatment_variant": self.treatment_variant,
            "outcome": self.outcome,
            "passed": self.passed,
            "claim": self.claim,
            "rule": {
                "test": "paired one-sided tests over prompts, each against the most divergent control: "
                "McNemar's exact test (exact match), sign-flip permutation tests (prefix fraction, edit "
                "distance); Bonferroni over the checks; see docs/gate.md",
                "alpha": self.alpha,
                "alpha_per_check": self.alpha / len(METRICS),
                "min_prompts": self.min_prompts,
                "forced": self.forced,
            },
            "n_prompts": len(t.rows),
            "sampling": t.a.sampling,
            "treatment": {"a": t.a.ref(), "b": t.b.ref(), "overall": asdict(t.overall)},
            "controls": [
                {"label": label, "kind": kind, "a": c.a.ref(), "b": c.b.ref(), "overall": asdict(c.overall)}
                for label, kind, c in self.controls
            ],
            "checks": [asdict(check) for check in self.checks],
            "envelope": self.envelope(),
            "per_stratum": {
                stratum: {
                    "treatment": asdict(agg),
                    "controls": {label: asdict(c.per_stratum[stratum]) for label, _, c in self.controls},
                }
                for stratum, agg in t.per_stratum.items()
            },
            "worst_cases": [
                {
                    **asdict(row),
                    "controls": {
                        label: {
                            "exact": c.by_id()[row.prompt_id].exact,
                            "status": c.by_id()[row.prompt_id].status,
                        }
                        for label, _, c in self.controls
                    },
                }
                for row in t.worst()
            ],
            "notes": list(self.notes),
        }


def verdict_id_for(treatment: Comparison, controls: Sequence[Comparison], alpha: float) -> str:
    """Same inputs, same id: a verdict is an immutable artifact, so a re-run finds it instead of rewriting."""

    def who(capture: Capture) -> list[str]:  # not the path: a moved raw tree keeps its verdict ids
        return [capture.campaign_id, capture.deployment_id, capture.capture_id]

    key = {
        "treatment": [who(treatment.a), who(treatment.b)],
        "controls": [[who(c.a), who(c.b)] for c in controls],
        "alpha": alpha,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return ids.verdict_id(treatment.b.variant_name, digest)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _claim(
    outcome: Outcome,
    variant: str,
    treatment: Comparison,
    checks: Sequence[Check],
    controls: Sequence[tuple[str, ControlKind, Comparison]],
    alpha: float,
    failed_requests: dict[str, int],
) -> str:
    t = treatment.overall
    worst_label, worst_kind, worst = min(
        controls, key=lambda c: (c[2].overall.exact_match_rate, c[1] != "cross_deployment")
    )
    w = worst.overall
    if outcome == "incomplete":
        where = ", ".join(f"{n} in {cid}" for cid, n in failed_requests.items())
        return (
            f"not judged: {sum(failed_requests.values())} capture request(s) failed ({where}); a failed request "
            f"is a mismatch of unknown cause, so re-capture before judging {variant}"
        )
    if outcome == "consistent":
        return (
            f"consistent with lossless speculation: {variant} matched plain exactly on {t.exact}/{t.n} prompts; "
            f"the most divergent control ({worst_label}, {worst_kind.replace('_', '-')}) matched on "
            f"{w.exact}/{w.n}; no check found {variant} diverging beyond the control envelope (paired tests, "
            f"family alpha {alpha:g}). A statistical check on {t.n} prompts, not a guarantee."
        )
    failed = [c for c in checks if not c.passed]
    parts = [
        f"{c.name} {c.value:.3f} against {c.control_value:.3f} for {c.against} (threshold {c.threshold:.3f}; "
        f"worse on {c.worse} prompts, better on {c.better}, p={c.p_value:.2g})"
        for c in failed
    ]
    where = (
        f"; the treatment's outputs first diverge at position {t.median_first_divergence:g} "
        f"({_pct(t.median_divergence_relative)} of the output) in the median diverged prompt"
        if t.median_first_divergence is not None
        else ""
    )
    control_where = (
        f", the control's at {w.median_first_divergence:g} ({_pct(w.median_divergence_relative)})"
        if w.median_first_divergence is not None
        else ", the control never diverged"
    )
    return (
        f"diverged beyond the control envelope: {variant} matched plain exactly on {t.exact}/{t.n} prompts "
        f"against {w.exact}/{w.n} for the most divergent control ({worst_label}); failed checks: "
        f"{'; '.join(parts)}{where}{control_where}"
    )


def gate(
    treatment: tuple[CaptureLike, CaptureLike],
    controls: Sequence[tuple[CaptureLike, CaptureLike]],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_prompts: int = MIN_PROMPTS,
    force: bool = False,
    verdict_id: str | None = None,
) -> Verdict:
    """Judge treatment (plain capture, speculative capture) against control pairs of one configuration.

    Refuses (GateRefusal) without a cross-deployment control, with fewer than `min_prompts` prompts
    (unless `force`), or when any pair differs from the treatment in prompts or sampling."""
    if not 0 < alpha < 1:
        raise GateRefusal(f"alpha must be between 0 and 1, got {alpha}")
    t_cmp = compare(*treatment)
    if not controls:
        raise GateRefusal(
            "no control pair given: the gate needs at least one pair of captures from two separately launched "
            "deployments of one configuration (a cross-deployment control), ideally with a same-deployment repeat"
        )
    c_cmps = [compare(a, b) for a, b in controls]
    labelled: list[tuple[str, ControlKind, Comparison]] = []
    for i, c in enumerate(c_cmps):
        kind = control_kind(c)
        labelled.append((f"control{i}:{kind.replace('_', '-')}", kind, c))
        # Paired tests need the treatment's prompts and sampling on every control.
        problems = _differences(t_cmp.a, c.a)
        problems = [p for p in problems if not p.startswith("both sides are the same capture")]
        if problems:
            raise GateRefusal(
                f"control {i} ({c.a.path}) does not match the treatment's prompts or sampling:\n  "
                + "\n  ".join(problems)
            )
    if not any(kind == "cross_deployment" for _, kind, _ in labelled):
        raise GateRefusal(
            "no cross-deployment control: every control pair comes from one deployment. Two separately launched "
            "deployments of one configuration can disagree on greedy outputs, so the gate needs such a pair "
            "(e.g. a second plain deployment) to know what a benign divergence looks like"
        )
    n = len(t_cmp.rows)
    if n < min_prompts and not force:
        raise GateRefusal(
            f"only {n} prompts: the gate needs at least {min_prompts} (across strata) to tell a lossy treatment "
            f"from chance; capture more prompts, or force the verdict knowing it can hardly fail"
        )
    alpha_each = alpha / len(METRICS)
    control_pairs = [(label, c) for label, _, c in labelled]
    checks = [_check(metric, t_cmp, control_pairs, alpha_each) for metric in METRICS]

    failed_requests: dict[str, int] = {}
    seen: set[Path] = set()
    for capture in (t_cmp.a, t_cmp.b, *(x for c in c_cmps for x in (c.a, c.b))):
        if capture.path.resolve() in seen:
            continue
        seen.add(capture.path.resolve())
        bad = sum(not o.ok for o in capture.outputs)
        if bad:
            failed_requests[capture.capture_id] = bad
    total_failed = sum(failed_requests.values())
    checks.append(
        Check(
            name="requests_ok",
            description="failed capture requests across the treatment and control captures (must be none)",
            value=total_failed,
            threshold=0,
            margin=0,
            passed=total_failed == 0,
            p_value=None,
            alpha=None,
            against=None,
            higher_is_better=False,
        )
    )
    if total_failed:
        outcome: Outcome = "incomplete"
    elif all(c.passed for c in checks):
        outcome = "consistent"
    else:
        outcome = "diverged"
    notes = []
    if not any(kind == "same_deployment" for _, kind, _ in labelled):
        notes.append(
            "no same-deployment repeat among the controls: the envelope does not show one deployment's own "
            "run-to-run variation"
        )
    if force and n < min_prompts:
        notes.append(f"forced with {n} prompts (< {min_prompts}): the checks have little power")
    if t_cmp.overall.token_level < n:
        notes.append(
            f"{n - t_cmp.overall.token_level} treatment prompt(s) compared over characters (no token ids) or failed"
        )
    variant = t_cmp.b.variant_name
    return Verdict(
        verdict_id=verdict_id or verdict_id_for(t_cmp, c_cmps, alpha),
        campaign_id=t_cmp.b.campaign_id,
        treatment_variant=variant,
        outcome=outcome,
        passed=outcome == "consistent",
        claim=_claim(outcome, variant, t_cmp, checks, labelled, alpha, failed_requests),
        checks=tuple(checks),
        treatment=t_cmp,
        controls=tuple(labelled),
        alpha=alpha,
        min_prompts=min_prompts,
        forced=force,
        notes=tuple(notes),
        created_utc=utc_now(),
    )


def write_verdict(verdict: Verdict, raw_campaign_dir: Path) -> Path:
    """Store the verdict as the immutable artifact RAW/<campaign>/gates/<verdict_id>.json."""
    path = layout.verdict_file(raw_campaign_dir, verdict.verdict_id)
    write_json_atomic(path, GateVerdictDocument.model_validate(verdict.to_json()))
    return path
