"""Does the verification that launches until it decides keep its coverage and its error rates? (issue 41)

Simulates verification campaigns: every repeat block launches plain and the schedule once each, and each
launch's throughput carries log-normal launch-to-launch noise of coefficient of variation CV (2%, 5%, 10%;
sigma = sqrt(log(1 + CV^2)) per launch, so a block's log-ratio has sd sigma * sqrt(2)). After `min` blocks and
after every block from then on, each watched load gets the t interval of its log-ratios (the same interval as
analysis.stats.ratio_interval, vectorised: analysis.adaptive_repeats.t_halfwidths; tests/
test_sequential_verification.py checks they agree with the product's rule campaign by campaign), the product's
verdict on it (analysis.recommend.judge, imported) and the product's stop rule (analysis.sequential_verification
.should_stop, imported): stop once no load is inconclusive, or at `max`.

Planted truths at the load under test, where the schedule drafts (k = 3, the claim "beats plain by
min_effect = 10%"): 0.90 (slower), 1.00 (no change), 1.05 (faster, below the minimum effect), 1.10 (exactly
1 + min_effect) and 1.25 (above); where it is off (k = 0, "no worse than plain within 5%"): 0.95 (exactly the
floor). Shapes: `one` load (the worst case: the rule watches a single interval) and `demo` (the load under
test beside a k = 3 load at 1.30 and an off load at 0.86, the demo's three loads). Rules, each with min 2 and
max 6 launches per arm:

- naive: stop on, and report, 95% intervals;
- the rule: stop on, and report, intervals at look_confidence (alpha split over the looks after the first);
- fixed 6: six launches, 95% intervals, no looks (what the same budget decides without stopping early).

Columns: coverage of the load's final interval (at the level the rule reports) against the truth; wrongly
confirmed (confirmed while the truth is at or below 1 + min_effect; off: at or below 1 - tolerance); wrongly
faster (confirmed or "faster, below the minimum effect" while the truth is at or below 1); wrongly refuted
(refuted while the truth is at or above 1; off: at or above 1 - tolerance); decided (the load's verdict is not
inconclusive at the end); mean launches per arm.

    .venv/bin/python benchmarks/sequential_verification.py [--trials 4000] [--seed 41] [--search]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from analysis.adaptive_repeats import t_halfwidths
from analysis.recommend import judge
from analysis.sequential_verification import look_confidence, should_stop
from artifacts.documents.decisions import BELOW_MIN_EFFECT, CONFIRMED, INCONCLUSIVE, REFUTED

CONFIDENCE = 0.95
MIN_EFFECT, TOLERANCE = 0.10, 0.05
MIN, MAX = 2, 6
CVS = (0.02, 0.05, 0.10)
TRUTHS = ((3, 0.90), (3, 1.00), (3, 1.05), (3, 1.10), (3, 1.25), (0, 0.95))  # (k, planted speedup)
DEMO_OTHERS = ((3, 1.30), (0, 0.86))  # the demo shape's other loads
SHARES = (1.0, 0.5, 1 / 3, 0.25, 0.2, 0.1)  # of alpha, for the looks' intervals (--search)


@dataclass(frozen=True)
class Bounds:
    min: int
    max: int


OTHER_BOUNDS = (Bounds(2, 4), Bounds(3, 6), Bounds(4, 6), Bounds(2, 10))  # the chosen rule elsewhere


@dataclass(frozen=True)
class Result:
    coverage: float
    wrongly_confirmed: float
    wrongly_faster: float
    wrongly_refuted: float
    decided: float
    launches: float


def launches(
    truths: list[float], cv: float, trials: int, rng: np.random.Generator, blocks: int = MAX
) -> np.ndarray:
    """log-ratios[campaign, load, block] of schedule over plain, each launch with log-normal noise of CV."""
    sigma = math.sqrt(math.log1p(cv * cv))
    shape = (trials, len(truths), blocks)
    plain = rng.normal(0.0, sigma, shape)
    schedule = np.log(np.asarray(truths))[None, :, None] + rng.normal(0.0, sigma, shape)
    return schedule - plain


def wrong(k: int, truth: float, outcome: str) -> tuple[bool, bool, bool]:
    """(wrongly confirmed, wrongly faster, wrongly refuted) for a verdict against its planted truth."""
    if k == 0:
        floor = 1.0 - TOLERANCE
        return outcome == CONFIRMED and truth <= floor, False, outcome == REFUTED and truth >= floor
    return (
        outcome == CONFIRMED and truth <= 1.0 + MIN_EFFECT,
        outcome in (CONFIRMED, BELOW_MIN_EFFECT) and truth <= 1.0,
        outcome == REFUTED and truth >= 1.0,
    )


def run(loads: list[tuple[int, float]], logs: np.ndarray, rule: Bounds, level: float) -> Result:
    """The stop rule and verdicts on every simulated campaign; figures for load 0 (the load under test)."""
    means, halves = t_halfwidths(logs, level)  # [campaign, load, n]
    estimate, low, high = np.exp(means), np.exp(means - halves), np.exp(means + halves)
    k0, truth = loads[0]
    counts = np.zeros(5)
    spent = 0
    for trial in range(logs.shape[0]):
        for n in range(rule.min, rule.max + 1):
            i = n - 1
            verdicts = [
                judge(
                    k, estimate[trial, j, i], low[trial, j, i], high[trial, j, i], n, TOLERANCE, MIN_EFFECT
                )[0]
                for j, (k, _) in enumerate(loads)
            ]
            if should_stop(verdicts, n, rule):
                break
        spent += n
        covered = low[trial, 0, i] <= truth <= high[trial, 0, i]
        counts += (covered, *wrong(k0, truth, verdicts[0]), verdicts[0] != INCONCLUSIVE)
    share = counts / logs.shape[0]
    return Result(*(float(x) for x in share), launches=spent / logs.shape[0])


def scenario_rows(
    trials: int, rng: np.random.Generator
) -> list[tuple[str, float, int, float, dict[str, Result]]]:
    rules = {
        "naive": (Bounds(MIN, MAX), CONFIDENCE),
        "rule": (Bounds(MIN, MAX), look_confidence(Bounds(MIN, MAX), CONFIDENCE)),
        "fixed 6": (Bounds(MAX, MAX), CONFIDENCE),
    }
    rows = []
    for shape in ("one", "demo"):
        for cv in CVS:
            for k, truth in TRUTHS:
                loads = [(k, truth), *(DEMO_OTHERS if shape == "demo" else ())]
                logs = launches([t for _, t in loads], cv, trials, rng)  # the same campaigns for every rule
                results = {name: run(loads, logs, bounds, level) for name, (bounds, level) in rules.items()}
                rows.append((shape, cv, k, truth, results))
    return rows


def search(trials: int, rng: np.random.Generator) -> None:
    """Why look_confidence: per share of alpha the looks' intervals may miss by (min 2, max 6), the worst
    figures over the one-load scenarios (the rule watching a single interval); then the chosen split at other
    bounds."""
    print("| launches | intervals (stop and report) | worst coverage | worst wrongly confirmed | ", end="")
    print("worst wrongly faster | worst wrongly refuted | mean launches |")
    print("|---|---|---|---|---|---|---|")
    cases = [(cv, k, truth) for cv in CVS for k, truth in TRUTHS]
    most = max(b.max for b in OTHER_BOUNDS)
    logs = {case: launches([case[2]], case[0], trials, rng, most) for case in cases}  # the same for all
    tried = [(Bounds(MIN, MAX), 1 - (1 - CONFIDENCE) * share) for share in SHARES]
    tried += [(bounds, look_confidence(bounds, CONFIDENCE)) for bounds in OTHER_BOUNDS]
    for bounds, level in tried:
        got = [run([(k, truth)], logs[(cv, k, truth)], bounds, level) for cv, k, truth in cases]
        print(
            f"| {bounds.min}-{bounds.max} | {level:.2%} t | {pct(min(g.coverage for g in got))} | "
            f"{pct(max(g.wrongly_confirmed for g in got))} | {pct(max(g.wrongly_faster for g in got))} | "
            f"{pct(max(g.wrongly_refuted for g in got))} | {np.mean([g.launches for g in got]):.2f} |"
        )
    print()


def pct(x: float) -> str:
    return f"{x:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=4000, help="simulated verifications per scenario")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--search", action="store_true", help="first, the corrections compared")
    args = parser.parse_args()
    started = time.monotonic()
    if args.search:
        search(args.trials, np.random.default_rng(args.seed + 1))
    rows = scenario_rows(args.trials, np.random.default_rng(args.seed))
    level = look_confidence(Bounds(MIN, MAX), CONFIDENCE)
    print(
        f"# sequential verification: {args.trials} campaigns per scenario, seed {args.seed}, min {MIN}, max {MAX}, "
        f"min_effect {MIN_EFFECT:g}, tolerance {TOLERANCE:g}; the rule at {level:.2%}"
    )
    print(
        "| shape | CV | k | truth | coverage naive / rule / fixed 6 | wrongly confirmed | wrongly faster "
        "| wrongly refuted | decided | mean launches |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    names = ("naive", "rule", "fixed 6")
    for shape, cv, k, truth, results in rows:
        cells = [
            " / ".join(pct(getattr(results[n], field)) for n in names)
            for field in Result.__dataclass_fields__
        ]
        cells[-1] = " / ".join(f"{results[n].launches:.2f}" for n in names)
        print(f"| {shape} | {cv:.0%} | {k} | {truth:.2f} | " + " | ".join(cells) + " |")
    print()
    print(
        "| rule | worst coverage | worst wrongly confirmed | worst wrongly faster | worst wrongly refuted | launches |"
    )
    print("|---|---|---|---|---|---|")
    for name in names:
        got = [r[4][name] for r in rows]
        print(
            f"| {name} | {pct(min(g.coverage for g in got))} | {pct(max(g.wrongly_confirmed for g in got))} | "
            f"{pct(max(g.wrongly_faster for g in got))} | {pct(max(g.wrongly_refuted for g in got))} | "
            f"{min(g.launches for g in got):.2f}-{max(g.launches for g in got):.2f} |"
        )
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
