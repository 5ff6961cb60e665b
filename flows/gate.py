"""The gate flow: judge every speculative variant's greedy outputs against the calibrated control.

The pairs come from the campaign's plan (experiments.plan.GatePlan): treatment, plain vs the variant (first
repeat); controls, plain captured twice on one deployment, and plain vs each separately launched plain
deployment (the extra control launches, and other repeats)."""

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from artifacts import layout
from artifacts.documents.captures import load_capture
from artifacts.store import read_json
from experiments.plan import GatePlan
from tasks.gate import GateRefusal, compare, gate, verdict_id_for, write_verdict


@task(name="gate-variant", cache_policy=NO_CACHE)
def gate_variant(
    directory: Path, base: str, treatment: str, controls: list[tuple[str, str]]
) -> dict[str, Any]:
    captures_dir = layout.captures_dir(directory)
    plain = load_capture(captures_dir / base)
    pairs = [(load_capture(captures_dir / a), load_capture(captures_dir / b)) for a, b in controls]
    spec = load_capture(captures_dir / treatment)
    verdict_id = verdict_id_for(compare(plain, spec), [compare(a, b) for a, b in pairs], 0.05)
    existing = layout.verdict_file(directory, verdict_id)
    if existing.exists():  # a re-run: the verdict is an immutable artifact already
        data = read_json(existing)
        return {
            "treatment": data["treatment_variant"],
            "passed": data["passed"],
            "claim": data["claim"],
            "path": str(existing),
        }
    verdict = gate((plain, spec), pairs, verdict_id=verdict_id)
    path = write_verdict(verdict, directory)
    return {
        "treatment": verdict.treatment_variant,
        "passed": verdict.passed,
        "claim": verdict.claim,
        "path": str(path),
    }


@flow(name="gate")
def gate_campaign(campaign_id: str, directory: str, pairs: GatePlan) -> list[dict[str, Any]]:
    """Gate every speculative variant of a campaign whose captures exist; refusals are logged, not fatal."""
    logger = get_run_logger()
    root = Path(directory)
    base = pairs.plain
    present = {p.name for p in layout.subdirs(layout.captures_dir(root))}
    controls = [(a, b) for a, b in pairs.controls if a in present and b in present]
    verdicts = []
    for variant, capture_id in pairs.treatments:
        if base not in present or capture_id not in present:
            logger.error("gate %s: captures missing (%s, %s), no verdict", variant, base, capture_id)
            continue
        try:
            verdict = gate_variant(root, base, capture_id, controls)
        except GateRefusal as exc:
            logger.error("gate %s refused: %s", variant, exc)
            verdicts.append({"treatment": variant, "passed": False, "claim": f"refused: {exc}", "path": None})
            continue
        logger.info("gate %s: %s", variant, verdict["claim"])
        verdicts.append(verdict)
    return verdicts
