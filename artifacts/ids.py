"""Every id of the raw tree, built and parsed in one place.

    campaign id    <spec name>-<first 8 hex of the spec's sha256>[-<label>]      synth-1a2b3c4d-nightly
    slot id        <campaign id>.<variant>.r<repeat>  or  .<plain>.ctl<n>        synth-1a2b3c4d.plain.r0
    launch id      <slot id>.l<n> (the n-th launch of that slot; its deployment directory)
    load label     c<C> (closed loop) or rate<R> (open loop, R as %g)            c4, rate2, rate0.5
    cell id        <variant>.r<repeat>.<workload>.<load label>                   plain.r0.chat.c4
    attempt dir    <cell id>.a<n> (the n-th attempt of a cell)                   plain.r0.chat.c4.a1
    capture id     <variant>.r<repeat>[.again]  or  <plain>.ctl<n>               plain.r0.again
    verdict id     <treatment variant>.<8 hex of its inputs>                     ngram-k3.0a1b2c3d
    profile id     <variant>.<workload or "all">.c<C>.<UTC stamp>
    adaptation id  <variant>.<target stratum>.<8 hex of its inputs>               eagle3-k3.shifted.0a1b2c3d
    decision file  <decision id>[.rev<n>] (its n-th revision; the first has no suffix) code-0a1b2c3d4e.rev2
    adapted cell   <variant>.<head>.r<repeat>.<workload>.<load label> (head old|new) eagle3-k3.new.r0.chat.c1

Variant names may contain '.', so parsers read from the right, where the shapes are fixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ------------------------------------------------------------------------------------------------ campaign


def campaign_id(spec_name: str, spec_sha256: str, label: str | None = None) -> str:
    return f"{spec_name}-{spec_sha256[:8]}" + (f"-{label}" if label else "")


# ------------------------------------------------------------------------------------- slots and launches


def slot_id(campaign: str, variant: str, repeat: int) -> str:
    """A measured deployment slot: one variant, one repeat."""
    return f"{campaign}.{variant}.r{repeat}"


def control_slot_id(campaign: str, variant: str, n: int) -> str:
    """The n-th extra launch of plain, captured as a cross-deployment control of the gate (n from 1)."""
    return f"{campaign}.{variant}.ctl{n}"


def profile_slot_id(campaign: str, variant: str) -> str:
    """The slot of a profiled launch (tasks.profile.run)."""
    return f"{campaign}.{variant}.profile"


def launch_id(slot: str, n: int) -> str:
    """The n-th launch of a slot (n from 1): each launch has its own, immutable deployment directory."""
    return f"{slot}.l{n}"


_DEPLOYMENT_TAIL = re.compile(r"(?:\.r(?P<repeat>\d+))?(?:\.ctl(?P<control>\d+))?(?:\.l(?P<launch>\d+))?$")


@dataclass(frozen=True)
class DeploymentId:
    """What a deployment id says: its slot, and whichever of repeat, control number and launch it has."""

    slot: str
    repeat: int | None
    control: int | None
    launch: int | None


def parse_deployment_id(deployment_id: str) -> DeploymentId:
    """Any deployment id (slot or launch; an ad-hoc endpoint's `<campaign>.<variant>.l<n>` too)."""
    tail = _DEPLOYMENT_TAIL.search(deployment_id)
    assert tail is not None  # every part is optional: it always matches, at worst empty
    launch = int(tail["launch"]) if tail["launch"] else None
    slot = deployment_id[: tail.start("launch") - 2] if launch is not None else deployment_id
    return DeploymentId(
        slot=slot,
        repeat=int(tail["repeat"]) if tail["repeat"] else None,
        control=int(tail["control"]) if tail["control"] else None,
        launch=launch,
    )


# ---------------------------------------------------------------------------------------- loads and cells


def load_label(mode: str | None, concurrency: int | None, rate: float | None) -> str:
    """`c<C>` for a closed loop, `rate<R>` (R as %g) for an open one; `rate?` when the rate is unknown."""
    if mode == "closed":
        return f"c{concurrency}"
    return f"rate{rate:g}" if rate is not None else "rate?"


def cell_id(variant: str, repeat: int, workload: str, load: str) -> str:
    """`load` is a load label (`load_label`)."""
    return f"{variant}.r{repeat}.{workload}.{load}"


_CELL_ID = re.compile(
    r"^(?P<variant>.+)\.r(?P<repeat>\d+)\.(?P<workload>[^.]+)\.(?P<load>c\d+|rate[0-9.e+-]+|rate\?)$"
)


@dataclass(frozen=True)
class CellId:
    variant: str
    repeat: int
    workload: str
    load: str  # the load label


def parse_cell_id(value: str) -> CellId | None:
    match = _CELL_ID.match(value)
    if match is None:
        return None
    return CellId(match["variant"], int(match["repeat"]), match["workload"], match["load"])


def attempt_name(cell: str, attempt: int) -> str:
    """The directory of a cell's attempt (attempts count from 1)."""
    return f"{cell}.a{attempt}"


_ATTEMPT = re.compile(r"^(?P<cell_id>.+)\.a(?P<attempt>\d+)$")


def parse_attempt_name(name: str) -> tuple[str, int] | None:
    """(cell id, attempt) of an attempt directory's name; None when the name is not one."""
    match = _ATTEMPT.match(name)
    return (match["cell_id"], int(match["attempt"])) if match else None


def decision_revision_name(decision_id: str, revision: int) -> str:
    """The file stem of a decision's revision (revisions count from 1, as attempts do; the first keeps the bare
    id, which decisions written before revisions have)."""
    return decision_id if revision == 1 else f"{decision_id}.rev{revision}"


_DECISION_REVISION = re.compile(r"^(?P<decision_id>.+)\.rev(?P<revision>[1-9]\d*)$")


def parse_decision_revision(name: str) -> tuple[str, int]:
    """(decision id, revision) of a decision file's stem."""
    match = _DECISION_REVISION.match(name)
    return (match["decision_id"], int(match["revision"])) if match else (name, 1)


# ----------------------------------------------------------------------------- captures, verdicts, profiles


def capture_id(variant: str, repeat: int) -> str:
    return f"{variant}.r{repeat}"


def repeat_capture_id(variant: str, repeat: int) -> str:
    """The same deployment captured a second time: the gate's same-deployment control."""
    return f"{capture_id(variant, repeat)}.again"


def control_capture_id(variant: str, n: int) -> str:
    """The capture of the n-th control launch (its slot is `control_slot_id`)."""
    return f"{variant}.ctl{n}"


def verdict_id(treatment_variant: str, digest: str) -> str:
    """`digest`: the hash of the verdict's inputs (tasks.gate.verdict_id_for), so a re-run finds it."""
    return f"{treatment_variant}.{digest[:8]}"


def profile_id(variant: str, workload: str | None, concurrency: int, stamp: str) -> str:
    return f"{variant}.{workload or 'all'}.c{concurrency}.{stamp}"


# ------------------------------------------------------------------------------------------- adaptations


def adaptation_id(variant: str, target_stratum: str, digest: str) -> str:
    """An adaptation confirmation (tasks.adapt): `digest` hashes its inputs, so a re-run finds it."""
    return f"{variant}.{target_stratum}.{digest[:8]}"


def adapted_cell_id(variant: str, head: str, repeat: int, workload: str, load: str) -> str:
    """A cell measured while `head` (old | new) served on a hot-swap deployment: the head is part of the
    cell's variant part, so both heads' cells of one repeat, stratum and load have their own ids."""
    return cell_id(f"{variant}.{head}", repeat, workload, load)


# ---------------------------------------------------------------------------------------------- drafters

DRAFTER_PREFIX = "dr-"


def drafter_id(inputs_sha256: str) -> str:
    """A trained head (tasks.drafters.training): its id hashes its inputs (target, parent, data,
    hyperparameters), so a re-run with the same inputs finds the finished artifact and reuses it."""
    return f"{DRAFTER_PREFIX}{inputs_sha256[:12]}"


def is_drafter_id(value: str) -> bool:
    rest = value.removeprefix(DRAFTER_PREFIX)
    return value.startswith(DRAFTER_PREFIX) and len(rest) == 12 and all(c in "0123456789abcdef" for c in rest)
