"""Each variant's drafter against its target, before anything launches: the spec-level half of the
drafter contract, called by `check_launchable` (with the launcher's own input checks). Which check a method gets is its registry entry's
`prelaunch` (experiments/methods.py), resolved here by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from experiments.spec import ExperimentSpec, Variant
from specgauge.errors import InputError, SpecError
from tasks.drafters.contract import check_eagle3_head, check_method_target, check_suffix_available
from tasks.drafters.truncate import prepare_truncated
from tasks.launch.registry import launcher_class


def _local_path_or_hub_id(path: str) -> str | None:
    """The local directory a spec path names; None for what can only be a hub id (`org/name`, not here)."""
    from tasks.launch.local import resolve_local

    resolved = resolve_local(path)
    if Path(resolved).is_dir():
        return resolved
    could_be_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
    return None if could_be_hub_id else resolved


def _eagle3_head(spec: ExperimentSpec, variant: Variant) -> None:
    if not variant.eagle_head:
        return
    target = _local_path_or_hub_id(spec.target.model)
    head = _local_path_or_hub_id(variant.eagle_head)
    if head is not None and not Path(head).is_dir():
        raise InputError(f"config: {variant.eagle_head} is not a directory (nor a hub id)")
    if target is not None and head is not None and Path(target).is_dir():
        check_eagle3_head(target, head)


def _arctic_inference(spec: ExperimentSpec, variant: Variant) -> None:
    from specgauge.settings import get_settings

    check_suffix_available(get_settings().engine_python)


def _target_family(spec: ExperimentSpec, variant: Variant) -> None:
    target = _local_path_or_hub_id(spec.target.model)
    if target is not None and Path(target).is_dir():
        check_method_target(variant.method, target)


def _target_mtp_layers(spec: ExperimentSpec, variant: Variant) -> None:
    if not variant.draft_model:  # with a checkpoint of its own it does not draft with the target's layers
        _target_family(spec, variant)


@dataclass(frozen=True)
class PrelaunchCheck:
    field: str  # the variant field a refusal names
    run: Callable[[ExperimentSpec, Variant], None]  # raises InputError


# The checks a method's registry entry names (experiments.methods.Method.prelaunch).
PRELAUNCH_CHECKS: dict[str, PrelaunchCheck] = {
    "eagle3_head": PrelaunchCheck("eagle_head", _eagle3_head),
    "arctic_inference": PrelaunchCheck("method", _arctic_inference),
    "target_family": PrelaunchCheck("method", _target_family),
    "target_mtp_layers": PrelaunchCheck("method", _target_mtp_layers),
}


def check_drafters(spec: ExperimentSpec, source: str = "spec") -> None:
    """Each variant's drafter against its target (tasks/drafters), refused as `SOURCE: variants[i].FIELD:
    rule: message` before anything is launched. Local launcher only where a check reads files or the engine."""
    for i, variant in enumerate(spec.variants):
        target_tp = spec.layout_of(variant).tensor_parallel_size  # the layout it is served with
        draft_tp = variant.draft_tensor_parallel_size
        if draft_tp is not None and draft_tp not in (1, target_tp):  # vllm/config/speculative.py
            raise SpecError(
                f"{source}: variants[{i}].draft_tensor_parallel_size: vLLM takes 1 or the target's "
                f"tensor_parallel_size ({target_tp}), got {draft_tp}"
            )
        if spec.launcher.kind != "local":
            continue  # cluster paths and the cluster's engine are not readable from here
        name = variant.methods[variant.method].prelaunch
        if name is None:
            continue
        check = PRELAUNCH_CHECKS[name]
        try:
            check.run(spec, variant)
        except InputError as exc:
            raise SpecError(f"{source}: variants[{i}].{check.field}: {exc}") from None


def check_launchable(spec: ExperimentSpec, source: str = "spec") -> None:
    """Input problems a launcher can see before anything starts, e.g. a local draft model whose vocabulary
    is not the target's. A campaign calls this before it writes or launches anything, so bad input costs
    no engine start and leaves no partial campaign. Raises InputError naming the input (`source`: the spec's
    path, for messages)."""
    check_drafters(spec, source)
    launcher_class(spec.launcher.kind).check_inputs(spec)
    try:  # last: the only check that writes (a truncated draft's checkpoint, once; tasks/drafters/truncate.py)
        prepare_truncated(spec, source)
    except InputError as exc:  # its message names the spec and variants[i].draft_layers already
        raise SpecError(str(exc)) from None
