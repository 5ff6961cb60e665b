"""Everything a confirmation is defined by, resolved and checked before anything is launched: the spec and
its eagle3 variant, the old and new heads (hashed, checked against the EAGLE-3 contract), the strata and their
corpora, the load, the schedule, and the ids that make a re-run of the same inputs find its earlier run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from artifacts import ids, layout
from experiments.adaptation import Rule
from experiments.plan import CellPlan, resolve_repo_path
from experiments.spec import ExperimentSpec, LoadSpec, Variant, load_spec
from specgauge.errors import InputError
from specgauge.settings import get_settings
from tasks import adapt
from tasks.adapt import Block
from tasks.drafters.contract import check_eagle3_head
from workloads.schema import Corpus, load_corpus

# The flow parameters Inputs takes as they are, and those that make its Rule.
_OPTIONS = (
    "old_head",
    "variant",
    "strata",
    "concurrencies",
    "requests",
    "repeats",
    "seed",
    "plain_from",
    "gate",
    "label",
)
_RULE = ("min_effect", "max_harm", "gain_metric")


class Inputs:
    """Everything the confirmation is defined by, resolved and checked before anything is launched."""

    def __init__(
        self,
        spec_path: str,
        new_head: str,
        *,
        target_stratum: str,
        old_head: str | None = None,
        variant: str | None = None,
        strata: list[str] | None = None,
        concurrencies: list[int] | None = None,
        requests: int | None = None,
        repeats: int = 3,
        seed: int = 0,
        rule: Rule = Rule(),
        plain_from: str | None = None,
        gate: bool = True,
        label: str | None = None,
    ) -> None:
        self.spec_path = resolve_repo_path(spec_path)
        self.spec: ExperimentSpec = load_spec(self.spec_path)
        chosen = adapt.adaptation_variant(self.spec, variant)
        old_value = old_head or chosen.eagle_head
        if not old_value:
            raise InputError(f"variant {chosen.name!r} names no eagle_head: give the old head")
        self.old = adapt.resolve_head(old_value, label="old")
        self.new = adapt.resolve_head(new_head, label="new")
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
        self.strata = sorted(strata or self.corpora)
        unknown = [s for s in self.strata if s not in self.corpora]
        if unknown:
            raise InputError(
                f"strata {unknown} are not in the spec's workloads ({', '.join(sorted(self.corpora))})"
            )
        if target_stratum not in self.strata:
            raise InputError(f"target stratum {target_stratum!r} is not among the strata {self.strata}")
        self.target_stratum = target_stratum
        update: dict[str, Any] = {}
        if concurrencies:
            update.update(concurrencies=tuple(concurrencies), rates=())
        if requests is not None:
            update["requests"] = requests
        self.load: LoadSpec = self.spec.load.model_copy(update=update) if update else self.spec.load
        self.repeats, self.seed, self.rule = repeats, seed, rule
        self.blocks = adapt.schedule(self.strata, repeats, seed)
        self.plain_from, self.gate, self.label = plain_from, gate, label
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
                "repeats": repeats,
                "seed": seed,
                "rule": asdict(rule),
                "plain_from": plain_from,
                "gate": gate,
            }
        )
        self.spec_sha256 = digest
        self.campaign_id = ids.campaign_id(f"{self.spec.name}-adapt", digest, label)
        self.adaptation_id = ids.adaptation_id(self.variant.name, target_stratum, digest)
        self.capture_id = ids.capture_id(f"{self.variant.name}.new", 0)
        self.slot = ids.slot_id(self.campaign_id, self.variant.name, 0)  # the one hot-swap deployment's

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any]) -> Inputs:
        """The Inputs of a confirm-adaptation run from its parameters (the flow's names; one left out takes
        its default): the flow and its cancellation hook, which reads the run's parameters, resolve alike."""
        options = {name: parameters[name] for name in _OPTIONS if name in parameters}
        rule = {name: parameters[name] for name in _RULE if name in parameters}
        return cls(
            parameters["spec_path"],
            parameters["new_head"],
            target_stratum=parameters["target_stratum"],
            rule=Rule(**rule),
            **options,
        )

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
