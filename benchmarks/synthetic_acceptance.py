"""Synthetic acceptance on the embedded engine: does the measured mean acceptance length match the configured
one? (patches/cpu-synthetic-acceptance.patch, issue 17: within 3% at each value.)

For each configured length L, launches the draft-model variant (models/tiny-draft, depth k) with
`synthetic_acceptance_length: L` through specgauge's local launcher (the overlay mounted from
`launcher.patches`), runs one closed-loop cell of greedy requests, and reads vLLM's own counters over the
measured window (`/metrics` deltas: 1 + accepted / drafts). Prints one row per L: configured, measured,
relative error, drafts counted, and the binomial standard error of the measurement (the draws are random,
so a few hundred drafts cannot pin L tighter than that).

    flock /tmp/specgauge-engine.lock .venv/bin/python benchmarks/synthetic_acceptance.py \
        [--lengths 1.25,1.5,2,2.5,3,3.5] [--k 3] [--requests 16] [--max-tokens 192] [--concurrency 4]

Each value is an engine start (about a minute on 2 cores, eager: its step time is not what is measured)
plus its cell.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, LocalLaunchSpec, Sampling, TargetSpec, Variant
from tasks.cell import run_cell
from tasks.health import wait_ready
from tasks.launch.local import LocalLauncher
from workloads.schema import load_corpus

REPO = Path(__file__).resolve().parent.parent
PATCH = "cpu-synthetic-acceptance"


def conditional_rates(length: float, k: int) -> list[float]:
    """vLLM's rates for a length (SpeculativeConfig._acceptance_length_to_rates, then conditional)."""
    drafts = length - 1.0
    full = int(drafts)
    unconditional = ([1.0] * full + [drafts - full] + [0.0] * (k - full - 1))[:k]
    out, previous = [], 1.0
    for rate in unconditional:
        out.append(rate / previous if previous > 0 else 0.0)
        previous = rate
    return out


def standard_error(length: float, k: int, drafts: int) -> float:
    """Standard error of 1 + accepted / drafts over `drafts` independent drafts at these rates."""
    rates = conditional_rates(length, k)
    # accepted per draft = number of leading successes; its distribution from the conditional rates
    probs, survive = [], 1.0
    for rate in rates:
        probs.append(survive * (1 - rate))
        survive *= rate
    probs.append(survive)  # all k accepted
    mean = sum(n * p for n, p in enumerate(probs))
    var = sum((n - mean) ** 2 * p for n, p in enumerate(probs))
    return math.sqrt(var / drafts) if drafts else float("nan")


def measure(length: float, k: int, requests: int, max_tokens: int, concurrency: int, root: Path) -> dict:
    target = TargetSpec(
        model=str(REPO / "models" / "tiny-target"), served_model_name="tiny", max_model_len=2048
    )
    variant = Variant(
        name=f"draft-k{k}-L{length:g}",
        method="draft_model",
        k=k,
        draft_model=str(REPO / "models" / "tiny-draft"),
        synthetic_acceptance_length=length,
    )
    launcher = LocalLauncher(LocalLaunchSpec(compilation="eager", patches=(PATCH,)))
    directory = root / variant.name
    deployment = launcher.launch(
        target, variant, deployment_id=f"synthetic.{variant.name}", directory=directory
    )
    try:
        wait_ready(deployment, launcher, timeout_s=600)
        outcome = run_cell(
            deployment,
            CellPlan(f"{variant.name}.r0.code.c{concurrency}", "code", "closed", concurrency, None, "smoke"),
            campaign_id="synthetic",
            repeat=0,
            corpus=load_corpus(REPO / "workloads" / "smoke.jsonl"),
            sampling=Sampling(max_tokens=max_tokens, ignore_eos=True),
            load=LoadSpec(
                concurrencies=(concurrency,),
                requests=requests,
                warmup=1,
                allow_short_cells=True,  # the cells this benchmark times, as it always sized them
                request_timeout_s=300,
            ),
            slo=SLO(),
            cells_dir=directory / "cells",
        )
    finally:
        launcher.teardown(deployment)
    spec = outcome.summary.speculation
    if outcome.status != "ok" or spec is None or not spec.drafts:
        raise SystemExit(f"L={length}: the cell failed or counted no drafts: {outcome.summary.error}")
    measured = float(spec.mean_acceptance_length)
    return {
        "configured": length,
        "measured": measured,
        "rel_error": measured / length - 1,
        "drafts": int(spec.drafts),
        "se": standard_error(length, k, int(spec.drafts)),
        "overlay": deployment.extra.get("overlays", {}).get("patches"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="1.25,1.5,2,2.5,3,3.5")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="specgauge-synthetic-") as tmp:
        for length in (float(v) for v in args.lengths.split(",")):
            rows.append(measure(length, args.k, args.requests, args.max_tokens, args.concurrency, Path(tmp)))
            print(
                f"L={length:g}: measured {rows[-1]['measured']:.3f} over {rows[-1]['drafts']} drafts",
                flush=True,
            )
    print(
        "\n| configured L | measured L | error | drafts | standard error | within 3% |\n|---|---|---|---|---|---|"
    )
    for r in rows:
        ok = "yes" if abs(r["rel_error"]) <= 0.03 else "no"
        print(
            f"| {r['configured']:g} | {r['measured']:.3f} | {r['rel_error']:+.1%} | {r['drafts']} | "
            f"{r['se']:.3f} | {ok} |"
        )


if __name__ == "__main__":
    main()
