"""How often do the report's intervals cover the truth? (issue 18, item 7)

Simulates campaigns of n repeats with log-normal run-to-run noise (sigma = the standard deviation of a
repeat's log-ratio; the depth-load campaign's repeats differ by 1-15%, i.e. sigma up to about 0.1) and counts
how often each interval the report prints covers the planted value, at the report's nominal 95%:

- `speedup` (analysis.stats.ratio_interval: geometric mean of per-repeat ratios, t on their logs), against
  the planted speedup; the same method gives the depth edges, the n-gram/draft edge and the A/A figure;
- `before`: what the report printed until issue 18 (percentile bootstrap of the mean of per-repeat ratios)
  against the mean ratio it estimates, for comparison;
- `regression` (analysis.stats.ratio_of_means_interval: ratio of geometric means of two independent samples,
  Welch t on the logs), against the planted ratio;
- `step time` (analysis.stats.mean_interval: t on per-repeat values), against their true mean;
- `crossover` (analysis.crossover: t over the repeats' own crossings on log2(load)), against the true curve's
  crossing: speedup 1.3 - 0.15 log2(load) at loads 1-16, crossing at load 4; the share of campaigns that get
  an interval at all (every repeat must cross inside the range) is printed beside it.

    .venv/bin/python benchmarks/interval_coverage.py [--trials 2000] [--resamples 999]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats

from analysis.crossover import crossover_interval
from analysis.stats import has_interval, mean_interval, ratio_interval, ratio_of_means_interval

LOADS = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
CURVE = 1.3 - 0.15 * np.log2(LOADS)  # crosses 1 at load 4
TRUE_CROSSING = 4.0


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument(
        "--resamples", type=int, default=999, help="bootstrap resamples (the 'before' column)"
    )
    parser.add_argument("--speedup", type=float, default=1.1)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    c = args.confidence
    print(f"{args.trials} simulated campaigns per row, nominal {c:.0%}; coverage (binomial se about 0.5%)")
    print(
        "| repeats | sigma | speedup | before (bootstrap) | regression | step time | crossover | with interval |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in (2, 3, 5, 10):
        for sigma in (0.03, 0.10):
            hits = dict.fromkeys(("speedup", "before", "regression", "step", "crossover"), 0)
            drawn_crossovers = 0
            mean_ratio = args.speedup * math.exp(sigma**2 / 2)
            for trial in range(args.trials):
                ratios = args.speedup * np.exp(rng.normal(0.0, sigma, n))
                interval = ratio_interval(ratios, confidence=c)
                hits["speedup"] += interval.low <= args.speedup <= interval.high
                low, high = bootstrap_mean(ratios, c, args.resamples, trial)
                hits["before"] += low <= mean_ratio <= high
                baseline = 100 * np.exp(rng.normal(0.0, sigma, n))
                treatment = 100 * args.speedup * np.exp(rng.normal(0.0, sigma, n))
                interval = ratio_of_means_interval(treatment, baseline, confidence=c)
                hits["regression"] += interval.low <= args.speedup <= interval.high
                steps = 0.01 * np.exp(rng.normal(0.0, sigma, n))
                interval = mean_interval(steps, confidence=c)
                hits["step"] += interval.low <= 0.01 * math.exp(sigma**2 / 2) <= interval.high
                matrix = CURVE * np.exp(rng.normal(0.0, sigma, (n, len(LOADS))))
                interval = crossover_interval(LOADS, matrix, c)
                if has_interval(interval):
                    drawn_crossovers += 1
                    hits["crossover"] += interval.low <= TRUE_CROSSING <= interval.high
            cells = [f"{hits[k] / args.trials:.1%}" for k in ("speedup", "before", "regression", "step")]
            crossover = f"{hits['crossover'] / drawn_crossovers:.1%}" if drawn_crossovers else "-"
            print(
                f"| {n} | {sigma:g} | "
                + " | ".join(cells)
                + f" | {crossover} | {drawn_crossovers / args.trials:.0%} |"
            )


if __name__ == "__main__":
    main()
