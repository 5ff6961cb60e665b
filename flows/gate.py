"""The gate flow: judge every speculative variant's greedy outputs against the calibrated control.

Treatment: plain vs the variant (first repeat). Controls: plain captured twice on one deployment, and
plain vs each separately launched plain deployment (the extra control launches, and other repeats)."""

from __future__ import annotations

from specgauge.prefect_env import configure

configure()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from artifacts import layout  # noqa: E402
from artifacts.store import read_json  # noqa: E402
from tasks.capture import load_capture  # noqa: E402
from tasks.gate import GateRefusal, compare, gate, verdict_id_for, write_verdict  # noqa: E402


def gate_pairs(campaign: dict[str, Any]) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
    """(plain capture, treatments [(variant, capture)], controls [(a, b)]) from campaign.json's plan."""
    captures = {c: d for d in campaign["deployments"] for c in d["captures"]}
    spec_variants = {v["name"]: v for v in campaign["spec"]["variants"]}
    plain = next(name for name, v in spec_variants.items() if v.get("method", "none") == "none")
    base = f"{plain}.r0"
    treatments = [
        (d["variant"], f"{d['variant']}.r0")
        for d in campaign["deployments"]
        if d["role"] == "arm"
        and d["repeat"] == 0
        and spec_variants[d["variant"]].get("method", "none") != "none"
    ]
    controls = [(base, c) for c in captures if c != base and captures[c]["variant"] == plain]
    return base, treatments, controls


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
def gate_campaign(campaign_id: str, directory: str) -> list[dict[str, Any]]:
    """Gate every speculative variant of a campaign whose captures exist; refusals are logged, not fatal."""
    logger = get_run_logger()
    root = Path(directory)
    campaign = read_json(layout.campaign_file(root))
    base, treatments, controls = gate_pairs(campaign)
    present = {p.name for p in layout.subdirs(layout.captures_dir(root))}
    controls = [(a, b) for a, b in controls if a in present and b in present]
    verdicts = []
    for variant, capture_id in treatments:
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
