"""The decision loop's documents (flows/decide.py): what was recommended from a sweep, what the launch of that
schedule measured at each load, the verdict, and a person's sign-off. Written once each (artifacts.store); a
decision recomputed with other figures (a resumed verification) is its next revision, a file of its own:

    RAW/<verification campaign>/decisions/<decision_id>[.rev<n>].json   DecisionDocument (analysis.verification)
    RAW/<verification campaign>/promotions/<decision_id>.json     PromotionDocument (tasks.promote)

The warehouse reads them into `decisions`, `decision_loads` and `promotions` (warehouse/kinds/decisions.py,
view `v_decision`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from artifacts import layout
from artifacts.documents.base import Configuration, Document, Flag, Number, Text, Time, Whole
from artifacts.documents.blocks import ToolFacts

# The verdict words, per load and for the decision (docs/decision.md): the same in the CLI, report, v_decision.
CONFIRMED = "confirmed"  # the interval clears 1 + min_effect (an off range: it lies above 1 - tolerance)
BELOW_MIN_EFFECT = "faster, below the minimum effect"  # the interval clears 1 only
REFUTED = "refuted"  # the interval lies below 1 (an off range: below 1 - tolerance)
INCONCLUSIVE = "inconclusive"  # anything else, and always without an interval or with a zero-width one
Outcome = Literal["confirmed", "faster, below the minimum effect", "refuted", "inconclusive"]
OUTCOMES: tuple[str, ...] = (CONFIRMED, BELOW_MIN_EFFECT, REFUTED, INCONCLUSIVE)
VALIDITY: tuple[str, ...] = ("valid", "invalid", "inconclusive")  # analysis.validity's verdicts


class DecisionLoad(Document):
    """One measured load of the verification: what the schedule does there and what the launch showed."""

    concurrency: Whole
    batch_from: Whole  # the schedule's range this load stands for (inclusive)
    batch_to: Whole
    k: Whole  # the schedule's depth in that range; 0: speculation off
    claim: Text  # what the recommendation claims here: "beats plain" (k > 0) or "no worse than plain" (k = 0)
    sweep_speedup: Number | None = (
        None  # the sweep's throughput speedup of the chosen family at its best depth
    )
    sweep_interval: Text = ""
    over_plain: Number | None = (
        None  # the launched schedule's throughput over plain, per-repeat geometric mean
    )
    over_plain_low: Number | None = None
    over_plain_high: Number | None = None
    over_plain_interval: Text = ""
    n_repeats: Whole = 0
    over_fixed: Number | None = None  # the schedule over the best fixed depth, paired per repeat
    over_fixed_low: Number | None = None
    over_fixed_high: Number | None = None
    outcome: Text  # one of OUTCOMES
    reason: Text


PLAIN_OPTION = "plain"  # the deployment option that runs no speculation: "deploy plain" (analysis.options)
SCHEDULE_OPTION = "schedule"  # the recommended schedule's option
OPTION_KINDS: tuple[str, ...] = ("plain", "fixed", "schedule")


class OptionLoad(Document):
    """One load of a deployment option: the share of the traffic there and the option's throughput over plain."""

    concurrency: Whole
    share: Number  # of the time the service spends at this load (the traffic profile, binned; the shares sum to 1)
    k: Whole  # the depth the option runs here; 0: speculation off (plain: 0)
    over_plain: Number | None = None  # throughput over plain (per-repeat geometric mean); None: unknown
    over_plain_low: Number | None = None  # its interval (None: none drawn)
    over_plain_high: Number | None = None
    n_repeats: Whole = 0
    source: Text  # where the figure comes from: "baseline", "verification <variant>", "sweep <variant>", ...
    refuted: Flag = False  # it carries traffic and its interval lies wholly below 1 - tolerance


class DeploymentOption(Document):
    """One way to deploy for every load at once (analysis.options): plain, a fixed config of the sweep, or the
    recommended schedule with its off ranges at their measured cost, scored over the traffic profile."""

    name: Text  # PLAIN_OPTION, "schedule" (the recommended one) or the spec variant's name
    kind: Text  # one of OPTION_KINDS
    description: Text
    speculative_config: dict[str, Any] | None = None  # what to deploy (None: plain)
    loads: list[OptionLoad]
    gain: Number | None = None  # traffic-weighted geometric mean of over_plain; None: unknown
    gain_low: Number | None = None  # its interval (None: none drawn)
    gain_high: Number | None = None
    gain_interval: Text = ""  # how the interval was drawn, or why there is none
    worst_concurrency: Whole | None = None  # the load with traffic where over_plain is lowest
    worst: Number | None = None
    worst_low: Number | None = None
    worst_high: Number | None = None
    eligible: Flag = False  # may be chosen: its gain clears 1 + min_effect by its interval, no load refuted
    reason: Text = ""  # why (not)


class DecisionDocument(Configuration):  # a target and variant: redacted when written
    """decisions/<decision_id>.json: one recommendation and its verification (analysis.verification.write_decision)."""

    decision_id: Text
    revision: Whole = 1  # recomputed with other figures: a new file (ids.decision_revision_name)
    campaign_id: Text  # the verification campaign (the file lives under it)
    source_campaign_id: Text  # the sweep the recommendation came from
    workload: Text
    family: Text  # method and drafter, e.g. "eagle3 models/twin-eagle3"
    method: Text
    schedule: list[list[Whole]]  # vLLM's num_speculative_tokens_per_batch_size: [[from, to, k], ...]
    speculative_config: dict[str, Any] | None = None  # None: speculation off at every load
    variant: dict[str, Any] | None = None  # the schedule as a spec variant entry (experiments.spec.Variant)
    target: dict[str, Any]  # the spec's target entry (experiments.spec.TargetSpec) it was measured on
    verification_spec: Text  # the verification campaign's spec file (launcher and the rest)
    fixed_k: Whole
    tolerance: Number  # an off range is "no worse than plain" while the schedule keeps above 1 - tolerance
    confidence: Number
    loads: list[DecisionLoad]
    outcome: Text  # from the loads' verdicts (analysis.recommend.overall, docs/decision.md)
    launches: Whole | None = None  # launches per arm the verification took (its repeat blocks); None: none
    max_launches: Whole | None = None  # the most it could take (decision.max_launches); None: a fixed count
    validity: Text | None = None  # the verification campaign's verdict (analysis.validity); None: not judged
    validity_reasons: Text = ""
    gate_passed: Flag | None = None  # the schedule's own greedy-correctness gate in the verification campaign
    gate_claim: Text | None = None
    summary: Text
    caveats: list[Text] = Field(default_factory=list)
    # Whole deployment options weighed by traffic (docs/decision.md "Deployment options and traffic"); empty
    # in decisions written before them
    traffic: Text = ""  # where the loads' shares came from: "equal over the measured loads" or the file
    options: list[DeploymentOption] = Field(default_factory=list)
    choice: Text = ""  # the option to deploy (an options[].name; PLAIN_OPTION: deploy plain)
    choice_reason: Text = ""
    created_utc: Time | None = None
    tool: ToolFacts | None = None

    def refusal(self) -> str | None:
        """Why this decision may not be promoted (None: it may): only a confirmed decision of a valid
        verification campaign is, since anything less was not shown to pay at every load."""
        reasons = []
        if self.choice == PLAIN_OPTION:  # the options weighed by traffic said: no speculation pays enough
            reasons.append(f"the decision is to deploy plain ({self.choice_reason})")
        if self.validity != "valid":
            shown = f" ({self.validity_reasons})" if self.validity_reasons else ""
            reasons.append(f"the verification campaign is {self.validity or 'not judged'}{shown}")
        if self.outcome != CONFIRMED:
            loads = [
                f"C={load.concurrency} {load.outcome}" for load in self.loads if load.outcome != CONFIRMED
            ]
            reasons.append(f"the decision is {self.outcome}" + (f" ({', '.join(loads)})" if loads else ""))
        return "; ".join(reasons) or None


class PromotionDocument(Configuration):  # engine arguments: redacted when written
    """promotions/<decision_id>.json: a person's answer to a decision (tasks.promote.write_promotion); the
    promoted config is what the nightly regression runs. Written once: a new answer needs a new decision."""

    decision_id: Text
    campaign_id: Text
    approved: Flag
    approver: Text
    note: Text = ""
    via: Text  # "prefect-ui" (a paused flow run resumed with input) or "cli"
    decision_revision: Whole = 1  # the revision of the decision that was answered
    override: Text = ""  # approved although the decision was not promotable: the approver's reason
    speculative_config: dict[str, Any] | None = None
    vllm_args: list[Text] = Field(default_factory=list)
    files: list[Text] = Field(
        default_factory=list
    )  # what was written for the team to deploy, relative to SPECGAUGE_HOME
    decided_utc: Time
    tool: ToolFacts | None = None


def read_decision(raw_dir: Path, decision_id: str) -> tuple[Path, DecisionDocument]:
    """A decision by id, its latest revision, from any campaign's folder under `raw_dir` (InputError when there
    is none)."""
    from artifacts.store import read_document
    from specgauge.errors import InputError

    found = sorted(
        (revision, str(path), path)
        for directory in sorted(Path(raw_dir).glob("*/"))
        for revision, path in layout.decision_revisions(directory, decision_id)
    )
    if not found:
        raise InputError(f"no decision {decision_id!r} under {raw_dir}")
    path = found[-1][2]
    return path, read_document(path, DecisionDocument)
