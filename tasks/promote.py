"""A person's answer to a decision (artifacts.documents): when approved, the files a team deploys the verified
speculation config with, rendered by the launchers' own code (tasks/launch/), and the promotion document.

    SPECGAUGE_HOME/promoted/<decision_id>/speculative-config.json   --speculative-config as vLLM takes it
                                         /vllm-serve.sh             the engine command (tasks.launch.command)
                                         /variant.yaml              the spec variant entry (nightly regression)
                                         /slurm.sbatch              the SLURM launcher's job script
                                         /sml.txt                   the `sml advanced` command (tasks.launch.sml)
    RAW/<verification campaign>/promotions/<decision_id>.json       PromotionDocument, written once

Nothing that may be secret is written: the target's environment (names only, in a comment), environment
variables of the launcher whose names look secret, and the values of options such as --api-key in the engine's
extra arguments (replaced by REDACTED), by specgauge.redact's one rule.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from artifacts import layout
from artifacts.documents import DecisionDocument, PromotionDocument
from artifacts.documents.decisions import PLAIN_OPTION, REFUTED, SCHEDULE_OPTION
from artifacts.store import atomic_dir, read_document, write_json_atomic
from experiments.spec import ExperimentSpec, SlurmLaunchSpec, SmlLaunchSpec, TargetSpec, Variant, load_spec
from specgauge.errors import ArtifactError, InputError
from specgauge.provenance import tool_facts, utc_now
from specgauge.redact import REDACTED, looks_secret, redact_args
from specgauge.settings import Settings
from tasks.launch.cluster import resolve_cluster
from tasks.launch.command import ENGINE_MODULE, served_name, vllm_args
from tasks.launch.config import SAFE_NAME, ClusterConfig
from tasks.launch.local import resolve_local
from tasks.launch.slurm import job_script
from tasks.launch.slurm_script import render_prefix
from tasks.launch.sml import framework_args, sml_command, unique_served_name
from tasks.launch.ssh import quote

PROMOTED = "promoted"  # SPECGAUGE_HOME/promoted/<decision_id>/
SPECULATIVE_CONFIG = "speculative-config.json"
SERVE_SCRIPT = "vllm-serve.sh"
VARIANT_FILE = "variant.yaml"
SLURM_SCRIPT = "slurm.sbatch"
SML_COMMAND = "sml.txt"
EXECUTABLE = (SERVE_SCRIPT, SLURM_SCRIPT)
SERVE_HOST = "0.0.0.0"
SERVE_PORT = 8000
# The served name's user segment: the sml launcher asks the login node (`id -un`); so does the written command.
_LOGIN_USER = "$(id -un)"
_PLACEHOLDER_USER = "user"  # stands for it while unique_served_name checks the other segments
_PLACEHOLDER_ENVIRONMENT = "ENVIRONMENT.toml"


# -- what is deployed --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Deployable:
    """The decision's target and variant as the files serve them, and what the files must say about it."""

    target: TargetSpec  # the layout applied, its environment left out, secret values redacted
    variant: Variant  # hot_swap off, secret values redacted
    header: list[str]  # comment lines every file starts with
    notes: list[str]  # comment lines the engine command's files add


def _validated(
    model: type[Variant] | type[TargetSpec], data: Any, decision: DecisionDocument, field: str
) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or field}: {e['msg']}" for e in exc.errors())
        raise InputError(f"decision {decision.decision_id}: {field}: {problems}") from None


def _same_config(decision: DecisionDocument, variant: Variant) -> None:
    """The decision's speculative_config must be its variant's (analysis.verification writes the drafter's path resolved
    against the repository, analysis.recommend.Recommendation.deployable_config)."""
    from experiments.plan import resolve_repo_path

    recorded, rendered = decision.speculative_config, variant.speculative_config()
    if recorded is None or rendered is None:
        same = recorded is None and rendered is None
    else:
        model = rendered.get("model")
        paths = {model, str(resolve_repo_path(model))} if model is not None else {None}
        same = {k: v for k, v in recorded.items() if k != "model"} == {
            k: v for k, v in rendered.items() if k != "model"
        } and recorded.get("model") in paths
    if not same:
        raise InputError(
            f"decision {decision.decision_id}: speculative_config {json.dumps(recorded)} is not its variant's "
            f"({json.dumps(rendered)}): the decision document is inconsistent"
        )


def deployable(decision: DecisionDocument, spec: ExperimentSpec) -> Deployable:
    """The decision's variant (the verification spec's plain variant when speculation is off everywhere) and
    target, served as the verification launched them (the variant's layout), without secrets."""
    if not SAFE_NAME.fullmatch(decision.decision_id):
        raise InputError(f"decision id {decision.decision_id!r} is not safe for file and job names")
    if decision.variant is None:
        variant = spec.plain
    else:
        variant = _validated(Variant, decision.variant, decision, "variant")
    _same_config(decision, variant)
    raw_target = _validated(TargetSpec, decision.target, decision, "target")
    target = spec.model_copy(update={"target": raw_target}).target_of(variant)

    header = [
        f"specgauge decision {decision.decision_id}: {decision.family} on {decision.workload}, "
        f"{decision.outcome} by launch",
        f"verified by campaign {decision.campaign_id} ({decision.verification_spec or 'spec path not recorded'}, "
        f"launcher {spec.launcher.kind})",
    ]
    notes: list[str] = []
    if variant.hot_swap:  # a deployment must not open vLLM's dev endpoints (/collective_rpc)
        variant = variant.model_copy(update={"hot_swap": False})
        notes.append("hot_swap is off here: the verification served it with vLLM's dev endpoints open")
    if target.env:
        notes.append(
            "the target's environment is not written (its values may be secret): set "
            + ", ".join(sorted(target.env))
        )
    target_args, target_redacted = redact_args(target.extra_args)
    variant_args, variant_redacted = redact_args(variant.extra_args)
    if target_redacted or variant_redacted:
        notes.append(
            f"secret values replaced by {REDACTED}: "
            + ", ".join(dict.fromkeys(target_redacted + variant_redacted))
        )
    target = target.model_copy(update={"env": {}, "extra_args": target_args})
    variant = variant.model_copy(update={"extra_args": variant_args})
    launcher = spec.launcher
    patches = list(getattr(launcher, "patches", ()))  # the local launcher's vLLM overlays
    if getattr(launcher, "overlay", None):  # a cluster launcher's
        patches.append(str(launcher.overlay))
    if patches:
        notes.append(
            f"the verification ran vLLM patched ({', '.join(patches)}); these files run vLLM as installed"
        )
    return Deployable(target, variant, header, notes)


def _comments(*groups: Sequence[str]) -> str:
    """Shell/YAML comment lines (a value with a line break stays inside its comment)."""
    return "".join("# " + " ".join(line.splitlines()) + "\n" for group in groups for line in group)


def _cluster_settings(
    spec: ExperimentSpec, kind: type[SlurmLaunchSpec] | type[SmlLaunchSpec], cluster: ClusterConfig | None
) -> tuple[ClusterConfig, list[str]]:
    """The cluster settings the launcher of `kind` would use (tasks.launch.cluster.resolve_cluster): the spec's
    cluster section over `cluster` (a cluster block read by the caller) or the launcher's defaults."""
    section = spec.launcher if isinstance(spec.launcher, SlurmLaunchSpec | SmlLaunchSpec) else kind()
    notes = []
    if not isinstance(spec.launcher, SlurmLaunchSpec | SmlLaunchSpec):
        notes.append(
            f"the spec's launcher is {spec.launcher.kind}: rendered with the {kind().kind} launcher's defaults "
            "(tasks/launch/config.py ClusterConfig); set your cluster's partition, account, GPUs, paths"
        )
    elif cluster is None:
        named = f"cluster block {section.cluster!r} was not read" if section.cluster else "no cluster block"
        notes.append(
            f"{named}: the {kind().kind} launcher's defaults, overridden by the spec's launcher section"
        )
    settings = resolve_cluster(section, cluster or ClusterConfig())
    secret = sorted(name for name in settings.env if looks_secret(name))
    if secret:
        notes.append(f"launcher environment not written (may be secret): set {', '.join(secret)}")
        settings = settings.model_copy(
            update={"env": {k: v for k, v in settings.env.items() if k not in secret}}
        )
    return settings, notes


def _serve_script(spec: ExperimentSpec, found: Deployable) -> tuple[str, list[str]]:
    """vllm-serve.sh and its engine arguments. Paths resolve as the spec's launcher resolves them (local: the
    repository's absolute paths; clusters: as written)."""
    resolve = resolve_local if spec.launcher.kind == "local" else str
    args = vllm_args(
        found.target,
        found.variant,
        served_model_name=served_name(found.target, found.variant),
        host=SERVE_HOST,
        port=SERVE_PORT,
        resolve=resolve,
        measure=False,
    )
    text = (
        "#!/bin/bash\n"
        + _comments(found.header, found.notes)
        + f"exec {shlex.join(['python', '-m', ENGINE_MODULE, *args])}\n"
    )
    return text, args


def _speculative_config(args: Sequence[str]) -> dict[str, Any] | None:
    """The --speculative-config the engine is given (None: speculation off)."""
    flag = "--speculative-config"
    return json.loads(args[args.index(flag) + 1]) if flag in args else None


def _slurm_script(
    decision: DecisionDocument, spec: ExperimentSpec, found: Deployable, cluster: ClusterConfig | None
) -> str:
    """The SLURM launcher's job script (tasks.launch.slurm.job_script) for the deployment, run from a
    directory of its own under the cluster's work directory."""
    settings, notes = _cluster_settings(spec, SlurmLaunchSpec, cluster)
    remote = settings.remote_dir
    # The launcher expands ~ over SSH; the script takes the path relative to where it is submitted.
    remote = remote[2:] if remote.startswith("~/") else "." if remote == "~" else remote
    run_dir = f"{remote}/{PROMOTED}/{decision.decision_id}"
    notes.append(f"run directory {run_dir}: create it before sbatch (Slurm does not create log directories)")
    if settings.environment_toml:
        notes.append(
            f"the launcher uploads {settings.environment_toml} ({{arch}} = {settings.arch}) and names the upload "
            "here: give its path on the cluster"
        )
    prefix = render_prefix(settings.container_prefix, mounts=[], environment=settings.environment_toml)
    script = job_script(
        settings,
        found.target,
        found.variant,
        deployment_id=decision.decision_id,
        run_dir=run_dir,
        launch_prefix=prefix,
    )
    shebang, _, rest = script.partition("\n")
    return f"{shebang}\n" + _comments(found.header, notes, found.notes) + rest


def _sml_text(
    decision: DecisionDocument, spec: ExperimentSpec, found: Deployable, cluster: ClusterConfig | None
) -> str:
    """The sml launcher's `sml advanced` command (tasks.launch.sml.sml_command), quoted as its
    sml-command.txt, with the served name's user taken on the login node as the launcher does."""
    settings, notes = _cluster_settings(spec, SmlLaunchSpec, cluster)
    environment = settings.environment_toml
    if environment is None:
        environment = _PLACEHOLDER_ENVIRONMENT
        notes.append(f"no environment_toml: put your container environment TOML in place of {environment}")
    else:
        notes.append(
            f"the launcher uploads {environment} ({{arch}} = {settings.arch}) and passes the upload: give its "
            "path on the login node"
        )
    if settings.sml_env:
        notes.append(
            f"the launcher runs sml with {', '.join(sorted(settings.sml_env))} set (values not written)"
        )
    served = unique_served_name(
        _PLACEHOLDER_USER, settings.served_org, found.target, found.variant, stamp=decision.decision_id
    )
    words = sml_command(
        settings,
        environment=environment,
        args=framework_args(found.target, found.variant),
        served=served,
        generation=settings.sml_flags,
    )
    rest = served.split("/", 1)[1]
    line = " ".join(f'"{_LOGIN_USER}"/{quote(rest)}' if word == served else quote(word) for word in words)
    return _comments(found.header, notes, found.notes) + line + "\n"


def deploy_files(
    decision: DecisionDocument,
    spec: ExperimentSpec,
    *,
    cluster: ClusterConfig | None = None,
    notes: Sequence[str] = (),
) -> dict[str, str]:
    """File name -> text for a team to deploy the decision's config, rendered by the launchers' own code.
    `spec` is the verification campaign's spec; `cluster` the cluster block its launcher names, when the
    caller has read it (otherwise the SLURM/sml scripts take the launchers' defaults and say so); `notes`:
    comment lines of the caller's (without_refuted's changes)."""
    found = deployable(decision, spec)
    found = replace(found, notes=[*found.notes, *notes])
    serve, args = _serve_script(spec, found)
    entry = found.variant.model_dump(mode="json", exclude_defaults=True)
    variant_text = _comments(
        found.header, ["one entry of a campaign spec's `variants:` (the nightly regression runs it)"]
    ) + yaml.safe_dump(entry, sort_keys=False)
    return {
        SPECULATIVE_CONFIG: json.dumps(_speculative_config(args), indent=2) + "\n",
        SERVE_SCRIPT: serve,
        VARIANT_FILE: variant_text,
        SLURM_SCRIPT: _slurm_script(decision, spec, found, cluster),
        SML_COMMAND: _sml_text(decision, spec, found, cluster),
    }


def serve_args(files: dict[str, str]) -> list[str]:
    """The engine arguments in a vllm-serve.sh (after `python -m <ENGINE_MODULE>`)."""
    command = next(line for line in files[SERVE_SCRIPT].splitlines() if line.startswith("exec "))
    words = shlex.split(command)
    return words[words.index(ENGINE_MODULE) + 1 :]


# -- the promotion -----------------------------------------------------------------------------------------
def promoted_dir(home: Path, decision_id: str) -> Path:
    return Path(home) / PROMOTED / decision_id


def write_promotion(
    campaign_dir: Path,
    decision: DecisionDocument,
    spec: ExperimentSpec,
    *,
    approved: bool,
    approver: str,
    note: str,
    via: str,
    home: Path,
    cluster: ClusterConfig | None = None,
    override: str = "",
    notes: Sequence[str] = (),
) -> PromotionDocument:
    """Record a person's answer to `decision` once, at RAW/<campaign>/promotions/<decision_id>.json. Approved:
    first the deploy files under HOME/promoted/<decision_id>/ (whole or not at all). A second answer to the
    same decision is refused (InputError): a new answer needs a new decision."""
    path = layout.promotion_file(campaign_dir, decision.decision_id)
    if path.exists():
        raise InputError(
            f"decision {decision.decision_id} was answered already: {path} (a promotion is written once; "
            "a new answer needs a new decision)"
        )
    if not approver.strip():
        raise InputError(f"decision {decision.decision_id}: say who answers it (approver is empty)")
    home = Path(home)
    target = promoted_dir(home, decision.decision_id)
    files: list[str] = []
    args: list[str] = []
    config = decision.speculative_config
    if approved:
        if target.exists():
            raise InputError(
                f"decision {decision.decision_id}: {target} exists (promoted files are written once)"
            )
        rendered = deploy_files(decision, spec, cluster=cluster, notes=notes)
        args = serve_args(rendered)
        config = _speculative_config(args)
        with atomic_dir(target) as tmp:
            for name, text in rendered.items():
                (tmp / name).write_text(text)
                if name in EXECUTABLE:
                    (tmp / name).chmod(0o755)
        files = [str((target / name).relative_to(home)) for name in rendered]
    document = PromotionDocument(
        decision_id=decision.decision_id,
        campaign_id=decision.campaign_id,
        approved=approved,
        approver=approver,
        note=note,
        via=via,
        decision_revision=decision.revision,
        override=override,
        speculative_config=config,
        vllm_args=args,
        files=files,
        decided_utc=utc_now(),
        tool=tool_facts(),
    )
    try:
        write_json_atomic(path, document)
    except BaseException:
        if approved:  # files without their promotion would block the decision's promotion for good
            shutil.rmtree(target, ignore_errors=True)
        raise
    return document


def _promotions(home: Path) -> list[tuple[Path, PromotionDocument]]:
    raw = Settings(home=Path(home)).raw_dir
    if not raw.is_dir():
        return []
    found = []
    for directory in layout.campaign_dirs(raw):
        for path in layout.promotion_files(directory):
            try:
                found.append((path, read_document(path, PromotionDocument)))
            except (OSError, ValueError) as exc:
                raise ArtifactError(f"{path}: not a promotion document: {exc}") from None
    return found


def promoted_variant(home: Path, decision_id: str | None = None) -> dict[str, Any] | None:
    """The variant entry (variant.yaml) of the latest approved promotion under HOME (of `decision_id` when
    given), by decided_utc; None when there is none."""
    approved = [
        (datetime.fromisoformat(doc.decided_utc), str(path), doc)
        for path, doc in _promotions(home)
        if doc.approved and decision_id in (None, doc.decision_id)
    ]
    if not approved:
        return None
    _, source, latest = max(approved, key=lambda item: (item[0], item[1]))
    listed = [f for f in latest.files if Path(f).name == VARIANT_FILE]
    if not listed:
        raise ArtifactError(f"{source}: an approved promotion that lists no {VARIANT_FILE}")
    variant_path = Path(home) / listed[0]
    try:
        entry = yaml.safe_load(variant_path.read_text())
        Variant.model_validate(entry)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ArtifactError(f"{variant_path} (promoted by {source}): not a variant entry: {exc}") from None
    return entry


def latest_promoted_decision(home: Path) -> str | None:
    """The decision id of the latest approved promotion under HOME (by decided_utc), or None."""
    approved = [
        (datetime.fromisoformat(doc.decided_utc), str(path), doc.decision_id)
        for path, doc in _promotions(home)
        if doc.approved
    ]
    return max(approved)[2] if approved else None


def as_chosen(decision: DecisionDocument) -> tuple[DecisionDocument, list[str]]:
    """The decision with the option it chose (analysis.options: weighed by traffic) as what is deployed: the
    schedule unless the choice is another fixed config the verification launched (the "fixed" arm), whose
    spec entry then replaces the schedule's (the loads keep the schedule's verdicts: the arm was chosen for
    having no refuted load with traffic, analysis.options). Plain is never promoted (DecisionDocument.refusal)."""
    if decision.choice in ("", SCHEDULE_OPTION, PLAIN_OPTION) or decision.variant is None:
        return decision, []
    option = next((o for o in decision.options if o.name == decision.choice), None)
    arm = None
    if decision.verification_spec:
        arms = load_spec(Path(decision.verification_spec)).variants
        arm = next((v for v in arms if v.name == decision.choice), None)
    if option is None or arm is None or option.speculative_config is None:
        raise ArtifactError(
            f"decision {decision.decision_id} chose {decision.choice!r}, which its verification campaign did not "
            "launch: only a launched config is promoted"
        )
    entry = arm.model_dump(mode="json", exclude_defaults=True)
    variant = _validated(Variant, {**entry, "name": decision.variant["name"]}, decision, "variant")
    rendered = variant.speculative_config() or {}
    top = int(rendered.get("num_speculative_tokens", variant.k or 0))
    last = max(end for _, end, _ in decision.schedule)
    changed = decision.model_copy(
        update={
            "variant": variant.model_dump(mode="json", exclude_defaults=True),
            "speculative_config": rendered,
            "schedule": [[1, last, top]],
        }
    )
    return changed, [
        f"deployed the decision's choice, {option.name} ({option.description}), not the schedule"
    ]


def without_refuted(decision: DecisionDocument) -> tuple[DecisionDocument, list[str], str | None]:
    """The decision as it may be deployed: every range the verification refuted where the schedule drafts is
    served with speculation off, and said so (the notes). The third item says why nothing may be deployed at
    all (None: something may): a range refuted with speculation off (the engine with speculation configured
    ran below plain there, which no schedule avoids) or a schedule off everywhere once refuted ranges are."""
    refuted = [load for load in decision.loads if load.outcome == REFUTED]
    if not refuted or decision.variant is None:
        return decision, [], None
    off = [f"{load.batch_from}-{load.batch_to}" for load in refuted if load.k == 0]
    if off:
        return (
            decision,
            [],
            (
                f"batch sizes {', '.join(off)}: refuted with speculation off (a deployment with speculation "
                "configured ran below plain there): no schedule avoids that range; deploy plain"
            ),
        )
    ranges: list[list[int]] = []
    for load in sorted(decision.loads, key=lambda item: item.batch_from):
        k = 0 if load.outcome == REFUTED else load.k
        if ranges and ranges[-1][2] == k and ranges[-1][1] + 1 == load.batch_from:
            ranges[-1][1] = load.batch_to
        else:
            ranges.append([load.batch_from, load.batch_to, k])
    if all(k == 0 for _, _, k in ranges):
        return decision, [], "every range the schedule drafts in was refuted: deploy plain"
    variant = _validated(Variant, {**decision.variant, "k_schedule": ranges}, decision, "variant")
    notes = [
        f"batch sizes {load.batch_from}-{load.batch_to}: speculation off here, the verification refuted k={load.k}"
        for load in refuted
    ]
    changed = decision.model_copy(
        update={
            "variant": variant.model_dump(mode="json", exclude_defaults=True),
            "speculative_config": variant.speculative_config(),
            "schedule": ranges,
        }
    )
    return changed, notes, None


def promote_decision(
    decision_id: str, approved: bool, approver: str, note: str, via: str, override: str = ""
) -> dict[str, Any]:
    """A person's answer to a stored decision (artifacts.documents.read_decision, its latest revision), with
    the spec it was verified with (the verification campaign's spec file; the sweep's record when nothing was
    launched): the promotion document, and when approved the deploy files. Only a confirmed decision of a valid
    campaign is promoted (DecisionDocument.refusal) unless `override` gives the approver's reason, which is
    recorded; even then no range the verification refuted is deployed (without_refuted). Returns what the CLI
    and the flow print; `refused`: the tool refused (the CLI exits 1)."""
    from artifacts.documents import read_decision
    from specgauge.settings import get_settings

    path, decision = read_decision(get_settings().raw_dir, decision_id)
    campaign_dir = path.parent.parent
    if decision.speculative_config is None:
        return {"promoted": False, "why": "speculation is off at every load: there is nothing to promote"}
    notes: list[str] = []
    if approved:
        refusal = decision.refusal()
        if refusal is not None and not override.strip():
            return {
                "promoted": False,
                "refused": True,
                "why": f"not promotable: {refusal} (--override REASON promotes it anyway, recorded with the "
                "approver)",
            }
        decision, notes = as_chosen(decision)
        blocked = None
        # The schedule has its refuted ranges served off; a chosen fixed arm had none where traffic runs.
        if not notes:
            decision, notes, blocked = without_refuted(decision)
        if blocked is not None:
            return {
                "promoted": False,
                "refused": True,
                "why": f"not promotable even with --override: {blocked}",
            }
    spec = load_spec(Path(decision.verification_spec))
    home = get_settings().home
    document = write_promotion(
        campaign_dir,
        decision,
        spec,
        approved=approved,
        approver=approver,
        note=note,
        via=via,
        home=home,
        override=override.strip(),
        notes=notes,
    )
    return {
        "promoted": document.approved,
        "why": "" if document.approved else f"refused by {approver}",
        "files": document.files,
        "notes": notes,
        "override": document.override,
        "path": str(layout.promotion_file(campaign_dir, decision_id)),
    }
