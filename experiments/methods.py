"""Speculative methods: one frozen entry per method, everything specgauge knows of it in one place.

The rest derives from `REGISTRY`: the spec's `method` choices (experiments.spec.SpecMethod) and its rules for
each method's settings, the engine's --speculative-config (`Method.engine_config`), the methods the warehouse
accepts (warehouse.models.METHODS: imported results may carry methods specgauge cannot launch), the drafter
check run before a launch (`prelaunch`, a name tasks/drafters/prelaunch.py resolves: experiments/ may not
import tasks/) and the simulator's offline proposer (`proposer`, analysis/simulate/validate.py). Adding a
method is one entry here and its tests (docs/design.md, "How to add ...").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

NGRAM_LOOKUP_MIN, NGRAM_LOOKUP_MAX = 1, 4  # vLLM's prompt_lookup_min / prompt_lookup_max defaults

# Every speculative setting of a variant, in the order an error lists them: plain takes none of them.
SPECULATIVE_FIELDS = (
    "k",
    "draft_model",
    "draft_tensor_parallel_size",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "eagle_head",
    "k_schedule",
    "synthetic_acceptance_length",
)
# The settings only some methods read, in the order an error lists them: a setting the method does not read
# would be silently dropped from the engine's config, so the spec refuses it.
METHOD_FIELDS = (
    "draft_model",
    "eagle_head",
    "draft_tensor_parallel_size",
    "prompt_lookup_min",
    "prompt_lookup_max",
)


class MethodSettings(Protocol):
    """The variant fields a method reads (experiments.spec.Variant, which imports this module)."""

    k: int | None
    draft_model: str | None
    eagle_head: str | None
    draft_tensor_parallel_size: int | None
    prompt_lookup_min: int | None
    prompt_lookup_max: int | None


@dataclass(frozen=True)
class Method:
    """One method as vLLM names it (`method` of its SpeculativeConfig) and what specgauge does with it."""

    name: str
    launchable: bool = True  # False: known only from imported results (the warehouse takes it, a spec not)
    speculative: bool = True  # False: plain serving, which takes no speculative setting at all
    drafter_field: str | None = None  # the variant field naming its drafter checkpoint (vLLM's `model`)
    drafter_needed: str | None = None  # what that checkpoint is, when the method cannot run without one
    settings: tuple[str, ...] = ()  # further fields of METHOD_FIELDS it reads
    check: Callable[[MethodSettings], None] | None = None  # its own rule on them (raises ValueError)
    engine_settings: Callable[[MethodSettings], dict[str, Any]] | None = None  # its own config keys
    hot_swap: bool = False  # a running engine can load another drafter (tasks/drafters/swap.py)
    prelaunch: str | None = None  # the drafter check of tasks/drafters/prelaunch.py, by name
    # Target architectures (config.json `architectures[0]`, by prefix) vLLM has its drafter for.
    target_architectures: tuple[str, ...] = ()
    proposer: str | None = None  # the offline proposer that mirrors it (analysis/simulate/proposers.py)

    def drafter(self, variant: MethodSettings) -> str | None:
        """The drafter checkpoint's path as the spec gives it (None: no checkpoint, e.g. ngram)."""
        return getattr(variant, self.drafter_field) if self.drafter_field else None

    def check_settings(self, variant: MethodSettings) -> None:
        """The variant has the drafter the method needs and no setting it would not read (ValueError)."""
        if self.drafter_needed and self.drafter_field and not getattr(variant, self.drafter_field):
            raise ValueError(f"method {self.name!r} needs {self.drafter_field} ({self.drafter_needed})")
        reads = {*self.settings}
        if self.drafter_field:
            reads |= {self.drafter_field, "draft_tensor_parallel_size"}
        ignored = [f for f in METHOD_FIELDS if getattr(variant, f) is not None and f not in reads]
        if ignored:
            raise ValueError(f"method {self.name!r} does not take {', '.join(ignored)}")

    def engine_config(self, variant: MethodSettings) -> dict[str, Any] | None:
        """The method's part of vLLM's --speculative-config (paths as given; launchers resolve them). Keys
        are vLLM 0.32's SpeculativeConfig fields (vllm/config/speculative.py); None: plain."""
        if not self.speculative:
            return None
        config: dict[str, Any] = {"num_speculative_tokens": variant.k, "method": self.name}
        if self.engine_settings is not None:
            config |= self.engine_settings(variant)
        drafter = self.drafter(variant)
        if drafter:
            config["model"] = drafter
        if variant.draft_tensor_parallel_size:
            config["draft_tensor_parallel_size"] = variant.draft_tensor_parallel_size
        return config


@dataclass(frozen=True)
class MethodRegistry:
    """The methods by name, in the order the spec's errors list them."""

    entries: tuple[Method, ...]
    by_name: dict[str, Method] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {entry.name: entry for entry in self.entries}
        if len(by_name) != len(self.entries):
            raise ValueError(f"method names must be unique: {[e.name for e in self.entries]}")
        object.__setattr__(self, "by_name", by_name)

    def __getitem__(self, name: str) -> Method:
        return self.by_name[name]

    def __iter__(self) -> Iterator[Method]:
        return iter(self.entries)

    @property
    def names(self) -> tuple[str, ...]:
        """Every method, launchable or only imported: what the warehouse accepts."""
        return tuple(entry.name for entry in self.entries)

    @property
    def launchable(self) -> tuple[str, ...]:
        return tuple(entry.name for entry in self.entries if entry.launchable)

    def choice(self) -> Any:
        """The type of a spec's `method`: one of the launchable names (pydantic lists them in its error)."""
        return Literal[self.launchable]  # type: ignore[valid-type]

    def hot_swappable(self) -> str:
        """The methods that can swap their drafter, for people ('eagle3')."""
        return " or ".join(entry.name for entry in self.entries if entry.hot_swap)

    def proposers(self) -> dict[str, str]:
        """Method -> the simulator's proposer that mirrors it, for the methods that have one."""
        return {entry.name: entry.proposer for entry in self.entries if entry.proposer}


def _lookup_window(variant: MethodSettings) -> tuple[int, int]:
    return variant.prompt_lookup_min or NGRAM_LOOKUP_MIN, variant.prompt_lookup_max or NGRAM_LOOKUP_MAX


def _lookup_window_in_order(variant: MethodSettings) -> None:
    low, high = _lookup_window(variant)
    if low > high:
        raise ValueError(f"prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})")


def _lookup_settings(variant: MethodSettings) -> dict[str, Any]:
    low, high = _lookup_window(variant)
    return {"prompt_lookup_min": low, "prompt_lookup_max": high}


def _family_drafter(name: str, *architectures: str) -> Method:
    """A method whose drafter checkpoint (at draft_model) vLLM has for some target families only."""
    return Method(
        name,
        drafter_field="draft_model",
        drafter_needed=f"the {name} drafter's path",
        prelaunch="target_family",
        target_architectures=architectures,
    )


REGISTRY = MethodRegistry(
    (
        Method("none", speculative=False),
        Method(
            "ngram",  # prompt lookup
            settings=("prompt_lookup_min", "prompt_lookup_max"),
            check=_lookup_window_in_order,
            engine_settings=_lookup_settings,
            proposer="ngram",
        ),
        Method(
            "draft_model", drafter_field="draft_model", drafter_needed="a path or hub id", proposer="draft"
        ),
        Method(
            "eagle3",
            drafter_field="eagle_head",
            drafter_needed="the EAGLE-3 head's path",
            hot_swap=True,
            prelaunch="eagle3_head",
            proposer="eagle3",
        ),
        # Suffix decoding: the engine needs the `arctic-inference` package.
        Method("suffix", prelaunch="arctic_inference", proposer="suffix"),
        # vLLM 0.32's dspark drafters are qwen3_dspark.py and gemma4_dspark.py, its dflash drafters
        # qwen3_dflash.py and laguna_dflash.py (`_SPECULATIVE_DECODING_MODELS`,
        # vllm/model_executor/models/registry.py). DeepSeek-V4 and Kimi-K3 DSpark need GPU kernels: cluster only.
        _family_drafter("dspark", "Qwen3", "Gemma4"),
        _family_drafter("dflash", "Qwen3", "Laguna"),
        # The target's multi-token-prediction layers, or a checkpoint at draft_model.
        Method("mtp", drafter_field="draft_model", prelaunch="target_mtp_layers"),
    )
)
