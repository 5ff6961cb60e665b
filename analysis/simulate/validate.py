"""Simulated against served: the replay of each speculative capture's own configuration, next to vLLM's
counters over exactly those requests.

A speculative capture sends its prompts one at a time (no batching), greedy, and records the deltas of
vLLM's spec-decode counters around them (CaptureMeta.speculation). Replaying the same method and depth
(chain of k) over the same outputs must reproduce those counters; the relative error of the mean
acceptance length is the simulator's credibility figure (target: within 5% per served configuration).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from analysis.simulate.captures import CaptureInput
from analysis.simulate.proposers import Proposer
from analysis.simulate.replay import Counters
from analysis.simulate.run import DrafterSettings, proposers_for, simulate_shapes
from analysis.simulate.shapes import Chain
from experiments.methods import REGISTRY

# vLLM method -> the proposer that mirrors it (each method's `proposer` in experiments/methods.py).
PROPOSER_OF_METHOD = REGISTRY.proposers()
TARGET_RELATIVE_ERROR = 0.05


def served_chain(method: str, k: int) -> Chain:
    """The shape a served configuration is: its method's proposer drafting a chain of its k."""
    return Chain(proposers=(PROPOSER_OF_METHOD[method],), params=(("k", k),))


@dataclass(frozen=True)
class Validation:
    """One served configuration: vLLM's counters and the replay's, over the same requests."""

    capture_id: str
    variant: str
    method: str
    k: int
    requests: int
    served: dict[str, object]
    simulated: Counters
    exact_mirror: bool  # False where the proposer is an approximation (suffix)

    @property
    def served_mal(self) -> float | None:
        value = self.served.get("mean_acceptance_length")
        return float(value) if isinstance(value, int | float) else None

    @property
    def relative_error(self) -> float | None:
        sim, served = self.simulated.mean_acceptance_length, self.served_mal
        if sim is None or not served:
            return None
        return (sim - served) / served

    def served_per_position(self) -> list[float]:
        per = self.served.get("acceptance_rate_per_position") or {}
        if not isinstance(per, dict):
            return []
        return [float(per[key]) for key in sorted(per, key=int)]

    def row(self) -> dict[str, object]:
        error = self.relative_error
        return {
            "capture_id": self.capture_id,
            "variant": self.variant,
            "method": self.method,
            "k": self.k,
            "requests": self.requests,
            "served_drafts": self.served.get("drafts"),
            "simulated_drafts": self.simulated.drafts,
            "served_draft_tokens": self.served.get("draft_tokens"),
            "simulated_draft_tokens": self.simulated.draft_tokens,
            "served_accepted_tokens": self.served.get("accepted_tokens"),
            "simulated_accepted_tokens": self.simulated.accepted,
            "served_mean_acceptance_length": self.served_mal,
            "simulated_mean_acceptance_length": self.simulated.mean_acceptance_length,
            "relative_error": error,
            "within_target": None if error is None else abs(error) <= TARGET_RELATIVE_ERROR,
            "served_per_position": self.served_per_position(),
            "simulated_per_position": self.simulated.rate_per_position()[: self.k],
            "exact_mirror": self.exact_mirror,
        }


VALIDATION_SCHEMA = {
    "capture_id": pl.String,
    "variant": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "requests": pl.Int64,
    "served_drafts": pl.Int64,
    "simulated_drafts": pl.Int64,
    "served_draft_tokens": pl.Int64,
    "simulated_draft_tokens": pl.Int64,
    "served_accepted_tokens": pl.Int64,
    "simulated_accepted_tokens": pl.Int64,
    "served_mean_acceptance_length": pl.Float64,
    "simulated_mean_acceptance_length": pl.Float64,
    "relative_error": pl.Float64,
    "within_target": pl.Boolean,
    "served_per_position": pl.List(pl.Float64),
    "simulated_per_position": pl.List(pl.Float64),
    "exact_mirror": pl.Boolean,
}


def validation_frame(validations: Sequence[Validation]) -> pl.DataFrame:
    return pl.DataFrame([v.row() for v in validations], schema=VALIDATION_SCHEMA, orient="row")


def validatable(item: CaptureInput) -> bool:
    """A capture whose served counters can be replayed: a known method, a depth, counters without error."""
    speculation = item.speculation
    return (
        item.method in PROPOSER_OF_METHOD
        and bool(item.variant.get("k"))
        and isinstance(speculation, dict)
        and "error" not in speculation
        and bool(speculation.get("drafts"))
    )


def validate_capture(
    item: CaptureInput,
    settings: DrafterSettings,
    outputs: CaptureInput | None = None,
    proposers: Mapping[str, Proposer] | None = None,
) -> Validation:
    """Replay the capture's own method as a chain of its k over `outputs`' requests (default: its own,
    which are exactly the requests vLLM's counters cover)."""
    k = int(item.variant["k"])
    source = outputs or item
    (result,) = simulate_shapes(source, [served_chain(item.method, k)], settings, proposers)
    return Validation(
        capture_id=item.capture.capture_id,
        variant=str(item.variant.get("name")),
        method=item.method,
        k=k,
        requests=len(source.requests),
        served=dict(item.speculation or {}),
        simulated=result.total(),
        exact_mirror=PROPOSER_OF_METHOD[item.method] != "suffix",
    )


def validate_campaign(
    inputs: Sequence[CaptureInput], settings: DrafterSettings, outputs: CaptureInput | None = None
) -> list[Validation]:
    """Every speculative capture of a campaign with usable counters, simulated against served. The model
    drafters run once over every capture's distinct requests."""
    chosen = [item for item in inputs if validatable(item)]
    if not chosen:
        return []
    shapes = [served_chain(i.method, int(i.variant["k"])) for i in chosen]
    sources = [outputs or item for item in chosen]
    requests = [r for source in sources for r in source.requests]
    proposers = proposers_for(requests, shapes, settings, sources[0])
    return [validate_capture(item, settings, outputs, proposers) for item in chosen]
