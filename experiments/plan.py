"""From a spec to a campaign plan: the campaign id, which deployments to launch in which order, and the
cells each deployment runs. Pure and deterministic: the same spec (and label) gives the same plan, which is
what lets a re-run resume."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from artifacts import ids
from experiments.spec import DecisionSpec, ExperimentSpec, ValiditySpec, Variant
from specgauge.errors import SpecError
from specgauge.names import SAFE_NAME_MAX, safe_name_problem
from workloads.schema import Corpus, load_corpus


@dataclass(frozen=True)
class CellPlan:
    cell_id: str
    workload: str  # stratum
    mode: str  # "closed" or "open"
    concurrency: int | None
    rate: float | None
    corpus_file: str

    @property
    def load_label(self) -> str:
        return ids.load_label(self.mode, self.concurrency, self.rate)


@dataclass(frozen=True)
class SearchPlan:
    """A capacity search a deployment runs after its cells (spec.capacity; tasks/capacity.py)."""

    search_id: str  # <variant>.r<repeat>.<stratum>: its points are cells <search_id>.rate<R>
    workload: str  # stratum
    corpus_file: str


@dataclass(frozen=True)
class DeploymentPlan:
    deployment_id: str
    variant: Variant
    repeat: int
    position: int  # order of launch within the campaign
    cells: tuple[CellPlan, ...]
    captures: tuple[str, ...] = ()  # capture ids to take on this deployment
    search: SearchPlan | None = None
    role: str = "arm"  # "arm" (measured variant) or "control" (extra plain launch for the gate)


@dataclass(frozen=True)
class GatePlan:
    """What the correctness gate compares: each speculative variant's first repeat (`treatments`: variant,
    capture) against plain's first capture (`plain`), within the envelope of the plain-vs-plain `controls`
    (the same deployment captured again, and separately launched plain deployments)."""

    plain: str
    treatments: tuple[tuple[str, str], ...]
    controls: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class CampaignPlan:
    campaign_id: str
    spec_sha256: str
    label: str | None
    orders: tuple[tuple[str, ...], ...]  # variant order per repeat (randomised, recorded)
    deployments: tuple[DeploymentPlan, ...]
    corpora: dict[str, Corpus] = field(default_factory=dict, compare=False)
    gate: GatePlan | None = None  # None when the spec captures nothing

    def cells(self) -> list[tuple[DeploymentPlan, CellPlan]]:
        return [(d, c) for d in self.deployments for c in d.cells]

    def searches(self) -> list[SearchPlan]:
        return [d.search for d in self.deployments if d.search is not None]

    def blocks(self) -> list[tuple[DeploymentPlan, ...]]:
        """The repeat blocks, in launch order: each repeat's slots in their recorded order (one node runs a
        block, so its speedups are paired within a node), then each gate control on its own."""
        arms: dict[int, list[DeploymentPlan]] = {}
        for d in self.deployments:
            if d.role == "arm":
                arms.setdefault(d.repeat, []).append(d)
        controls = [(d,) for d in self.deployments if d.role != "arm"]
        return [tuple(slots) for _, slots in sorted(arms.items())] + controls


def gated(spec: ExperimentSpec, variant: Variant) -> bool:
    """Whether the correctness gate compares this variant's outputs with plain's: not a lossy one, greedy, and
    served like the reference plain variant (the gate compares greedy outputs at the campaign's first sampling
    and layout; the other settings of a sweep are measured for speed)."""
    return (
        not lossy_by_design(variant)
        and not variant.aa_control  # measured for speed only: the gate has its own plain controls
        and spec.sampling_of(variant).greedy
        and spec.reference_setting(variant)
    )


def lossy_by_design(variant: Variant) -> bool:
    """Synthetic acceptance keeps drafts the target would reject: its outputs are not meant to match plain's,
    so it is neither captured nor gated (it measures cost, not correctness)."""
    return variant.synthetic_acceptance_length is not None


def gate_plan(spec: ExperimentSpec, deployments: tuple[DeploymentPlan, ...]) -> GatePlan:
    """The gate's pairs, from the captures the deployments take (plan_campaign decides those)."""
    plain = spec.plain
    base = f"{plain.name}.r0"
    treatments = tuple(
        (d.variant.name, f"{d.variant.name}.r0")
        for d in deployments
        if d.role == "arm" and d.repeat == 0 and d.variant.speculative and gated(spec, d.variant)
    )
    controls = tuple(
        (base, capture)
        for d in deployments
        if d.variant.name == plain.name
        for capture in d.captures
        if capture != base
    )
    return GatePlan(plain=base, treatments=treatments, controls=controls)


def searched(spec: ExperimentSpec, variant: Variant) -> bool:
    """Whether the spec's capacity search runs on this variant's deployments: every variant but the synthetic
    ones, or those `capacity.variants` names (a swept variant's copies answer to its name)."""
    if spec.capacity is None or lossy_by_design(variant) or variant.aa_control:
        return False
    names = spec.capacity.variants
    return names is None or any(variant.name == n or variant.name.startswith(f"{n}-") for n in names)


def search_stratum(spec: ExperimentSpec, corpora: dict[str, Corpus]) -> tuple[str, str]:
    """(stratum, corpus file) the capacity search loads: `capacity.workload`, else the first stratum."""
    assert spec.capacity is not None
    for ref in spec.workloads:
        strata = ref.strata or tuple(corpora[ref.file].strata)
        wanted = spec.capacity.workload or strata[0]
        if wanted in strata:
            return wanted, ref.file
    raise SpecError(f"capacity.workload: no workload of the spec has the stratum {spec.capacity.workload!r}")


def spec_digest(spec: ExperimentSpec) -> str:
    from specgauge.redact import redact_data

    # Secrets redacted first: the digest is written beside the redacted spec (a weak key must not be
    # confirmable by guessing against it), and a rotated key keeps the campaign's id.
    data = redact_data(spec.model_dump(mode="json"))
    # Fields added after specs were written, left out while unused: those specs keep their campaign ids.
    if not data["layouts"]:
        del data["layouts"]
    if data["capacity"] is None:
        del data["capacity"]
    # The traffic profile weighs loads in the decision, it measures nothing: never in the id
    data["decision"]["traffic"] = None
    for section, model in (("validity", ValiditySpec), ("decision", DecisionSpec)):
        if data[section] == model().model_dump(mode="json"):
            del data[section]
    if "decision" in data:
        del data["decision"]["traffic"]
        # the verification's cap and A/A arm, added later: at their defaults they keep the ids of older sweeps
        for name in ("max_launches", "verify_aa_control"):
            if data["decision"][name] == DecisionSpec.model_fields[name].default:
                del data["decision"][name]
    if "validity" in data:  # limits added after specs set other validity fields: left out at their defaults
        for name in ("min_concurrency_fill", "max_steal_share"):
            if data["validity"][name] == ValiditySpec.model_fields[name].default:
                del data["validity"][name]
    del data["analysis"]  # how results are read, not what is measured
    if data["target"]["per_request_acceptance"]:
        del data["target"]["per_request_acceptance"]
    for variant in data["variants"]:
        for axis in ("sampling", "layout"):
            if variant[axis] is None:
                del variant[axis]
        if not variant["aa_control"]:
            del variant["aa_control"]
        if not variant.get("hot_swap", True):
            del variant["hot_swap"]
        if variant.get("draft_layers", 0) is None:  # added with the shallow-drafters study (issue 33)
            del variant["draft_layers"]
    # How many blocks run at once changes when results arrive, not what is measured: a campaign resumes
    # under another setting, and specs written before the field keep their ids.
    data.pop("parallel_deployments", None)
    if data["load"].get("workers") == 1:  # one client process: how every spec ran before `load.workers`
        del data["load"]["workers"]
    if (
        data["load"].get("cluster", 0) is None
    ):  # load from this host: how every spec ran before `load.cluster`
        del data["load"]["cluster"]
    # Whether short cells may run is a permission, not a measurement; a launch's engine warm-up (on by default,
    # unmeasured) and an unset requests_per_slot keep the ids of specs written before those fields.
    data["load"].pop("allow_short_cells", None)
    for name in ("requests_per_slot", "min_requests", "window_s"):
        if data["load"].get(name, 0) is None:
            del data["load"][name]
    if data["load"].get("engine_warmup") is True:
        del data["load"]["engine_warmup"]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def campaign_id_for(spec: ExperimentSpec, label: str | None = None) -> str:
    # The label becomes part of directory names, deployment ids and job names on clusters: the names rule.
    # Shown whole: the user typed it (names.py shortens values that come from files).
    if label and safe_name_problem(label, "label"):
        raise SpecError(
            f"label {label!r} may only contain letters, digits, '.', '_' and '-', start with a letter or "
            f"digit, and be at most {SAFE_NAME_MAX} characters (names become folder names and reach shell "
            "commands)"
        )
    return ids.campaign_id(spec.name, spec_digest(spec), label)


def resolve_repo_path(path: str, base: Path | None = None) -> Path:
    from specgauge.settings import REPO_ROOT

    candidate = Path(path)
    if candidate.is_absolute():
        return candidate
    for root in (base, REPO_ROOT, Path.cwd()):
        if root is not None and (root / candidate).exists():
            return root / candidate
    return REPO_ROOT / candidate


# A campaign's size, bounded before the plan is expanded: far above any real campaign (a cluster sweep of
# 50 variants x 10 repeats x 5 strata x 10 loads is 25,000 cells), far below one that plans for minutes.
MAX_LAUNCHES = 10_000
MAX_CELLS = 200_000


def check_campaign_size(spec: ExperimentSpec, cells_per_launch: int) -> None:
    """SpecError when the campaign would launch or measure more than the bounds, before it is expanded."""
    launches = spec.max_repeats * len(spec.variants)
    cells = launches * cells_per_launch
    if launches > MAX_LAUNCHES or cells > MAX_CELLS:
        raise SpecError(
            f"the campaign is too large to plan: {spec.max_repeats} repeats x {len(spec.variants)} "
            f"variants = {launches:,} launches (at most {MAX_LAUNCHES:,}) of {cells_per_launch:,} cells "
            f"each = {cells:,} cells (at most {MAX_CELLS:,}); split it into several specs"
        )


def plan_campaign(spec: ExperimentSpec, label: str | None = None) -> CampaignPlan:
    campaign_id = campaign_id_for(spec, label)
    corpora: dict[str, Corpus] = {}
    cell_templates: list[tuple[str, str, str, int | None, float | None]] = []
    for ref in spec.workloads:
        corpus = load_corpus(resolve_repo_path(ref.file))
        corpora[ref.file] = corpus
        strata = ref.strata or tuple(corpus.strata)
        missing = sorted(set(strata) - set(corpus.strata))
        if missing:
            raise SpecError(
                f"workloads: {ref.file} has no stratum {', '.join(missing)} (it has {corpus.strata})"
            )
        for stratum in strata:
            for c in spec.load.concurrencies:
                cell_templates.append((ref.file, stratum, "closed", c, None))
            for r in spec.load.rates:
                cell_templates.append((ref.file, stratum, "open", None, r))
    check_campaign_size(spec, len(cell_templates))
    if spec.capture.enabled:
        corpora[spec.capture.corpus] = load_corpus(resolve_repo_path(spec.capture.corpus))

    stratum_file = search_stratum(spec, corpora) if spec.capacity is not None else None
    rng = random.Random(spec.seed)
    orders: list[tuple[str, ...]] = []
    deployments: list[DeploymentPlan] = []
    for repeat in range(spec.max_repeats):
        names = [v.name for v in spec.variants]
        rng.shuffle(names)  # spread drift over variants instead of always measuring plain first
        orders.append(tuple(names))
        for name in names:
            variant = next(v for v in spec.variants if v.name == name)
            cells = tuple(
                CellPlan(
                    cell_id=ids.cell_id(name, repeat, stratum, ids.load_label(mode, c, r)),
                    workload=stratum,
                    mode=mode,
                    concurrency=c,
                    rate=r,
                    corpus_file=file,
                )
                for file, stratum, mode, c, r in cell_templates
            )
            captures: tuple[str, ...] = ()
            # The gate judges each speculative variant's first repeat against plain; plain's first two launches
            # are captured, the second as the cross-deployment control (captures once per arm, not per launch:
            # greedy outputs do not change between launches of one config, and each capture costs a launch time).
            if (
                spec.capture.enabled
                and (repeat == 0 or (variant.baseline and repeat == 1))
                and gated(spec, variant)
            ):
                captures = (ids.capture_id(name, repeat),)
                if variant.baseline and repeat == 0:
                    captures += (ids.repeat_capture_id(name, repeat),)  # same-deployment: the first control
            search = None
            if stratum_file is not None and searched(spec, variant):
                stratum, file = stratum_file
                search = SearchPlan(f"{name}.r{repeat}.{stratum}", stratum, file)
            deployments.append(
                DeploymentPlan(
                    deployment_id=ids.slot_id(campaign_id, name, repeat),
                    variant=variant,
                    repeat=repeat,
                    position=len(deployments),
                    cells=cells,
                    captures=captures,
                    search=search,
                )
            )
    if spec.capture.enabled:
        for n in range(spec.capture.plain_controls):
            deployments.append(
                DeploymentPlan(
                    deployment_id=ids.control_slot_id(campaign_id, spec.plain.name, n + 1),
                    variant=spec.plain,
                    repeat=0,
                    position=len(deployments),
                    cells=(),
                    captures=(ids.control_capture_id(spec.plain.name, n + 1),),
                    role="control",
                )
            )
    return CampaignPlan(
        campaign_id=campaign_id,
        spec_sha256=spec_digest(spec),
        label=label,
        orders=tuple(orders),
        deployments=tuple(deployments),
        corpora=corpora,
        gate=gate_plan(spec, tuple(deployments)) if spec.capture.enabled else None,
    )
