"""Does the adaptive-repeats rule keep its intervals honest, and how many launches does it save? (issue 21)

Simulates campaigns that launch repeat blocks one at a time and apply analysis.adaptive_repeats's rule after each
(`stopping_repeats`, the vectorised form of `repeat_decision`; tests/test_adaptive_repeats.py checks the two
agree). Each repeat gives every comparison a paired log-speedup log(planted) + noise, where the noise is the
run-to-run spread of a repeat's log-ratio (sigma), measured on this repository's campaigns with
`--measure RAW/<campaign>` (the pooled standard deviation of the per-repeat log throughput speedups around
each comparison's mean):

- demo: 0.103 (the demo campaign of the fresh-clone .ci/run of 2026-12-01 20:22 UTC, demo-a37b663f, 18
  comparisons x 2 repeats; the other depth-load campaigns give 0.095 and 0.162);
- depth-load: 0.171 (experiments/depth-load.yaml, var/raw/depth-load-e42f0a70, 24 x 2; the noisiest here);
- reference: 0.015 (the reference study's same-node A/A pairs differ by at most 1.5%: docs/analysis.md).

Two campaign shapes: `one` comparison (the worst case: the rule then looks at a single spread) and `demo`
(3 speculative variants with planted speedups 0.8, 1.0 and 1.3 x 3 workloads x 2 loads = 18 comparisons;
each cell's log throughput has noise sigma / sqrt(2), and a stratum's plain cell is shared by the three
variants of a repeat, as in v_speedup). Coverage is over every interval the campaign ends with, against its
planted speedup. Two rules at the same min and max:

- naive: stop once every 95% t interval is within the target, report those 95% intervals;
- rule: analysis.adaptive_repeats (stop on, and report, t intervals at interval_confidence, 97.5%).

`fixed n` is the smallest fixed number of repeats whose plain 95% intervals (no looks, no correction) are all
within the target in at least as many campaigns as the rule's (`reached`; not compared when the rule reaches
the target in fewer than half its campaigns: then the target lies beyond max and the rule simply runs to max);
`saved` is 1 - the rule's mean repeats / fixed n (negative: the rule spent more) and `vs max` 1 - mean / max. Repeats are launch blocks: each
costs one launch per variant (4 in a demo-shaped campaign with plain).

    .venv/bin/python benchmarks/adaptive_repeats.py [--trials 4000] [--seed 21]
    .venv/bin/python benchmarks/adaptive_repeats.py --noise-df 3     # heavier-tailed run-to-run noise
    .venv/bin/python benchmarks/adaptive_repeats.py --measure var/raw/depth-load-e42f0a70
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.adaptive_repeats import (
    ALPHA_SHARE,
    AdaptiveRepeats,
    campaign_observations,
    stopping_repeats,
    t_halfwidths,
)

CONFIDENCE = 0.95
FIXED_UP_TO = 40  # the longest fixed protocol considered
DEMO_SPEEDUPS = (0.8, 1.0, 1.3)  # one per speculative variant
DEMO_STRATA = 6  # 3 workloads x 2 loads
SPREADS = {"reference": 0.015, "demo": 0.103, "depth-load": 0.171}
# about 0.7, 1.5 and 3 sigma: out of reach by 10 repeats for one interval, reachable, reached at once
TARGETS = {"reference": (0.01, 0.02, 0.04), "demo": (0.075, 0.15, 0.3), "depth-load": (0.125, 0.25, 0.5)}
MIN_REACHED = 0.5  # below: the target is beyond what max repeats usually reach; no fixed protocol is compared


@dataclass(frozen=True)
class Scenario:
    shape: str  # one | demo
    spread: str  # a key of SPREADS
    target: float
    max: int
    planted: float  # the one comparison's planted speedup (shape one)
    noise_df: float | None = None  # None: normal noise; else Student t with these df, scaled to sigma

    @property
    def sigma(self) -> float:
        return SPREADS[self.spread]


@dataclass(frozen=True)
class Outcome:
    coverage_naive: float
    coverage_rule: float
    worst_variant: (
        float  # the rule's coverage of the worst planted speedup (shape demo; else = coverage_rule)
    )
    mean_naive: float
    mean_rule: float
    reached: float  # share of campaigns whose every final interval is within the target (the rule)
    fixed_n: (
        int | None
    )  # None: reached < MIN_REACHED, or no fixed protocol up to FIXED_UP_TO reaches it as often


def planted_logs(scenario: Scenario) -> np.ndarray:
    """log(planted speedup) of every comparison of the shape."""
    if scenario.shape == "one":
        return np.array([math.log(scenario.planted)])
    return np.repeat(np.log(DEMO_SPEEDUPS), DEMO_STRATA)


def noise(scenario: Scenario, sd: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Run-to-run noise of standard deviation `sd`: normal, or heavier-tailed (Student t) when asked."""
    df = scenario.noise_df
    if df is None:
        return rng.normal(0.0, sd, shape)
    return rng.standard_t(df, shape) * sd / math.sqrt(df / (df - 2))


def simulate(scenario: Scenario, trials: int, repeats: int, rng: np.random.Generator) -> np.ndarray:
    """log-ratios[campaign, comparison, repeat] of `trials` campaigns of `repeats` repeat blocks."""
    truth = planted_logs(scenario)[None, :, None]
    if scenario.shape == "one":
        return truth + noise(scenario, scenario.sigma, (trials, 1, repeats), rng)
    cell = scenario.sigma / math.sqrt(2)  # the difference of two cells' log throughputs has sd sigma
    variants = len(DEMO_SPEEDUPS)
    speculative = noise(scenario, cell, (trials, variants, DEMO_STRATA, repeats), rng)
    plain = noise(
        scenario, cell, (trials, 1, DEMO_STRATA, repeats), rng
    )  # shared by the variants of a stratum
    return truth + (speculative - plain).reshape(trials, variants * DEMO_STRATA, repeats)


def coverage(means: np.ndarray, halves: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.abs(means - truth[None, :]) <= halves


def run(scenario: Scenario, trials: int, rng: np.random.Generator, min_repeats: int = 3) -> Outcome:
    rule = AdaptiveRepeats(min=min_repeats, max=scenario.max, target_halfwidth=scenario.target)
    logs = simulate(scenario, trials, max(FIXED_UP_TO, scenario.max), rng)
    truth = planted_logs(scenario)
    level = rule.interval_confidence(CONFIDENCE)
    used, means, halves = stopping_repeats(logs, rule, level)
    covered = coverage(means, halves, truth)
    naive_used, naive_means, naive_halves = stopping_repeats(logs, rule, CONFIDENCE)
    reached = float((halves <= scenario.target).all(axis=1).mean())
    _, fixed_halves = t_halfwidths(logs, CONFIDENCE)  # [campaign, comparison, n]
    fixed_share = (fixed_halves <= scenario.target).all(axis=1).mean(axis=0)  # per n
    meeting = np.flatnonzero(fixed_share >= reached) if reached >= MIN_REACHED else np.array([], dtype=int)
    per_variant = (
        covered.reshape(trials, -1, DEMO_STRATA).mean(axis=(0, 2)) if scenario.shape == "demo" else None
    )
    return Outcome(
        coverage_naive=float(coverage(naive_means, naive_halves, truth).mean()),
        coverage_rule=float(covered.mean()),
        worst_variant=float(per_variant.min()) if per_variant is not None else float(covered.mean()),
        mean_naive=float(naive_used.mean()),
        mean_rule=float(used.mean()),
        reached=reached,
        fixed_n=int(meeting[0]) + 1 if len(meeting) else None,
    )


def scenarios(noise_df: float | None = None) -> list[Scenario]:
    out = []
    for shape in ("one", "demo"):
        for spread, targets in TARGETS.items():
            for i, target in enumerate(targets):
                for maximum in (6, 10):
                    planted = DEMO_SPEEDUPS[i % len(DEMO_SPEEDUPS)]
                    out.append(Scenario(shape, spread, target, maximum, planted, noise_df))
    return out


def measure(directories: list[Path]) -> None:
    """The pooled sd of per-repeat log throughput speedups around each comparison's mean."""
    for directory in directories:
        observations = campaign_observations(directory)
        squares, dof = 0.0, 0
        for by_repeat in observations.ratios.values():
            logs = np.log(np.array(list(by_repeat.values())))
            if len(logs) >= 2:
                squares += float(((logs - logs.mean()) ** 2).sum())
                dof += len(logs) - 1
        sigma = f"{math.sqrt(squares / dof):.3f}" if dof else "n/a (no comparison with 2 repeats)"
        print(f"{directory}: sigma {sigma} ({len(observations.ratios)} comparisons, {dof} df)")


def search(trials: int, rng: np.random.Generator, noise_df: float | None) -> None:
    """Why 97.5% and min 3: the worst coverage over the one-comparison scenarios per correction and min."""
    print("| min | intervals | worst coverage | mean repeats (max 10) |")
    print("|---|---|---|---|")
    cases = [s for s in scenarios(noise_df) if s.shape == "one"]
    for min_repeats in (2, 3):
        for share in (1.0, 0.75, 0.5, 0.25):
            level = 1 - (1 - CONFIDENCE) * share
            worst, spent = 1.0, []
            for scenario in cases:
                rule = AdaptiveRepeats.model_construct(
                    min=min_repeats, max=scenario.max, target_halfwidth=scenario.target
                )
                logs = simulate(scenario, trials, scenario.max, rng)
                used, means, halves = stopping_repeats(logs, rule, level)
                worst = min(worst, float(coverage(means, halves, planted_logs(scenario)).mean()))
                if scenario.max == 10:
                    spent.append(float(used.mean()))
            print(f"| {min_repeats} | {level:.2%} t | {worst:.1%} | {np.mean(spent):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=4000, help="simulated campaigns per scenario")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--measure", type=Path, nargs="+", help="print the spread of these raw campaign dirs")
    parser.add_argument(
        "--noise-df", type=float, help="heavier tails: Student t noise with these degrees of freedom (> 2)"
    )
    parser.add_argument("--no-search", action="store_true", help="skip the table of corrections")
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return
    rng = np.random.default_rng(args.seed)
    print(
        f"{args.trials} campaigns per scenario, min 3, nominal {CONFIDENCE:.0%}; the rule's intervals at "
        f"{1 - (1 - CONFIDENCE) * ALPHA_SHARE:.1%}; noise "
        f"{'normal' if args.noise_df is None else f'Student t, {args.noise_df:g} df'} (binomial se of a coverage near 95%: "
        f"{math.sqrt(0.95 * 0.05 / args.trials):.2%})"
    )
    print(
        "| shape | sigma | target | max | planted | naive coverage | rule coverage | worst variant | "
        "naive repeats | rule repeats | reached | fixed n | saved | vs max |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for scenario in scenarios(args.noise_df):
        o = run(scenario, args.trials, rng)
        planted = f"{scenario.planted:g}" if scenario.shape == "one" else "0.8/1.0/1.3"
        fixed = "-" if o.fixed_n is None else str(o.fixed_n)
        saved = "-" if o.fixed_n is None else f"{1 - o.mean_rule / o.fixed_n:+.0%}"
        print(
            f"| {scenario.shape} | {scenario.sigma:g} ({scenario.spread}) | {scenario.target:g} | {scenario.max} "
            f"| {planted} | {o.coverage_naive:.1%} | {o.coverage_rule:.1%} | {o.worst_variant:.1%} "
            f"| {o.mean_naive:.2f} | {o.mean_rule:.2f} | {o.reached:.0%} | {fixed} | {saved} "
            f"| {1 - o.mean_rule / scenario.max:+.0%} |"
        )
    if not args.no_search:
        print()
        search(args.trials, rng, args.noise_df)


if __name__ == "__main__":
    main()
