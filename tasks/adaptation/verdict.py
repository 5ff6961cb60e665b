"""A confirmation's records and verdict: campaign.json, an earlier run's document, the gate on the new head's
capture, the analysis rows of its cells, and the verdict document written as RAW/<campaign>/adaptations/<id>.json
(analysis.adaptation.confirm decides; the flow passes its verdict in)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from artifacts import layout
from artifacts.store import read_json
from specgauge.errors import InputError
from specgauge.provenance import utc_now
from tasks import adapt
from tasks.adapt import HeadRef, PlainCaptures
from tasks.adaptation.deployment import Measurement
from tasks.adaptation.inputs import Inputs
from tasks.gate import GateRefusal, gate, write_verdict


def earlier_confirmation(inputs: Inputs) -> dict[str, Any] | None:
    """The document of an earlier run of the same inputs that finished (a re-run returns it); a failed one
    is refused: the document is written once, a new attempt is a new confirmation."""
    earlier = adapt.earlier_adaptation(inputs.campaign_dir(), inputs.adaptation_id)
    if earlier is not None and earlier.get("status") != "ok":
        raise InputError(
            f"confirmation {inputs.adaptation_id} failed earlier ({earlier.get('error')}); run it again with a "
            "label (--label) for a new confirmation"
        )
    return earlier


def record_confirmation_campaign(inputs: Inputs) -> Path:
    """campaign.json of the confirmation (once); returns RAW/<campaign_id>."""
    return adapt.record_adaptation_campaign(
        inputs.campaign_dir(),
        inputs.campaign_id,
        inputs.spec,
        name=f"{inputs.spec.name}-adapt",
        spec_sha256=inputs.spec_sha256,
        label=inputs.label,
        slot=inputs.slot,
        variant=inputs.variant.name,
        blocks=inputs.blocks,
        cells=[p.cell_id for b in inputs.blocks for p in inputs.cell_plans(b)],
        captures=[inputs.capture_id] if inputs.gate else [],
    )


def gate_new_head(
    inputs: Inputs, directory: Path, plain: PlainCaptures | None, error: str | None
) -> dict[str, Any]:
    """The gate on the new head's capture against plain; a refusal or missing input is recorded, not raised."""
    if error is not None or plain is None:
        return {"error": error or "no plain captures", "capture_id": inputs.capture_id}
    treatment = layout.capture_dir(directory, inputs.capture_id)
    try:
        verdict = gate((plain.base, treatment), list(plain.controls))
    except GateRefusal as exc:
        return {
            "error": f"gate refused: {exc}",
            "capture_id": inputs.capture_id,
            "plain_campaign_id": plain.campaign_id,
        }
    path = layout.verdict_file(directory, verdict.verdict_id)
    if not path.exists():
        write_verdict(verdict, directory)
    return {
        "verdict_id": verdict.verdict_id,
        "passed": verdict.passed,
        "outcome": verdict.outcome,
        "claim": verdict.claim,
        "plain_campaign_id": plain.campaign_id,
        "capture_id": inputs.capture_id,
    }


def cell_rows(
    directory: Path, results: list[adapt.BlockResult]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The analysis frames' rows: each block's cells as their latest attempt's summary recorded them, and
    their requests that carry vLLM's per-request acceptance (analysis.adaptation.REQUEST_ROW_SCHEMA: the
    measured phase, ok, spec_steps > 0). None from a requests.parquet written before those columns existed,
    nor from requests the engine gave no acceptance for (null: plain, older vLLM)."""
    rows = []
    requests = []
    cells = layout.cells_dir(directory)
    for result in results:
        for cell_id, status in result.cells:
            attempt = layout.cell_attempts(cells, cell_id)[-1]
            rows.append(_cell_row(attempt, result.block, cell_id, status))
            where = {k: rows[-1][k] for k in ("cell_id", "head", "repeat", "stratum", "load_label")}
            requests += [{**where, **r} for r in _acceptance_requests(attempt)]
    return rows, requests


def _cell_row(attempt: Path, block: adapt.Block, cell_id: str, status: str) -> dict[str, Any]:
    summary = read_json(attempt / layout.SUMMARY)
    meta = read_json(attempt / layout.META)
    spec = summary.get("speculation") or {}
    tpot = ((summary.get("latency_s") or {}).get("tpot") or {}).get("p50")
    counts = summary.get("requests") or {}
    drafter = (meta.get("deployment") or {}).get("drafter") or {}
    return {
        "cell_id": cell_id,
        "head": block.head,
        "repeat": block.repeat,
        "stratum": block.stratum,
        "load_label": cell_id.rsplit(".", 1)[-1],
        "status": status,
        "requests_ok": counts.get("ok"),
        "requests_total": counts.get("total"),
        "mean_acceptance_length": spec.get("mean_acceptance_length"),
        "output_throughput_tok_s": summary.get("output_throughput_tok_s"),
        "tpot_p50_s": tpot,
        "drafter_sha256": drafter.get("sha256"),
    }


def _acceptance_requests(attempt: Path) -> list[dict[str, Any]]:
    """The attempt's measured, successful requests with vLLM's acceptance (none from an older file)."""
    import polars as pl

    wanted = ("prompt_id", "phase", "ok", "spec_steps", "spec_accepted_tokens")
    path = attempt / layout.REQUESTS
    if not path.exists() or not set(wanted) <= set(pl.read_parquet_schema(path)):
        return []
    measured = pl.read_parquet(path, columns=list(wanted)).filter(
        (pl.col("phase") == "measured")
        & pl.col("ok").fill_null(False)
        & (pl.col("spec_steps") > 0)
        & pl.col("spec_accepted_tokens").is_not_null()
        & pl.col("prompt_id").is_not_null()
    )
    return measured.select("prompt_id", "spec_steps", "spec_accepted_tokens").to_dicts()


def hash_notes(rows: list[dict[str, Any]], heads: dict[str, HeadRef]) -> list[str]:
    """Cells whose recorded drafter hash is not the head the schedule had serving (a swap the cell's facts
    did not see): named, so that a reader can tell."""
    notes = []
    for row in rows:
        expected = heads[row["head"]].sha256
        if row["drafter_sha256"] and expected and row["drafter_sha256"] != expected:
            notes.append(
                f"{row['cell_id']}: its facts name drafter {row['drafter_sha256'][:12]}, the {row['head']} head "
                f"is {expected[:12]}"
            )
    return notes


def write_verdict_document(
    inputs: Inputs,
    directory: Path,
    measured: Measurement,
    gate_facts: dict[str, Any] | None,
    rows: list[dict[str, Any]],
    verdict: dict[str, Any],
) -> dict[str, Any]:
    """The confirmation's document with the benefit rule's `verdict` on its cell `rows` (cell_rows), written
    once; returned with its path."""
    result = measured.schedule
    document = {
        "adaptation_id": inputs.adaptation_id,
        "campaign_id": inputs.campaign_id,
        "deployment_id": measured.deployment_id,
        "variant": inputs.variant.name,
        "target_stratum": inputs.target_stratum,
        "strata": inputs.strata,
        "loads": inputs.loads,
        "repeats": inputs.repeats,
        "seed": inputs.seed,
        "min_effect": inputs.rule.min_effect,
        "max_harm": inputs.rule.max_harm,
        "confidence": inputs.rule.confidence,
        "gain_metric": inputs.rule.gain_metric,
        "old_head": inputs.old.facts(),
        "new_head": inputs.new.facts(),
        "schedule": [b.facts() for b in result.blocks],
        "swaps": result.swaps,
        "swapped_back": result.swapped_back,
        "final_sha256": result.final_sha256,
        "gate": gate_facts,
        **verdict,
        "notes": hash_notes(rows, {"old": inputs.old, "new": inputs.new}),
        "status": "ok" if measured.error is None and result.error is None else "failed",
        "error": result.error or measured.error,  # the schedule's error names a failed swap-back too
        "started_utc": measured.started_utc,
        "ended_utc": utc_now(),
    }
    path = adapt.write_adaptation(directory, document)
    document["path"] = str(path)
    return document
