"""Everything a confirmation is defined by, resolved and checked before anything is launched: the spec and
its eagle3 variant, the old and new heads (hashed, checked against the EAGLE-3 contract), the strata and their
corpora, the load, the schedule, and the ids that make a re-run of the same inputs find its earlier run."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from artifacts import ids, layout
from experiments.adaptation import GAIN_METRICS, Rule
from experiments.plan import CellPlan, resolve_repo_path
from experiments.spec import ExperimentSpec, LoadSpec, Variant, load_spec
from specgauge.errors import InputError
from specgauge.settings import get_settings
from tasks import adapt
from tasks.adapt import Block
from tasks.drafters.contract import check_eagle3_head
from workloads.schema import Corpus, load_corpus


class AdaptationRequest(BaseModel):
    """What to confirm: the run form of the `confirm-adaptation` deployment (each field's description is its
    help). The flow, its cancellation hook (which reads the run's parameters) and `specgauge drafters
    confirm` build Inputs from it alike."""

    spec_path: str = Field(
        description="The experiment spec (target, the eagle3 variant, workloads, load, launcher)."
    )
    new_head: str = Field(
        description="The new head: a directory, or a drafter artifact id (RAW/drafters/<id>)."
    )
    target_stratum: str = Field(description="The stratum the head was adapted for (the rule's target).")
    old_head: str | None = Field(default=None, description="The old head. Empty: the variant's eagle_head.")
    variant: str | None = Field(default=None, description="The spec's eagle3 variant. Empty: the only one.")
    strata: list[str] | None = Field(
        default=None, description="Strata to measure. Empty: every stratum of the spec's workloads."
    )
    concurrencies: list[int] | None = Field(
        default=None, description="Closed-loop concurrencies instead of the spec's (e.g. 1)."
    )
    requests: int | None = Field(
        default=None, description="Measured requests per cell instead of the spec's."
    )
    repeats: int = Field(default=3, description="Passes over every (head, stratum) block.")
    # The rule's parameters, with its defaults (experiments/adaptation.py checks them).
    min_effect: float = Field(
        default=Rule.min_effect,
        description="Minimum gain on a stratum (0.10: the interval must lie above 1.10).",
    )
    max_harm: float = Field(
        default=Rule.max_harm, description="Largest loss another stratum may take (0.05)."
    )
    gain_metric: str = Field(default=Rule.gain_metric, description=f"One of {', '.join(GAIN_METRICS)}.")
    seed: int = Field(default=0, description="Seed of the block order.")
    plain_from: str | None = Field(
        default=None,
        description="A campaign whose plain captures the gate reuses (same target, corpus, sampling). Empty: "
        "two plain launches of this run.",
    )
    gate: bool = Field(default=True, description="Run the greedy-correctness gate with the new head serving.")
    label: str | None = Field(
        default=None, description="A run label: a new confirmation instead of resuming."
    )
    ingest: bool = Field(default=True, description="Load the raw artifacts into the warehouse afterwards.")

    def rule(self) -> Rule:
        """The benefit rule of the request; it refuses its own bad parameters (ValueError)."""
        return Rule(min_effect=self.min_effect, max_harm=self.max_harm, gain_metric=self.gain_metric)


class Inputs:
    """Everything the confirmation is defined by, resolved and checked before anything is launched."""

    def __init__(self, request: AdaptationRequest) -> None:
        self.rule = request.rule()  # its own bad parameters first, before the spec is read
        self.spec_path = resolve_repo_path(request.spec_path)
        self.spec: ExperimentSpec = load_spec(self.spec_path)
        chosen = adapt.adaptation_variant(self.spec, request.variant)
        old_value = request.old_head or chosen.eagle_head
        if not old_value:
            raise InputError(f"variant {chosen.name!r} names no eagle_head: give the old head")
        self.old = adapt.resolve_head(old_value, label="old")
        self.new = adapt.resolve_head(request.new_head, label="new")
        if self.old.sha256 == self.new.sha256:
            raise InputError(
                f"the new head {self.new.path} is the old head ({self.old.path}): nothing to confirm"
            )
        target_dir = resolve_repo_path(self.spec.target_of(chosen).model)
        for head in (self.old, self.new):  # a head that breaks the contract costs no engine start
            try:
                check_eagle3_head(target_dir, head.path)
            except InputError as exc:
                raise InputError(f"{head.label} head {head.path}: {exc}") from None
        self.variant: Variant = chosen.model_copy(update={"eagle_head": str(self.old.path)})
        self.corpora = strata_corpora(self.spec)
        self.strata = sorted(request.strata or self.corpora)
        unknown = [s for s in self.strata if s not in self.corpora]
        if unknown:
            raise InputError(
                f"strata {unknown} are not in the spec's workloads ({', '.join(sorted(self.corpora))})"
            )
        target_stratum = request.target_stratum
        if target_stratum not in self.strata:
            raise InputError(f"target stratum {target_stratum!r} is not among the strata {self.strata}")
        self.target_stratum = target_stratum
        update: dict[str, Any] = {}
        if request.concurrencies:
            update.update(concurrencies=tuple(request.concurrencies), rates=())
        if request.requests is not None:
            update["requests"] = request.requests
        self.load: LoadSpec = self.spec.load.model_copy(update=update) if update else self.spec.load
        self.repeats, self.seed = request.repeats, request.seed
        self.blocks = adapt.schedule(self.strata, self.repeats, self.seed)
        self.plain_from, self.gate, self.label = request.plain_from, request.gate, request.label
        self.loads = load_labels(self.load)
        digest = adapt.inputs_digest(
            {
                "spec": self.spec.model_dump(mode="json"),
                "variant": self.variant.name,
                "old": self.old.sha256,
                "new": self.new.sha256,
                "strata": self.strata,
                "target": target_stratum,
                "load": self.load.model_dump(mode="json"),
                "repeats": self.repeats,
                "seed": self.seed,
                "rule": asdict(self.rule),
                "plain_from": self.plain_from,
                "gate": self.gate,
            }
        )
        self.spec_sha256 = digest
        self.campaign_id = ids.campaign_id(f"{self.spec.name}-adapt", digest, self.label)
        self.adaptation_id = ids.adaptation_id(self.variant.name, target_stratum, digest)
        self.capture_id = ids.capture_id(f"{self.variant.name}.new", 0)
        self.slot = ids.slot_id(self.campaign_id, self.variant.name, 0)  # the one hot-swap deployment's

    def campaign_dir(self) -> Path:
        """RAW/<campaign_id> under the raw tree in use now."""
        return layout.campaign_dir(get_settings().raw_dir, self.campaign_id)

    def cell_plans(self, block: Block) -> list[CellPlan]:
        file, _ = self.corpora[block.stratum]
        plans = []
        for concurrency in self.load.concurrencies:
            label = ids.load_label("closed", concurrency, None)
            cell = ids.adapted_cell_id(self.variant.name, block.head, block.repeat, block.stratum, label)
            plans.append(CellPlan(cell, block.stratum, "closed", concurrency, None, file))
        for rate in self.load.rates:
            label = ids.load_label("open", None, rate)
            cell = ids.adapted_cell_id(self.variant.name, block.head, block.repeat, block.stratum, label)
            plans.append(CellPlan(cell, block.stratum, "open", None, rate, file))
        return plans


def strata_corpora(spec: ExperimentSpec) -> dict[str, tuple[str, Corpus]]:
    """stratum -> (workload file, its corpus) over the spec's workloads (a stratum in two files: refused)."""
    out: dict[str, tuple[str, Corpus]] = {}
    for ref in spec.workloads:
        corpus = load_corpus(resolve_repo_path(ref.file))
        for stratum in ref.strata or corpus.strata:
            if stratum in out and out[stratum][0] != ref.file:
                raise InputError(f"stratum {stratum!r} is in {out[stratum][0]} and {ref.file}: name it once")
            out[stratum] = (ref.file, corpus)
    return out


def load_labels(load: LoadSpec) -> list[str]:
    return [ids.load_label("closed", c, None) for c in load.concurrencies] + [
        ids.load_label("open", None, r) for r in load.rates
    ]
