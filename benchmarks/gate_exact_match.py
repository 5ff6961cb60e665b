"""How often greedy outputs agree on the embedded engine, and what the correctness gate makes of it.

Launches, one after another (one engine at a time), the demo spec's deployments and captures the capture
corpus (workloads/capture.jsonl, 36 prompts) on each:

    plain            captured twice (plain.r1, plain.r1.again: the same-deployment repeat)
    plain, again     a second, separately launched plain deployment (plain.ctl1: cross-deployment control)
    ngram-k3         n-gram speculation, k=3
    draft-k3         draft-model speculation, k=3
    draft-as-target  the draft model served as if it were the target: a deliberately lossy treatment
    plain at T=1     a temperature-1 capture on plain (allow_sampling): the gate must refuse to compare it

then prints the exact-match rates of plain against each, and the gate's verdict for n-gram, draft-model and
the lossy treatment. Takes the engine lock itself (run it plainly, not under flock):

    .venv/bin/python benchmarks/gate_exact_match.py [--limit N] [--out RAW_ROOT]

About 8 minutes on 2 cores (five engine starts of about a minute, six captures).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from artifacts.documents.captures import load_capture
from experiments.spec import ExperimentSpec, Sampling, TargetSpec, Variant, load_spec
from specgauge.provenance import utc_stamp
from tasks.capture import capture
from tasks.gate import GateRefusal, compare, gate, write_verdict
from tasks.health import ready_deployment
from tasks.launch.local import LocalLauncher
from workloads.schema import Corpus, load_corpus

REPO = Path(__file__).resolve().parent.parent

ENGINE_LOCK = Path(os.environ.get("SPECGAUGE_ENGINE_LOCK", "/tmp/specgauge-engine.lock"))
console = Console(width=max(Console().width, 120))  # tables unwrapped in a log file too


def launch_and_capture(
    spec: ExperimentSpec,
    target: TargetSpec,
    variant: Variant,
    deployment_id: str,
    captures: list[tuple[str, Sampling, bool]],
    corpus: Corpus,
    raw_dir: Path,
    campaign_id: str,
    limit: int | None,
) -> dict[str, Path]:
    launcher = LocalLauncher(spec.launcher)
    out: dict[str, Path] = {}
    started = time.perf_counter()
    with ready_deployment(
        launcher, target, variant, raw_dir, deployment_id, spec.launcher.ready_timeout_s
    ) as deployment:
        ready = time.perf_counter() - started
        for capture_id, sampling, allow in captures:
            t = time.perf_counter()
            out[capture_id] = capture(
                deployment,
                corpus,
                sampling=sampling,
                limit=limit,
                raw_campaign_dir=raw_dir,
                capture_id=capture_id,
                campaign_id=campaign_id,
                allow_sampling=allow,
            )
            console.print(
                f"  {capture_id}: captured in {time.perf_counter() - t:.1f} s (engine ready after {ready:.0f} s)",
                markup=False,
            )
    return out


def _accepted(capture_dir: Path) -> str:
    """Accepted / drafted tokens during the capture: speculation did run while outputs matched."""
    speculation = load_capture(capture_dir).meta.get("speculation")
    if not speculation:
        return "-"
    if "error" in speculation:
        return "unknown"
    return f"{speculation['accepted_tokens']}/{speculation['draft_tokens']}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=None, help="Capture only the first N prompts.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Raw root; the campaign goes in OUT/<campaign_id> (default var/bench).",
    )
    parser.add_argument("--force", action="store_true", help="Gate even with fewer than 32 prompts.")
    args = parser.parse_args()

    spec = load_spec(REPO / "experiments" / "demo.yaml")
    corpus = load_corpus(REPO / spec.capture.corpus)
    campaign_id = f"gate-exact-match-{utc_stamp()}"
    raw_dir = (
        args.out or REPO / "var" / "bench"
    ) / campaign_id  # RAW/<campaign_id>, as the warehouse expects
    variants = {v.name: v for v in spec.variants}
    plain = spec.plain
    greedy = spec.sampling
    hot = greedy.model_copy(update={"temperature": 1.0})
    draft_target = spec.target.model_copy(update={"model": variants["draft-k3"].draft_model})
    lossy_variant = Variant(name="draft-as-target")
    plan = [
        (spec.target, plain, f"{campaign_id}.plain.r1", [("plain.r1", greedy, False), ("plain.r1.again", greedy, False),
                                                         ("plain.r1.t1", hot, True)]),
        (spec.target, plain, f"{campaign_id}.plain.ctl1", [("plain.ctl1", greedy, False)]),
        (spec.target, variants["ngram-k3"], f"{campaign_id}.ngram-k3.r1", [("ngram-k3.r1", greedy, False)]),
        (spec.target, variants["draft-k3"], f"{campaign_id}.draft-k3.r1", [("draft-k3.r1", greedy, False)]),
        (draft_target, lossy_variant, f"{campaign_id}.draft-as-target.r1", [("draft-as-target.r1", greedy, False)]),
    ]  # fmt: skip
    ENGINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    captures: dict[str, Path] = {}
    with open(ENGINE_LOCK, "w") as lock:
        console.print(f"waiting for the engine lock {ENGINE_LOCK} ...", markup=False)
        fcntl.flock(lock, fcntl.LOCK_EX)
        for target, variant, deployment_id, wanted in plan:
            console.print(f"{deployment_id}: launching {target.model} ({variant.name})", markup=False)
            captures |= launch_and_capture(
                spec, target, variant, deployment_id, wanted, corpus, raw_dir, campaign_id, args.limit
            )

    table = Table(title=f"greedy agreement with plain.r1, {campaign_id}", title_justify="left")
    for name in (
        "against plain.r1",
        "what it shows",
        "exact",
        "rate",
        "mean prefix",
        "mean edit",
        "med. 1st div.",
        "accepted/drafted",
    ):
        table.add_column(name)
    pairs = [
        ("plain.r1.again", "same deployment, repeated"),
        ("plain.ctl1", "separately launched plain"),
        ("ngram-k3.r1", "n-gram speculation, k=3"),
        ("draft-k3.r1", "draft-model speculation, k=3"),
        ("draft-as-target.r1", "lossy: draft model as target"),
    ]
    for capture_id, what in pairs:
        c = compare(captures["plain.r1"], captures[capture_id]).overall
        table.add_row(
            capture_id,
            what,
            f"{c.exact}/{c.n}",
            f"{c.exact_match_rate:.1%}",
            f"{c.mean_prefix_fraction:.3f}",
            f"{c.mean_edit_distance:.3f}",
            "-" if c.median_first_divergence is None else f"{c.median_first_divergence:g}",
            _accepted(captures[capture_id]),
        )
    console.print(table)
    try:
        compare(captures["plain.r1"], captures["plain.r1.t1"])
        console.print(
            "plain.r1.t1 (temperature 1): compared?! the sampling check did not refuse", style="red"
        )
    except GateRefusal as exc:
        console.print(
            f"plain.r1.t1 (temperature 1): refused, as it must be: {exc}".replace("\n", " "), markup=False
        )

    controls = [
        (captures["plain.r1"], captures["plain.r1.again"]),
        (captures["plain.r1"], captures["plain.ctl1"]),
    ]
    console.print("gate verdicts (controls: plain.r1 vs plain.r1.again, plain.r1 vs plain.ctl1):")
    for treatment in ("ngram-k3.r1", "draft-k3.r1", "draft-as-target.r1"):
        verdict = gate((captures["plain.r1"], captures[treatment]), controls, force=args.force)
        path = write_verdict(verdict, raw_dir)
        console.print(
            f"- {treatment}: {verdict.outcome} ({path.relative_to(raw_dir)})\n  {verdict.claim}", markup=False
        )
    console.print(f"raw artifacts: {raw_dir}", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
