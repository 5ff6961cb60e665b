"""The speculative-method registry (experiments/methods.py): everything that lists methods derives from it,
and a new entry is all a new method needs to be validated and configured like the others."""

from __future__ import annotations

from typing import Any, ClassVar, get_args

import pytest

from analysis.simulate.shapes import PROPOSER_NAMES
from analysis.simulate.validate import PROPOSER_OF_METHOD
from experiments.methods import REGISTRY, Method, MethodRegistry
from experiments.spec import SpecMethod, Variant
from specgauge.errors import SpecError
from tasks.drafters.prelaunch import PRELAUNCH_CHECKS
from warehouse.models import METHODS


def test_every_list_of_methods_is_the_registrys() -> None:
    assert get_args(SpecMethod) == REGISTRY.launchable
    assert list(REGISTRY.names) == METHODS
    assert set(REGISTRY.launchable) <= set(METHODS)  # the warehouse also takes imported-only methods
    assert {m.name: m.proposer for m in REGISTRY if m.proposer} == PROPOSER_OF_METHOD
    assert [m.name for m in REGISTRY if not m.speculative] == ["none"]


def test_every_named_check_and_proposer_exists_and_every_check_is_used() -> None:
    named = {m.prelaunch for m in REGISTRY if m.prelaunch}
    assert named == set(PRELAUNCH_CHECKS)
    assert {m.proposer for m in REGISTRY if m.proposer} <= set(PROPOSER_NAMES)


def test_method_names_are_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        MethodRegistry((Method("ngram"), Method("ngram")))


# A toy registry: the real one plus a new launchable method and one only imported results carry.
TOY = MethodRegistry(
    (
        *REGISTRY.entries,
        Method(
            "toy",
            drafter_field="draft_model",
            drafter_needed="the toy drafter's path",
            settings=("prompt_lookup_max",),
            engine_settings=lambda variant: {"toy_window": variant.prompt_lookup_max or 3},
        ),
        Method("imported_only", launchable=False),
    )
)
ToyMethod = TOY.choice()


class ToyVariant(Variant):
    """A variant whose methods are the toy registry's: nothing global changes."""

    methods: ClassVar[MethodRegistry] = TOY
    method: ToyMethod = "none"


def toy_problem(**fields: Any) -> str:
    with pytest.raises(ValueError) as caught:
        ToyVariant.model_validate({"name": "t", "method": "toy", **fields})
    return str(caught.value)


def test_a_new_entry_is_validated_and_configured_like_the_others() -> None:
    variant = ToyVariant(name="t", method="toy", k=2, draft_model="d", draft_tensor_parallel_size=1)
    assert variant.speculative and not variant.baseline and variant.drafter == "d"
    assert variant.speculative_config() == {
        "num_speculative_tokens": 2,
        "method": "toy",
        "toy_window": 3,
        "model": "d",
        "draft_tensor_parallel_size": 1,
    }
    assert "method 'toy' needs k (num_speculative_tokens) > 0, got None" in toy_problem(draft_model="d")
    assert "method 'toy' needs draft_model (the toy drafter's path)" in toy_problem(k=2)
    assert "method 'toy' does not take eagle_head, prompt_lookup_min" in toy_problem(
        k=2, draft_model="d", eagle_head="h", prompt_lookup_min=1, prompt_lookup_max=2
    )
    assert "hot_swap: only an eagle3 variant can swap its head, not method 'toy'" in toy_problem(
        k=2, draft_model="d", hot_swap=True
    )
    # Imported-only methods are the warehouse's, never a spec's; the real spec never sees the toy.
    assert "imported_only" in TOY.names and "imported_only" not in get_args(ToyMethod)
    assert "Input should be" in toy_problem(method="imported_only")
    with pytest.raises(ValueError, match="Input should be"):
        Variant.model_validate({"name": "t", "method": "toy", "k": 2, "draft_model": "d"})
    assert "toy" not in get_args(SpecMethod) and Variant.methods is REGISTRY


def test_the_spec_still_names_the_method_and_field_of_a_bad_variant() -> None:
    from experiments.spec import parse_spec

    data = {
        "name": "x",
        "target": {"model": "m"},
        "variants": [{"name": "plain"}, {"name": "e", "method": "eagle3", "k": 2}],
        "workloads": [{"file": "w.jsonl"}],
        "load": {"concurrencies": [1]},
    }
    with pytest.raises(SpecError, match=r"variants\[1\]: method 'eagle3' needs eagle_head"):
        parse_spec(data)
