"""How often do the report's per-load speedup intervals cover the truth? (issue 18, item 7)

Simulates campaigns of n repeats whose per-repeat throughput ratios are a planted speedup times log-normal
run-to-run noise (sigma = the standard deviation of the log-ratio; the depth-load campaign's repeats differ by
1-15%, i.e. sigma up to about 0.1), and counts how often each interval method covers its estimand:

- `bootstrap`: what the report prints today (analysis.stats.mean_interval: percentile bootstrap of the mean
  of per-repeat ratios), against the mean ratio E[r] = speedup * exp(sigma^2 / 2);
- `t-log`: Student t on the log-ratios, exp(mean(log r) +- t(n-1) s / sqrt(n)), against the geometric mean
  (the planted speedup), exact for log-normal noise.

Prints one row per n and sigma: nominal level, each method's simulated coverage (with its binomial standard
error) and mean width.

    .venv/bin/python benchmarks/interval_coverage.py [--trials 2000] [--resamples 999] [--speedup 1.1]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats

from analysis.stats import mean_interval


def t_log_interval(ratios: np.ndarray, confidence: float) -> tuple[float, float]:
    logs = np.log(ratios)
    n = len(logs)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n)
    return math.exp(logs.mean() - half), math.exp(logs.mean() + half)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=999, help="bootstrap resamples per interval")
    parser.add_argument("--speedup", type=float, default=1.1)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(
        f"planted speedup {args.speedup}, {args.trials} simulated campaigns per row, nominal {args.confidence:.0%}"
    )
    print("| repeats | sigma | bootstrap coverage | its mean width | t-log coverage | its mean width |")
    print("|---|---|---|---|---|---|")
    for n in (2, 3, 5, 10):
        for sigma in (0.03, 0.10):
            mean_ratio = args.speedup * math.exp(sigma**2 / 2)
            hits = {"bootstrap": 0, "t-log": 0}
            widths: dict[str, list[float]] = {"bootstrap": [], "t-log": []}
            for trial in range(args.trials):
                ratios = args.speedup * np.exp(rng.normal(0.0, sigma, n))
                boot = mean_interval(ratios, confidence=args.confidence, seed=trial, resamples=args.resamples)
                hits["bootstrap"] += boot.low <= mean_ratio <= boot.high
                widths["bootstrap"].append(boot.high - boot.low)
                low, high = t_log_interval(ratios, args.confidence)
                hits["t-log"] += low <= args.speedup <= high
                widths["t-log"].append(high - low)

            cells = []
            for method in ("bootstrap", "t-log"):
                p = hits[method] / args.trials
                se = math.sqrt(p * (1 - p) / args.trials)
                cells += [f"{p:.1%} (+-{se:.1%})", f"{np.mean(widths[method]):.3f}"]
            print(f"| {n} | {sigma:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
