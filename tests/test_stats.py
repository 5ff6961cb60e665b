"""analysis.stats on planted data with known answers: zero-width answers are no evidence, the pooled launch
variance interval against its textbook formula, the prompt-clustered bootstrap against a planted
population."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.stats import (
    NO_INTERVAL,
    Interval,
    LaunchVariance,
    cluster_ratio_interval,
    has_interval,
    interval_label,
    mean_interval,
    paired_cluster_ratio_interval,
    per_repeat_interval,
    pooled_ratio_interval,
    pooled_variance,
    ratio_interval,
    ratio_of_means_interval,
)

HISTORY = LaunchVariance(variance=0.0016, df=20, campaigns=14, first="2026-11-30", last="2026-12-04")
POOLED = "t on log-ratios, launch variance pooled from 14 campaigns (2026-11-30..2026-12-04) 95%"


# ------------------------------------------------------------------------------- zero width is no evidence


def test_all_repeats_equal_is_no_interval() -> None:
    for interval in (
        ratio_interval([1.1, 1.1, 1.1]),
        mean_interval([0.5, 0.5]),
        per_repeat_interval(4.0, [2.0, 2.0, 2.0]),
        ratio_of_means_interval([100.0, 100.0], [90.0, 90.0]),
    ):
        assert interval.low == interval.high == interval.estimate
        assert interval.n >= 2
        assert not has_interval(interval)
        assert interval.method == "degenerate (all repeats equal): no interval"
        assert interval_label(interval) == f"n={interval.n}, degenerate (all repeats equal): no interval"


def test_a_single_point_is_no_interval() -> None:
    for interval in (ratio_interval([1.2]), mean_interval([3.0]), per_repeat_interval(4.0, [4.0])):
        assert interval.low == interval.high == interval.estimate
        assert not has_interval(interval)
        assert interval.method == "point (fewer than 2 repeats): no interval"
        assert interval_label(interval) == NO_INTERVAL == "n=1, no interval"


def test_has_interval_wants_finite_bounds_and_positive_width_whatever_n() -> None:
    assert not has_interval(Interval(1.0, 1.0, 1.0, 5, "planted"))
    assert not has_interval(Interval(1.0, 1.1, 0.9, 5, "planted"))  # inverted
    assert not has_interval(Interval(1.0, math.nan, math.nan, 3, "planted"))
    assert not has_interval(Interval(1.0, 0.9, math.inf, 3, "planted"))
    assert has_interval(Interval(1.0, 0.9, 1.1, 1, "planted"))  # a pooled interval may rest on one launch
    assert has_interval(ratio_interval([1.1, 1.2]))


def test_a_repeat_that_does_not_cross_gives_nan_bounds() -> None:
    interval = per_repeat_interval(4.0, [3.0, math.inf, 5.0])
    assert math.isnan(interval.low) and math.isnan(interval.high) and not has_interval(interval)
    assert interval_label(interval) == "n=3, a repeat does not cross: no interval"


def test_labels_name_method_and_n() -> None:
    assert interval_label(ratio_interval([1.1, 1.2])) == "n=2, t on log-ratios 95%"
    assert interval_label(mean_interval([1.0, 2.0, 3.0])) == "n=3, t 95%"
    assert interval_label(pooled_ratio_interval([1.1], HISTORY)) == f"n=1, {POOLED}"
    assert interval_label(Interval(1.0, 1.0, 1.0, 4, "planted")) == "n=4, planted: no interval"


# -------------------------------------------------------------------------------- pooled launch variance


def test_pooled_variance_by_hand() -> None:
    e = math.exp
    # logs: [0, 0.1] -> sum of squares 0.005 (df 1); [0.7] adds nothing; [0, 0.2, 0.4] -> 0.08 (df 2)
    variance, df = pooled_variance([[1.0, e(0.1)], [2.0], [1.0, e(0.2), e(0.4)]])
    assert df == 3
    assert variance == pytest.approx(0.085 / 3)
    assert pooled_variance([[1.0], []]) == (pytest.approx(math.nan, nan_ok=True), 0)
    with pytest.raises(ValueError):
        pooled_variance([[1.0, -1.0]])


def test_launch_variance_label() -> None:
    assert HISTORY.label() == "launch variance pooled from 14 campaigns (2026-11-30..2026-12-04)"
    assert HISTORY.source == "plain repeats and A/A pairs"


def test_pooled_interval_is_the_textbook_formula() -> None:
    ratios = [1.10, 1.20]
    d1, d2 = math.log(1.10), math.log(1.20)
    mean = (d1 + d2) / 2
    s2 = (d1 - d2) ** 2 / 2  # sample variance of two values
    sigma2 = (20 * 0.0016 + 1 * s2 / 2) / 21
    t_21 = 2.0796138447  # t(0.975, 21 df), from tables
    half = t_21 * math.sqrt(2 * sigma2 / 2)
    interval = pooled_ratio_interval(ratios, HISTORY)
    assert interval.estimate == pytest.approx(math.exp(mean), rel=1e-12)
    assert interval.low == pytest.approx(math.exp(mean - half), rel=1e-9)
    assert interval.high == pytest.approx(math.exp(mean + half), rel=1e-9)
    assert interval.n == 2 and interval.method == POOLED
    plain = ratio_interval(ratios)  # t(0.975, 1) = 12.7
    assert has_interval(interval) and has_interval(plain)
    assert interval.high - interval.low < (plain.high - plain.low) / 3


def test_pooled_with_one_launch_gives_an_interval() -> None:
    interval = pooled_ratio_interval([1.15], HISTORY)
    half = 2.0859634473 * math.sqrt(2 * 0.0016)  # t(0.975, 20 df)
    assert interval.n == 1 and has_interval(interval)
    assert interval.estimate == pytest.approx(1.15)
    assert interval.low == pytest.approx(1.15 * math.exp(-half), rel=1e-9)
    assert interval.high == pytest.approx(1.15 * math.exp(half), rel=1e-9)


def test_pooled_without_history_is_the_t_interval() -> None:
    ratios = [1.05, 1.12, 1.09]
    assert pooled_ratio_interval(ratios, None) == ratio_interval(ratios)
    no_df = LaunchVariance(0.0016, 0, 0, "2026-12-04", "2026-12-04")
    assert pooled_ratio_interval(ratios, no_df) == ratio_interval(ratios)
    assert not has_interval(pooled_ratio_interval([1.1], None))
    with pytest.raises(ValueError):
        pooled_ratio_interval([1.1, -1.0], HISTORY)


# ------------------------------------------------------------------------- prompt-clustered bootstrap


def test_cluster_estimate_is_offset_plus_ratio_of_sums() -> None:
    accepted = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    steps = [10.0, 10.0, 20.0, 5.0, 10.0, 15.0]
    prompts = ["a", "b", "c", "d", "e", "f"]
    interval = cluster_ratio_interval(accepted, steps, prompts, offset=1.0)
    assert interval.estimate == pytest.approx(1 + 23 / 70)
    assert interval.n == 6 and has_interval(interval)
    assert interval.low < interval.estimate < interval.high
    assert interval.low >= 1.0  # a ratio of non-negative sums
    assert (
        interval_label(interval) == "n=6, bootstrap over 6 prompts, symmetric bootstrap-t (jackknife SE) 95%"
    )


def test_cluster_identical_ratios_give_no_interval() -> None:
    steps = np.array([10.0, 40.0, 25.0, 5.0, 100.0, 60.0])
    interval = cluster_ratio_interval(0.6 * steps, steps, [f"p{i}" for i in range(6)], offset=1.0)
    assert interval.low == interval.high == interval.estimate == pytest.approx(1.6)
    assert not has_interval(interval)
    assert interval_label(interval) == "n=6, every one of the prompts has the same ratio: no interval"


def test_cluster_too_few_prompts_or_no_denominator() -> None:
    few = cluster_ratio_interval([1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 6.0, 9.0], ["a", "b", "c", "d"])
    assert not has_interval(few) and few.low == few.high == few.estimate
    assert interval_label(few) == "n=4, fewer than 5 prompts: no interval"
    empty = cluster_ratio_interval([0.0] * 6, [0.0] * 6, list("abcdef"))
    assert not has_interval(empty) and empty.method == "zero denominator: no interval"


def test_cluster_greedy_launches_are_clustered_by_prompt() -> None:
    """Greedy: every launch repeats the same per-prompt counts, so the launches add no information: the
    interval over 8 prompts x 3 identical launches equals the one over the 8 prompts alone."""
    rng = np.random.default_rng(3)
    accepted, steps = rng.integers(0, 60, 8).astype(float), rng.integers(30, 90, 8).astype(float)
    prompts = [f"p{i}" for i in range(8)]
    one = cluster_ratio_interval(accepted, steps, prompts, offset=1.0, seed=7)
    three = cluster_ratio_interval(
        np.tile(accepted, 3), np.tile(steps, 3), prompts * 3, ["l0"] * 8 + ["l1"] * 8 + ["l2"] * 8, offset=1.0
    )
    assert three.n == 8
    assert (
        three.method
        == "two-stage bootstrap over 3 launches then 8 prompts, symmetric bootstrap-t (jackknife SE) 95%"
    )
    assert three.estimate == pytest.approx(one.estimate)
    assert (three.high - three.low) == pytest.approx(one.high - one.low, rel=0.25)
    two = cluster_ratio_interval(
        np.tile(accepted, 2), np.tile(steps, 2), prompts * 2, ["l0"] * 8 + ["l1"] * 8, offset=1.0
    )
    assert two.method == "bootstrap over 8 prompts x 2 launches, symmetric bootstrap-t (jackknife SE) 95%"


def planted_prompts(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt (accepted, verify steps): acceptance probability ~ Beta(2, 2), 20-199 steps, k = 3 drafts,
    accepted per step a geometric truncated at 3. E[accepted per step] = E[a + a^2 + a^3] = 0.5 + 0.3 + 0.2,
    independent of the steps, so the population MAL is exactly 2."""
    alpha = rng.beta(2.0, 2.0, count)
    steps = rng.integers(20, 200, count)
    per_step = np.minimum(rng.geometric(1 - np.repeat(alpha, steps)) - 1, 3)
    accepted = np.add.reduceat(per_step, np.cumsum(steps) - steps)
    return accepted.astype(float), steps.astype(float)


def test_cluster_bootstrap_covers_a_planted_population() -> None:
    rng = np.random.default_rng(2026)
    hits, widths = 0, []
    for trial in range(100):
        accepted, steps = planted_prompts(rng, 24)
        interval = cluster_ratio_interval(
            accepted, steps, [f"p{i}" for i in range(24)], offset=1.0, resamples=1000, seed=trial
        )
        assert has_interval(interval) and interval.n == 24
        hits += interval.low <= 2.0 <= interval.high
        widths.append(interval.high - interval.low)
    assert hits >= 85
    assert 0.4 < float(np.median(widths)) < 0.9  # about 4 standard errors (0.14), not the range of MAL (1-4)


# -------------------------------------------------------------- paired prompt-clustered bootstrap (new / old)


def two_heads(rng: np.random.Generator, count: int, effect: float, spread: float):
    """Per prompt (new accepted, new steps, old accepted, old steps): the old head's MAL from 1.3 to 3.5, the
    new head's that times effect x a prompt's own log-normal factor (sd `spread`), 20-400 steps a head."""
    mal_old = rng.uniform(1.3, 3.5, count)
    mal_new = mal_old * effect * np.exp(rng.normal(0.0, spread, count))
    steps_old = rng.integers(20, 400, count).astype(float)
    steps_new = np.round(steps_old * mal_old / mal_new)  # the same output tokens in fewer steps
    return (mal_new - 1) * steps_new, steps_new, (mal_old - 1) * steps_old, steps_old


def test_paired_estimate_is_the_ratio_of_pooled_ratios_over_shared_prompts() -> None:
    new_acc, new_steps = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 7.0], [10.0, 10.0, 20.0, 5.0, 10.0, 15.0, 99.0]
    old_acc, old_steps = [2.0, 1.0, 3.0, 2.0, 4.0, 6.0], [10.0, 12.0, 20.0, 5.0, 11.0, 15.0]
    new_ids, old_ids = list("abcdefz"), list("abcdef")  # z: new head only, left out
    interval = paired_cluster_ratio_interval(
        new_acc, new_steps, new_ids, old_acc, old_steps, old_ids, offset=1.0
    )
    assert interval.estimate == pytest.approx((1 + 23 / 70) / (1 + 18 / 73))
    assert interval.n == 6 and has_interval(interval)
    assert interval.low < interval.estimate < interval.high
    assert interval_label(interval) == (
        "n=6, bootstrap over 6 prompts paired new/old, symmetric bootstrap-t (jackknife SE) 95%"
    )
    # rows of a prompt from several repeats are summed per prompt: greedy repeats change nothing
    thrice = paired_cluster_ratio_interval(
        new_acc * 3, new_steps * 3, new_ids * 3, old_acc * 3, old_steps * 3, old_ids * 3, offset=1.0
    )
    assert (thrice.estimate, thrice.low, thrice.high, thrice.n) == pytest.approx(
        (interval.estimate, interval.low, interval.high, 6)
    )


def test_paired_no_interval_cases() -> None:
    steps = np.array([10.0, 40.0, 25.0, 5.0, 100.0, 60.0])
    ids = [f"p{i}" for i in range(6)]
    # every prompt 8% better on the MAL alike (greedy, no prompt spread): nothing uncertain to bound
    same = paired_cluster_ratio_interval(0.728 * steps, steps, ids, 0.6 * steps, steps, ids, offset=1.0)
    assert same.estimate == pytest.approx(1.08) and same.low == same.high == same.estimate
    assert interval_label(same) == "n=6, every one of the prompts has the same ratio: no interval"
    few = paired_cluster_ratio_interval(
        [1.0, 2.0, 3.0, 4.0], [5.0] * 4, list("abcd"), [1.0, 1.0, 3.0, 1.0], [5.0] * 4, list("abcd")
    )
    assert not has_interval(few) and few.n == 4
    assert few.method == "fewer than 5 prompts on both sides: no interval"
    # six prompts each, but only four of them on both sides
    apart = paired_cluster_ratio_interval(
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [5.0] * 6, list("abcdef"), [1.0] * 6, [5.0] * 6, list("abcdxy")
    )
    assert not has_interval(apart) and apart.n == 4
    zero = paired_cluster_ratio_interval([0.0] * 6, [1.0] * 6, ids, [0.0] * 6, [1.0] * 6, ids)
    assert not has_interval(zero) and zero.method == "zero denominator: no interval"
    with pytest.raises(ValueError, match="scale"):
        paired_cluster_ratio_interval([1.0], [1.0], ["a"], [1.0], [1.0], ["a"], scale="sqrt")
    # one prompt carries the new head's gain: the ratio scale would reach below 0, so the log scale's interval
    # (positive bounds: the warehouse wants them) is given, and named
    heavy = paired_cluster_ratio_interval(
        [0.1, 0.2, 9.0, 0.1, 0.3, 0.2], [1.0] * 6, ids, [1.0, 1.2, 0.8, 1.1, 0.9, 1.0], [1.0] * 6, ids
    )
    assert heavy.estimate == pytest.approx(9.9 / 6.0) and has_interval(heavy) and 0 < heavy.low < 0.5
    assert heavy.method.endswith("symmetric bootstrap-t on logs (jackknife SE) 95%")


def test_paired_resampling_cancels_what_the_heads_share() -> None:
    """Prompts differ far more than the heads do on each (MAL 1.3-3.5; the new head 8% better with 3% spread):
    drawing the same prompts for both arms cancels the prompt-to-prompt spread, so the paired interval is a
    small fraction of the two arms' own intervals (an unpaired bootstrap would be about as wide as those)."""
    rng = np.random.default_rng(11)
    new_acc, new_steps, old_acc, old_steps = two_heads(rng, 24, 1.08, 0.03)
    ids = [f"p{i}" for i in range(24)]
    paired = paired_cluster_ratio_interval(new_acc, new_steps, ids, old_acc, old_steps, ids, offset=1.0)
    new = cluster_ratio_interval(new_acc, new_steps, ids, offset=1.0)
    old = cluster_ratio_interval(old_acc, old_steps, ids, offset=1.0)
    assert paired.estimate == pytest.approx(new.estimate / old.estimate)
    assert paired.low < 1.08 < paired.high
    relative = (paired.high - paired.low) / paired.estimate
    assert relative < 0.25 * min((new.high - new.low) / new.estimate, (old.high - old.low) / old.estimate)
    assert relative < 0.05


def test_paired_bootstrap_covers_a_planted_effect() -> None:
    rng = np.random.default_rng(2027)
    new_acc, new_steps, old_acc, old_steps = two_heads(rng, 1_000_000, 1.08, 0.05)
    truth = (1 + new_acc.sum() / new_steps.sum()) / (1 + old_acc.sum() / old_steps.sum())  # the population's
    hits, widths = 0, []
    ids = [f"p{i}" for i in range(16)]
    for trial in range(100):
        new_acc, new_steps, old_acc, old_steps = two_heads(rng, 16, 1.08, 0.05)
        interval = paired_cluster_ratio_interval(
            new_acc, new_steps, ids, old_acc, old_steps, ids, offset=1.0, resamples=1000, seed=trial
        )
        assert has_interval(interval) and interval.n == 16
        hits += interval.low <= truth <= interval.high
        widths.append(interval.high - interval.low)
    assert hits >= 85
    assert 0.03 < float(np.median(widths)) < 0.10  # about 4 standard errors of the mean factor (0.05 / 4)


def test_the_regression_interval_is_students_two_sample_t_on_logs() -> None:
    """One variance pooled over both samples (launches of one configuration): the textbook interval."""
    from analysis.stats import ratio_of_means_interval

    treatment, baseline = [1.10, 1.16, 1.04], [1.00, 0.96]
    t, b = np.log(treatment), np.log(baseline)
    pooled = (((t - t.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()) / 3
    half = stats.t.ppf(0.975, 3) * math.sqrt(pooled * (1 / 3 + 1 / 2))
    interval = ratio_of_means_interval(treatment, baseline)
    assert interval.estimate == pytest.approx(math.exp(t.mean() - b.mean()))
    assert interval.low == pytest.approx(math.exp(t.mean() - b.mean() - half))
    assert interval.high == pytest.approx(math.exp(t.mean() - b.mean() + half))
    assert interval.method.startswith("Student t on logs, pooled variance")
