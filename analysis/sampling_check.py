"""Correctness under sampling: does a speculative arm sample the same distribution as plain?

At temperature > 0 the greedy gate (tasks/gate.py) says nothing: two samples differ anyway. Here, per prompt,
N samples of the first m generated tokens from plain and from a treatment (same sampling settings, a seed per
sample) are compared as distributions, and the same comparison of plain against a second plain launch is the
null arm: what two launches of one configuration look like.

Per prompt the statistics are the total-variation distance (TV) between the two empirical distributions of
the token at each position i < m (the marginal of the i-th generated token, conditioned on nothing) and of
the whole m-token prefix. Their null distribution comes from permutations: the two samples are pooled and
reshuffled (whole sequences move, so every position keeps its joint structure), and each statistic is
recomputed B times. One p-value per prompt combines the m + 1 statistics by the permutation distribution of
their smallest p-value (Westfall-Young min-p, with the same permutations), so looking at several positions
costs no extra level. Over prompts: Holm's step-down correction, because the verdict fails a treatment on ONE
rejected prompt, so what it must bound is the family-wise error (a lossless treatment fails with probability
at most alpha), whatever the dependence between prompts (BH bounds the expected share of false discoveries,
the wrong quantity for a yes/no verdict).

Verdict (`judge`), like the gate's: `fail` when any prompt's Holm-adjusted p-value is at most alpha (a
difference is a difference, whatever the power); `inconclusive` when the null arm (plain against plain)
itself fails, or when the check is too weak to see a real difference: the median over prompts and positions
of the critical TV (the TV a position would need to reach p <= alpha / prompts) is above `max_critical_tv`,
or fewer than `min_prompts` prompts were sampled; otherwise `pass`. Samples that ended before m tokens carry
END (-1) in the missing positions, a value like any token.

Pure functions of numpy arrays; no Prefect, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

END = -1  # the token value of a position after the sample ended (EOS before m tokens)
PREFIX = -1  # the position value of the whole-prefix statistic in result rows
DEFAULT_ALPHA = 0.05
DEFAULT_PERMUTATIONS = 2000
DEFAULT_MAX_CRITICAL_TV = 0.4
DEFAULT_MIN_PROMPTS = 4
TIE = 1e-12  # TV values are ratios of small integers: a tolerance that keeps exact ties ties

Outcome = Literal["pass", "fail", "inconclusive"]
Samples = NDArray[np.int64]  # shape (N, m): N samples of the first m token ids


def as_samples(rows: Sequence[Sequence[int]], tokens: int) -> Samples:
    """N token-id lists as an (N, tokens) array, shorter ones padded with END (they ended early)."""
    out = np.full((len(rows), tokens), END, dtype=np.int64)
    for i, row in enumerate(rows):
        kept = list(row)[:tokens]
        out[i, : len(kept)] = kept
    return out


def total_variation(a: Sequence[Any] | NDArray[Any], b: Sequence[Any] | NDArray[Any]) -> float:
    """TV distance between the empirical distributions of two samples of hashable values: half the L1
    distance of their frequency vectors, 0 (same) to 1 (disjoint supports)."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError("total_variation needs two non-empty samples")
    values, codes = np.unique(np.concatenate([np.asarray(a), np.asarray(b)]), return_inverse=True)
    fa = np.bincount(codes[: len(a)], minlength=len(values)) / len(a)
    fb = np.bincount(codes[len(a) :], minlength=len(values)) / len(b)
    # clipped: the frequencies' rounding can carry the sum of disjoint supports a last bit past 1
    return min(1.0, float(0.5 * np.abs(fa - fb).sum()))


def _codes(a: Samples, b: Samples) -> NDArray[np.int64]:
    """Per column (m positions, then the whole prefix) each pooled sample's value as a small integer code."""
    pooled = np.concatenate([a, b])
    columns = [np.unique(pooled[:, i], return_inverse=True)[1] for i in range(pooled.shape[1])]
    columns.append(np.unique(pooled, axis=0, return_inverse=True)[1].reshape(-1))
    return np.stack(columns, axis=1).astype(np.int64)


def _tv_of_labels(codes: NDArray[np.int64], labels: NDArray[np.bool_], n_a: int, n_b: int) -> NDArray[Any]:
    """TV per column for many labelings at once. codes (n, c); labels (B, n), True = side a. -> (B, c)."""
    n_rows, n_cols = codes.shape
    out = np.empty((labels.shape[0], n_cols))
    for j in range(n_cols):
        k = int(codes[:, j].max()) + 1
        onehot = np.zeros((n_rows, k))
        onehot[np.arange(n_rows), codes[:, j]] = 1.0
        count_a = labels.astype(float) @ onehot  # (B, k): per labeling, side a's count of each value
        count_b = onehot.sum(axis=0) - count_a
        out[:, j] = 0.5 * np.abs(count_a / n_a - count_b / n_b).sum(axis=1)
    return out


@dataclass(frozen=True)
class PromptTest:
    """One prompt's comparison of side a (plain) with side b (a treatment, or the second plain)."""

    prompt_id: str
    n_a: int
    n_b: int
    tv: tuple[float, ...]  # per position 0..m-1, then the whole prefix
    p_values: tuple[float, ...]  # each statistic's own permutation p-value (same order)
    critical_tv: tuple[float, ...]  # the TV each statistic needs for p <= the per-prompt Bonferroni level
    null_tv_mean: tuple[float, ...]  # the mean TV over the permutations: what chance alone gives
    p_value: float  # min-p over the statistics, by its permutation distribution (the prompt's test)
    p_holm: float | None = None  # Holm-adjusted over the arm's prompts (set by `holm`)


def permutation_test(
    prompt_id: str,
    a: Samples,
    b: Samples,
    *,
    permutations: int = DEFAULT_PERMUTATIONS,
    level: float = DEFAULT_ALPHA,
    rng: np.random.Generator,
) -> PromptTest:
    """Permutation test of "a and b are samples of one distribution" for one prompt.

    p-values follow scipy.stats.permutation_test's convention for random permutations: (1 + #{null >= observed})
    / (1 + B). `level` is the per-prompt level the critical TVs are taken at (alpha over the prompt count)."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"{prompt_id}: samples must be (N, m) arrays of one m, got {a.shape} and {b.shape}")
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"{prompt_id}: need at least 2 samples a side, got {len(a)} and {len(b)}")
    n_a, n_b = len(a), len(b)
    codes = _codes(a, b)
    observed_labels = np.zeros((1, n_a + n_b), dtype=bool)
    observed_labels[0, :n_a] = True
    shuffled = np.argsort(rng.random((permutations, n_a + n_b)), axis=1) < n_a
    stats = _tv_of_labels(codes, np.concatenate([observed_labels, shuffled]), n_a, n_b)  # (1 + B, c)
    observed, null = stats[0], stats[1:]
    # Each statistic's p-value at every row (observed first): the share of null values at least as large.
    ordered = np.sort(null, axis=0)
    at_least = np.stack(
        [permutations - np.searchsorted(ordered[:, j], stats[:, j] - TIE) for j in range(stats.shape[1])],
        axis=1,
    )  # (1 + B, c): per row and statistic, how many null values are at least as large
    p_rows = (1 + at_least) / (1 + permutations)
    min_p = p_rows.min(axis=1)
    combined = (1 + int((min_p[1:] <= min_p[0] + TIE).sum())) / (1 + permutations)
    critical = np.quantile(null, 1 - level, axis=0, method="higher")
    return PromptTest(
        prompt_id=prompt_id,
        n_a=n_a,
        n_b=n_b,
        tv=tuple(float(x) for x in observed),
        p_values=tuple(float(x) for x in p_rows[0]),
        critical_tv=tuple(float(x) for x in critical),
        null_tv_mean=tuple(float(x) for x in null.mean(axis=0)),
        p_value=float(combined),
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (monotone, capped at 1), in the input's order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for step, i in enumerate(order):
        running = max(running, min(1.0, (m - step) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class ArmResult:
    """Every prompt of one comparison (plain vs a treatment, or plain vs plain), Holm-adjusted."""

    name: str
    prompts: tuple[PromptTest, ...]
    alpha: float = DEFAULT_ALPHA

    @property
    def rejected(self) -> list[str]:
        return [p.prompt_id for p in self.prompts if p.p_holm is not None and p.p_holm <= self.alpha]

    @property
    def min_p_holm(self) -> float:
        return min(p.p_holm for p in self.prompts if p.p_holm is not None)

    def mean_tv(self) -> list[float]:
        return [float(x) for x in np.mean([p.tv for p in self.prompts], axis=0)]

    def median_critical_tv(self, positions: int) -> float:
        """The median over prompts and positions (not the prefix) of the TV a position needs to be rejected."""
        return float(np.median([p.critical_tv[:positions] for p in self.prompts]))


def compare_arm(
    name: str,
    plain: dict[str, Samples],
    other: dict[str, Samples],
    *,
    alpha: float = DEFAULT_ALPHA,
    permutations: int = DEFAULT_PERMUTATIONS,
    seed: int = 0,
) -> ArmResult:
    """Test every prompt both sides sampled; Holm over those prompts. Prompts only on one side are refused."""
    if set(plain) != set(other):
        missing = sorted(set(plain) ^ set(other))
        raise ValueError(
            f"{name}: the two sides sampled different prompts (only on one side: {missing[:10]})"
        )
    if not plain:
        raise ValueError(f"{name}: no prompts to compare")
    rng = np.random.default_rng(seed)
    level = alpha / len(plain)
    tests = [
        permutation_test(pid, plain[pid], other[pid], permutations=permutations, level=level, rng=rng)
        for pid in sorted(plain)
    ]
    adjusted = holm([t.p_value for t in tests])
    tests = [PromptTest(**{**asdict(t), "p_holm": p}) for t, p in zip(tests, adjusted, strict=True)]
    return ArmResult(name=name, prompts=tuple(tests), alpha=alpha)


@dataclass(frozen=True)
class Rule:
    alpha: float = DEFAULT_ALPHA
    permutations: int = DEFAULT_PERMUTATIONS
    max_critical_tv: float = DEFAULT_MAX_CRITICAL_TV
    min_prompts: int = DEFAULT_MIN_PROMPTS
    correction: str = "holm"
    statistic: str = "TV per position and of the whole prefix; per-prompt min-p over them (Westfall-Young)"


@dataclass(frozen=True)
class Verdict:
    treatment: str
    outcome: Outcome
    claim: str
    rule: Rule
    tokens: int
    samples: int  # per prompt and arm (the smallest)
    treatment_arm: ArmResult
    null_arm: ArmResult
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"


def judge(
    treatment: str,
    plain: dict[str, Samples],
    treated: dict[str, Samples],
    plain_again: dict[str, Samples],
    *,
    rule: Rule | None = None,
    seed: int = 0,
) -> Verdict:
    """The verdict for one treatment: plain against it, judged beside plain against a second plain launch."""
    rule = rule or Rule()
    if not 0 < rule.alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {rule.alpha}")
    options = {"alpha": rule.alpha, "permutations": rule.permutations}
    arm = compare_arm(treatment, plain, treated, seed=seed, **options)
    null = compare_arm("plain-vs-plain", plain, plain_again, seed=seed + 1, **options)
    tokens = next(iter(plain.values())).shape[1]
    samples = min(min(len(s) for s in side.values()) for side in (plain, treated, plain_again))
    critical = arm.median_critical_tv(tokens)
    reasons: list[str] = []
    if null.rejected:
        reasons.append(
            f"the null arm failed: plain and a second plain launch differ on {len(null.rejected)} prompt(s) "
            f"({', '.join(null.rejected[:5])}), so a difference cannot be blamed on speculation"
        )
    if critical > rule.max_critical_tv:
        reasons.append(
            f"too little power: with {samples} samples a position needs a TV of {critical:.2f} (median critical "
            f"TV) to be rejected, above the {rule.max_critical_tv:.2f} the rule asks to detect; draw more samples"
        )
    if len(plain) < rule.min_prompts:
        reasons.append(f"only {len(plain)} prompt(s) sampled (the rule asks for {rule.min_prompts})")
    if arm.rejected and not null.rejected:
        outcome: Outcome = "fail"
    elif reasons or arm.rejected:
        outcome = "inconclusive"
    else:
        outcome = "pass"
    claim = _claim(outcome, treatment, arm, null, rule, samples, tokens, reasons)
    return Verdict(treatment, outcome, claim, rule, tokens, samples, arm, null, tuple(reasons))


def _claim(
    outcome: Outcome,
    treatment: str,
    arm: ArmResult,
    null: ArmResult,
    rule: Rule,
    samples: int,
    tokens: int,
    reasons: list[str],
) -> str:
    where = f"{len(arm.prompts)} prompts x {samples} samples x {tokens} tokens"
    tv = ", ".join(f"{x:.2f}" for x in arm.mean_tv()[:tokens])
    null_tv = ", ".join(f"{x:.2f}" for x in null.mean_tv()[:tokens])
    if outcome == "fail":
        return (
            f"{treatment} samples a different distribution than plain on {len(arm.rejected)} of "
            f"{len(arm.prompts)} prompts (Holm-adjusted p <= {rule.alpha:g}; smallest {arm.min_p_holm:.2g}); "
            f"mean TV per position {tv} against plain-vs-plain {null_tv} ({where})"
        )
    if outcome == "pass":
        return (
            f"consistent with lossless speculation under sampling: no prompt's distribution differs from plain's "
            f"(smallest Holm-adjusted p {arm.min_p_holm:.2g} > {rule.alpha:g}); mean TV per position {tv}, "
            f"plain-vs-plain {null_tv} ({where}). A statistical check, not a guarantee"
        )
    return f"not judged ({where}): " + "; ".join(reasons)


def verdict_rows(verdict: Verdict) -> list[dict[str, Any]]:
    """One row per arm, prompt and statistic (position 0..m-1, PREFIX for the whole prefix)."""
    rows = []
    for arm_name, arm in (("treatment", verdict.treatment_arm), ("null", verdict.null_arm)):
        for p in arm.prompts:
            for j, tv in enumerate(p.tv):
                rows.append(
                    {
                        "arm": arm_name,
                        "prompt_id": p.prompt_id,
                        "position": PREFIX if j == verdict.tokens else j,
                        "tv": tv,
                        "p_value": p.p_values[j],
                        "critical_tv": p.critical_tv[j],
                        "null_tv_mean": p.null_tv_mean[j],
                        "prompt_p_value": p.p_value,
                        "prompt_p_holm": p.p_holm,
                        "rejected": p.p_holm is not None and p.p_holm <= arm.alpha,
                    }
                )
    return rows
