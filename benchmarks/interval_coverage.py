"""How often do the report's intervals cover the truth? (issue 18, item 7; launches and acceptance added)

Simulations with planted truth, at the report's nominal 95%, one table: per method x scenario, the coverage
and the median width relative to the truth, at each n (repeats, launches or prompts). Three blocks:

repeats -- campaigns of n repeats with log-normal run-to-run noise (sigma = the standard deviation of a
repeat's log-ratio; the depth-load campaign's repeats differ by 1-15%, i.e. sigma up to about 0.1):
- `speedup` (analysis.stats.ratio_interval: geometric mean of per-repeat ratios, t on their logs), against
  the planted speedup; the same method gives the depth edges, the n-gram/draft edge and the A/A figure;
- `before`: what the report printed until issue 18 (percentile bootstrap of the mean of per-repeat ratios)
  against the mean ratio it estimates, for comparison;
- `regression` (analysis.stats.ratio_of_means_interval: ratio of geometric means of two independent samples,
  Student's two-sample t on the logs, one pooled variance; Welch's until issue 30), against the planted ratio;
- `step time` (analysis.stats.mean_interval: t on per-repeat values), against their true mean;
- `crossover` (analysis.crossover: t over the repeats' own crossings on log2(load)), against the true curve's
  crossing: speedup 1.3 - 0.15 log2(load) at loads 1-16, crossing at load 4; the share of campaigns that get
  an interval at all (every repeat must cross inside the range) is printed beside it when below 100%.

launches -- both levels of noise: a launch's output throughput is its launch effect (log-normal sigma_L) times
the mean over m = 200 requests of heavy-tailed request-level values (log-normal sigma 0.5), for plain and for
a variant 1.1x faster, each launched once per repeat (1-6 launches); the truth is 1.1:
- `t on log-ratios` (ratio_interval, n >= 2);
- `pooled` (pooled_ratio_interval) with a history drawn from the same process: 14 campaigns of 2-3 launches
  of one cell, through pooled_variance;
- `pooled, history sigma half today's`: the same history with its log deviations halved (variance / 4), the
  stress case where today's launches are noisier than the history says;
- `within-launch only`: one launch per arm, a percentile bootstrap over its requests (ratio of the two arms'
  request means), ignoring launch effects: the interval a request-level analysis would print.

acceptance -- mean acceptance length (MAL = 1 + sum accepted / sum verify steps) over prompts with
heterogeneous acceptance: per prompt an acceptance probability from Beta(2, 2), an output length from a
log-normal (median 128 tokens, sigma 1, 8-2048), verify steps = ceil(length / (1 + expected accepted per
step)), k = 3 drafts per step, accepted tokens per step a geometric truncated at 3. Greedy: every launch
identical; sampling: each launch draws its acceptances anew. The truth is the population MAL (a Monte Carlo
over 4 million prompts). Methods: the variants of analysis.stats.cluster_ratio_intervals from one set of
resamples: percentile, BCa, bootstrap-t studentized by the delta-method SE (on the ratio and on its log) or
by the jackknife SE (equal-tailed and symmetric), and the delta-method t without a bootstrap. 4 prompts is
below the product's min_clusters (5); drawn here all the same (min_clusters=2).

paired -- the ratio of two heads' MAL on the same prompts (adaptation confirmation: new / old,
analysis.stats.paired_cluster_ratio_interval). Per prompt the old head's acceptance probability from Beta(2, 2),
the new head's logit(alpha_new) = logit(alpha_old) + delta + tau z, z ~ N(0, 1) (a planted effect delta with
prompt-level heterogeneity tau; correlated across heads through alpha_old); one output length per prompt for
both heads (greedy and lossless: the same tokens), log-normal as above, verify steps per head as above. Greedy:
3 repeats identical (their rows summed per prompt). The truth is the ratio of the two population MALs (Monte
Carlo over 2 million prompts). Scenarios: delta 0.28, tau 0.3 (about +8%); delta 0, tau 0.5 (no effect on
average, each prompt moves); delta 0.3, tau 0.8 (heterogeneous). Both scales of the symmetric bootstrap-t
(jackknife SE): on log(ratio) and on the ratio. min_clusters=2 here, so 4 prompts are drawn too.

Under 2-3 minutes on 2 cores at --trials 2000 (the paired block about 50 s; the block timings are printed;
--blocks runs a subset, e.g. --blocks paired).

    .venv/bin/python benchmarks/interval_coverage.py [--trials 2000] [--resamples 999] [--blocks paired]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
from scipy import stats

from analysis.crossover import crossover_interval
from analysis.stats import (
    CLUSTER_VARIANT,
    CLUSTER_VARIANTS,
    PAIRED_SCALE,
    PAIRED_SCALES,
    Interval,
    LaunchVariance,
    cluster_ratio_intervals,
    has_interval,
    mean_interval,
    paired_cluster_ratio_interval,
    pooled_ratio_interval,
    pooled_variance,
    ratio_interval,
    ratio_of_means_interval,
)

LOADS = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
CURVE = 1.3 - 0.15 * np.log2(LOADS)  # crosses 1 at load 4
TRUE_CROSSING = 4.0
TARGET, CEILING = 0.93, 0.97  # the coverage accepted for a nominal 95% (binomial se about 0.5%)

REQUESTS = 200  # per launch
REQUEST_SIGMA = 0.5  # log-normal request-level spread
HISTORY_CAMPAIGNS = 14
DRAFTS = 3  # k


def bootstrap_mean(values: np.ndarray, confidence: float, resamples: int, seed: int) -> tuple[float, float]:
    """The percentile bootstrap of the mean the report used before issue 18."""
    if np.allclose(values, values[0]):
        return float(values[0]), float(values[0])
    result = stats.bootstrap(
        (values,),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


class Tally:
    """Coverage and relative widths of one method in one scenario at one n."""

    def __init__(self) -> None:
        self.trials = 0
        self.hits = 0
        self.widths: list[float] = []

    def add(self, interval: Interval | tuple[float, float] | None, truth: float) -> None:
        self.trials += 1
        if interval is None:
            return
        low, high = (interval.low, interval.high) if isinstance(interval, Interval) else interval
        if isinstance(interval, Interval) and not has_interval(interval):
            return
        self.hits += low <= truth <= high
        self.widths.append((high - low) / truth)

    @property
    def coverage(self) -> float:
        return self.hits / len(self.widths) if self.widths else math.nan

    def cell(self) -> str:
        if not self.widths:
            return "-"
        drawn = len(self.widths) / self.trials
        text = f"{self.coverage:.1%} / {float(np.median(self.widths)):.3f}"
        return text + (f" ({drawn:.0%} drawn)" if drawn < 0.995 else "")


Row = tuple[str, str, str, dict[int, Tally]]  # method, in use, scenario, n -> tally


def tallies(ns: tuple[int, ...]) -> dict[int, Tally]:
    return {n: Tally() for n in ns}


# --------------------------------------------------------------------------------------------- repeats


def repeats_block(args: argparse.Namespace, rng: np.random.Generator) -> list[Row]:
    c = args.confidence
    ns = (2, 3, 5, 10)
    rows: list[Row] = []
    for sigma in (0.03, 0.10):
        t = {k: tallies(ns) for k in ("speedup", "before", "regression", "step", "crossover")}
        mean_ratio = args.speedup * math.exp(sigma**2 / 2)
        for n in ns:
            for trial in range(args.trials):
                ratios = args.speedup * np.exp(rng.normal(0.0, sigma, n))
                t["speedup"][n].add(ratio_interval(ratios, confidence=c), args.speedup)
                t["before"][n].add(bootstrap_mean(ratios, c, args.resamples, trial), mean_ratio)
                baseline = 100 * np.exp(rng.normal(0.0, sigma, n))
                treatment = 100 * args.speedup * np.exp(rng.normal(0.0, sigma, n))
                t["regression"][n].add(
                    ratio_of_means_interval(treatment, baseline, confidence=c), args.speedup
                )
                steps = 0.01 * np.exp(rng.normal(0.0, sigma, n))
                t["step"][n].add(mean_interval(steps, confidence=c), 0.01 * math.exp(sigma**2 / 2))
                matrix = CURVE * np.exp(rng.normal(0.0, sigma, (n, len(LOADS))))
                t["crossover"][n].add(crossover_interval(LOADS, matrix, c), TRUE_CROSSING)
        scenario = f"sigma {sigma:g}"
        rows += [
            ("speedup: t on log-ratios (ratio_interval)", "yes", scenario, t["speedup"]),
            ("before: percentile bootstrap of the mean", "no (until issue 18)", scenario, t["before"]),
            ("regression: Student t on logs, pooled variance", "yes", scenario, t["regression"]),
            ("step time: t (mean_interval)", "yes", scenario, t["step"]),
            ("crossover: t over per-repeat crossings", "yes", scenario, t["crossover"]),
        ]
    return rows


# -------------------------------------------------------------------------------------------- launches


def launch_values(rng: np.random.Generator, sigma_l: float, shape: tuple[int, ...]) -> np.ndarray:
    """Per-launch throughput: a launch effect times the mean of REQUESTS heavy-tailed request values
    (mean 1)."""
    requests = rng.lognormal(-(REQUEST_SIGMA**2) / 2, REQUEST_SIGMA, (*shape, REQUESTS))
    return np.exp(rng.normal(0.0, sigma_l, shape)) * requests.mean(-1)


def history(rng: np.random.Generator, sigma_l: float) -> LaunchVariance:
    groups = [launch_values(rng, sigma_l, (int(rng.integers(2, 4)),)) for _ in range(HISTORY_CAMPAIGNS)]
    variance, df = pooled_variance(groups)
    return LaunchVariance(variance, df, HISTORY_CAMPAIGNS, "2026-11-20", "2026-12-03")


def within_launch(
    rng: np.random.Generator, sigma_l: float, speedup: float, confidence: float, resamples: int
):
    """One launch per arm; a percentile bootstrap over the requests of each (ratio of the request means)."""
    arms = []
    for scale in (1.0, speedup):
        requests = scale * rng.lognormal(-(REQUEST_SIGMA**2) / 2, REQUEST_SIGMA, REQUESTS)
        requests *= math.exp(rng.normal(0.0, sigma_l))
        arms.append(requests[rng.integers(0, REQUESTS, (resamples, REQUESTS))].mean(1))
    low, high = np.quantile(arms[1] / arms[0], [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def launches_block(args: argparse.Namespace, rng: np.random.Generator) -> list[Row]:
    c = args.confidence
    ns = (1, 2, 3, 4, 6)
    rows: list[Row] = []
    for sigma_l in (0.03, 0.10):
        t = {k: tallies(ns) for k in ("t", "pooled", "stress", "within")}
        for n in ns:
            for _ in range(args.trials):
                ratios = launch_values(rng, sigma_l, (n,)) * args.speedup / launch_values(rng, sigma_l, (n,))
                t["t"][n].add(ratio_interval(ratios, confidence=c), args.speedup)
                past = history(rng, sigma_l)
                t["pooled"][n].add(pooled_ratio_interval(ratios, past, confidence=c), args.speedup)
                half = LaunchVariance(past.variance / 4, past.df, past.campaigns, past.first, past.last)
                t["stress"][n].add(pooled_ratio_interval(ratios, half, confidence=c), args.speedup)
                if n == 1:
                    t["within"][n].add(
                        within_launch(rng, sigma_l, args.speedup, c, args.resamples), args.speedup
                    )
        scenario = f"sigma_L {sigma_l:g}"
        rows += [
            ("t on per-launch log-ratios (ratio_interval)", "yes", scenario, t["t"]),
            ("pooled, history of the same sigma (pooled_ratio_interval)", "yes", scenario, t["pooled"]),
            ("pooled, history sigma half today's", "stress", scenario, t["stress"]),
            ("within-launch only: bootstrap over requests", "no", scenario, t["within"]),
        ]
    return rows


# ------------------------------------------------------------------------------------------ acceptance


def expected_accepted(alpha: np.ndarray) -> np.ndarray:
    """E[accepted per step] with k drafts and a geometric truncated at k: sum_j alpha^j."""
    return sum(alpha**j for j in range(1, DRAFTS + 1))


def prompts(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(acceptance probability, verify steps) of `count` prompts."""
    alpha = np.minimum(rng.beta(2.0, 2.0, count), 1 - 1e-9)
    length = np.clip(np.exp(rng.normal(math.log(128), 1.0, count)), 8, 2048)
    return alpha, np.ceil(length / (1 + expected_accepted(alpha)))


def population_mal(rng: np.random.Generator, count: int = 4_000_000) -> float:
    alpha, steps = prompts(rng, count)
    return 1 + float((steps * expected_accepted(alpha)).sum() / steps.sum())


def accepted(rng: np.random.Generator, alpha: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Per prompt, accepted tokens summed over its steps (each a geometric truncated at DRAFTS)."""
    per_step = np.repeat(alpha, steps.astype(int))
    draws = np.minimum(rng.geometric(1 - per_step) - 1, DRAFTS)
    ends = np.cumsum(steps.astype(int))
    return np.add.reduceat(draws, ends - steps.astype(int)).astype(float)


def acceptance_block(args: argparse.Namespace, rng: np.random.Generator) -> list[Row]:
    truth = population_mal(np.random.default_rng(12345))
    print(f"population MAL (Monte Carlo, 4e6 prompts): {truth:.4f}")
    ns = (4, 6, 8, 16, 32, 48)
    rows: list[Row] = []
    for scenario, launches, greedy in (
        ("greedy, 1 launch", 1, True),
        ("sampling, 2 launches", 2, False),
        ("sampling, 3 launches (two-stage)", 3, False),
    ):
        t = {v: tallies(ns) for v in CLUSTER_VARIANTS}
        for n in ns:
            for trial in range(args.trials):
                alpha, steps = prompts(rng, n)
                first = accepted(rng, alpha, steps)
                acc = np.concatenate(
                    [first if greedy or i == 0 else accepted(rng, alpha, steps) for i in range(launches)]
                )
                found = cluster_ratio_intervals(
                    acc,
                    np.tile(steps, launches),
                    np.tile(np.arange(n), launches),
                    np.repeat(np.arange(launches), n),
                    offset=1.0,
                    confidence=args.confidence,
                    resamples=args.resamples,
                    seed=trial,
                    min_clusters=2,
                )
                for variant in CLUSTER_VARIANTS:
                    t[variant][n].add(found if isinstance(found, Interval) else found[variant], truth)
        for variant in CLUSTER_VARIANTS:
            in_use = "yes" if variant == CLUSTER_VARIANT else "no"
            rows.append((f"MAL: cluster bootstrap, {variant}", in_use, scenario, t[variant]))
    return rows


# ---------------------------------------------------------------------------------------------- paired

PAIRED_NS = (4, 5, 6, 8, 12, 16, 32, 48)
PAIRED_REPEATS = 3  # greedy: identical


def two_heads(
    rng: np.random.Generator, count: int, delta: float, tau: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(alpha_old, steps_old, alpha_new, steps_new) of `count` prompts: one output length per prompt for both
    heads (greedy, lossless), the new head's acceptance shifted on the logit scale by delta + tau z."""
    old = np.clip(rng.beta(2.0, 2.0, count), 1e-9, 1 - 1e-9)
    new = np.clip(
        1 / (1 + np.exp(-(np.log(old / (1 - old)) + delta + tau * rng.normal(size=count)))), 0, 1 - 1e-9
    )
    length = np.clip(np.exp(rng.normal(math.log(128), 1.0, count)), 8, 2048)
    return (
        old,
        np.ceil(length / (1 + expected_accepted(old))),
        new,
        np.ceil(length / (1 + expected_accepted(new))),
    )


def population_mal_ratio(rng: np.random.Generator, delta: float, tau: float, count: int = 2_000_000) -> float:
    old, steps_old, new, steps_new = two_heads(rng, count, delta, tau)
    mal_old = 1 + float((steps_old * expected_accepted(old)).sum() / steps_old.sum())
    mal_new = 1 + float((steps_new * expected_accepted(new)).sum() / steps_new.sum())
    return mal_new / mal_old


def paired_block(args: argparse.Namespace, rng: np.random.Generator) -> list[Row]:
    rows: list[Row] = []
    for delta, tau in ((0.28, 0.3), (0.0, 0.5), (0.3, 0.8)):
        truth = population_mal_ratio(np.random.default_rng(12345), delta, tau)
        scenario = f"delta {delta:g}, tau {tau:g} (truth {truth:.4f}), greedy x{PAIRED_REPEATS}"
        print(f"paired {scenario}")
        t = {scale: tallies(PAIRED_NS) for scale in PAIRED_SCALES}
        for n in PAIRED_NS:
            labels = np.tile(np.arange(n).astype(str), PAIRED_REPEATS)
            for trial in range(args.trials):
                old, steps_old, new, steps_new = two_heads(rng, n, delta, tau)
                acc_old, acc_new = accepted(rng, old, steps_old), accepted(rng, new, steps_new)
                for scale in PAIRED_SCALES:
                    interval = paired_cluster_ratio_interval(
                        np.tile(acc_new, PAIRED_REPEATS),
                        np.tile(steps_new, PAIRED_REPEATS),
                        labels,
                        np.tile(acc_old, PAIRED_REPEATS),
                        np.tile(steps_old, PAIRED_REPEATS),
                        labels,
                        offset=1.0,
                        confidence=args.confidence,
                        resamples=args.resamples,
                        seed=trial,
                        min_clusters=2,
                        scale=scale,
                    )
                    t[scale][n].add(interval, truth)
        for scale in PAIRED_SCALES:
            in_use = "yes" if scale == PAIRED_SCALE else "no"
            rows.append(
                (f"MAL new/old: paired cluster bootstrap-t, {scale} scale", in_use, scenario, t[scale])
            )
    return rows


# ------------------------------------------------------------------------------------------------ table


def print_table(blocks: list[tuple[str, tuple[int, ...], list[Row]]]) -> None:
    width = max(len(ns) for _, ns, _ in blocks)
    print("| method | in use | scenario | " + " | ".join(f"n{i + 1}" for i in range(width)) + " |")
    print("|---|---|---|" + "---|" * width)
    for title, ns, rows in blocks:
        heads = [f"**n={n}**" for n in ns] + [""] * (width - len(ns))
        print(f"| **{title}** | | | " + " | ".join(heads) + " |")
        for method, in_use, scenario, cells in rows:
            texts = [cells[n].cell() for n in ns] + [""] * (width - len(ns))
            print(f"| {method} | {in_use} | {scenario} | " + " | ".join(texts) + " |")
    print()
    print(
        "Cells: coverage / median width relative to the truth (high - low) / truth; '-': no interval drawn."
    )
    outside = 0
    for title, ns, rows in blocks:
        for method, in_use, scenario, cells in rows:
            if in_use != "yes":
                continue
            for name, bad in (
                (f"short of {TARGET:.0%}", [n for n in ns if cells[n].widths and cells[n].coverage < TARGET]),
                (f"above {CEILING:.0%}", [n for n in ns if cells[n].widths and cells[n].coverage > CEILING]),
            ):
                if bad:
                    outside += 1
                    print(
                        f"in use, {name}: {title} / {method} / {scenario} at n = {', '.join(map(str, bad))}"
                    )
    if not outside:
        print(f"Every method in use covers {TARGET:.0%}-{CEILING:.0%} at every n shown.")


def timed(name: str, block: Callable[[], list[Row]]) -> list[Row]:
    start = time.perf_counter()
    rows = block()
    print(f"{name}: {time.perf_counter() - start:.0f} s")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument(
        "--resamples",
        type=int,
        default=999,
        help="bootstrap resamples (the 'before', within-launch and acceptance rows)",
    )
    parser.add_argument("--speedup", type=float, default=1.1)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--blocks",
        default="repeats,launches,acceptance,paired",
        help="which blocks to run, comma-separated (repeats, launches, acceptance, paired)",
    )
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(
        f"{args.trials} simulated campaigns per cell, nominal {args.confidence:.0%}, "
        f"{args.resamples} resamples"
        " (binomial se of a coverage about 0.5%)"
    )
    chosen = args.blocks.split(",")
    blocks = []
    if "repeats" in chosen:
        blocks.append(("repeats", (2, 3, 5, 10), timed("repeats", lambda: repeats_block(args, rng))))
    if "launches" in chosen:
        blocks.append(("launches", (1, 2, 3, 4, 6), timed("launches", lambda: launches_block(args, rng))))
    if "acceptance" in chosen:
        blocks.append(
            (
                "acceptance (n = prompts)",
                (4, 6, 8, 16, 32, 48),
                timed("acceptance", lambda: acceptance_block(args, rng)),
            )
        )
    if "paired" in chosen:
        blocks.append(
            (
                "paired new/old MAL (n = prompts)",
                PAIRED_NS,
                timed("paired", lambda: paired_block(args, rng)),
            )
        )
    print_table(blocks)


if __name__ == "__main__":
    main()
