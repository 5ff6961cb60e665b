"""The overrides people make to a spec when they start it from a form (the Prefect UI's campaign run form):
which variants, which strata, which concurrencies, how many repeats. Applied to the spec's data before it is
validated, so an override that breaks the spec is refused with the same `file: field: problem` line as a bad
spec file, before anything launches; the campaign id follows the overridden spec (a new campaign)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.loader import load_yaml, read_spec_text
from experiments.spec import ExperimentSpec, expand_variants, load_spec, parse_spec
from specgauge.errors import SpecError


@dataclass(frozen=True)
class SpecOverrides:
    variants: tuple[str, ...] | None = None
    """Keep these variants (names as expanded: `draft-k3`); plain baselines are always kept."""
    strata: tuple[str, ...] | None = None
    """Run only these strata of the spec's workload files."""
    concurrencies: tuple[int, ...] | None = None
    """Closed-loop concurrencies instead of the spec's (its open-loop rates are kept)."""
    repeats: int | None = None

    @classmethod
    def of(
        cls,
        variants: Sequence[str] | None = None,
        strata: Sequence[str] | None = None,
        concurrencies: Sequence[int] | None = None,
        repeats: int | None = None,
    ) -> SpecOverrides:
        """From a form's values, where an empty list means the same as none given."""
        return cls(
            variants=tuple(variants) if variants else None,
            strata=tuple(strata) if strata else None,
            concurrencies=tuple(concurrencies) if concurrencies else None,
            repeats=repeats,
        )

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.variants, self.strata, self.concurrencies, self.repeats))

    def describe(self) -> str:
        parts = [
            f"{name}={','.join(map(str, value)) if isinstance(value, tuple) else value}"
            for name, value in vars(self).items()
            if value is not None
        ]
        return " ".join(parts) or "none"


def load_spec_with(path: Path | str, overrides: SpecOverrides) -> ExperimentSpec:
    """The spec at `path` with `overrides` applied; the spec itself when there are none."""
    if not overrides:
        return load_spec(path)
    load_spec(path)  # the file as written must be valid first: its errors name its own lines
    source = f"{path} (with the overrides {overrides.describe()})"
    data, lines = load_yaml(read_spec_text(Path(path)), source)  # bounded, as load_spec reads it
    return parse_spec(apply_overrides(data, overrides, source), source, lines)


def apply_overrides(data: dict[str, Any], overrides: SpecOverrides, source: str) -> dict[str, Any]:
    """The spec's data with `overrides` applied; SpecError naming the override when one cannot apply."""
    out = dict(data)
    if overrides.variants is not None:
        out["variants"] = _kept_variants(data, overrides.variants, source)
    if overrides.strata is not None:
        out["workloads"] = _kept_strata(data, overrides.strata, source)
    if overrides.concurrencies is not None:
        # bool is an int to Python, not a concurrency; the spec's own bound refuses a huge one, naming it
        bad = [c for c in overrides.concurrencies if isinstance(c, bool) or not isinstance(c, int) or c < 1]
        if bad:
            raise SpecError(f"{source}: concurrencies: must be whole numbers >= 1, got {bad}")
        out["load"] = {**(data.get("load") or {}), "concurrencies": list(overrides.concurrencies)}
    if overrides.repeats is not None:
        out["repeats"] = overrides.repeats  # the spec's own check refuses a bad count, naming the field
    return out


def _kept_variants(data: dict[str, Any], wanted: tuple[str, ...], source: str) -> list[Any]:
    variants, _ = expand_variants(data)  # depth lists and sweeps as the campaign will name them
    names = [v.get("name") for v in variants if isinstance(v, dict)]
    unknown = [name for name in wanted if name not in names]
    if unknown:
        raise SpecError(
            f"{source}: variants: no variant {', '.join(unknown)} (the spec has {', '.join(names)})"
        )
    return [v for v in variants if v.get("name") in wanted or v.get("method", "none") == "none"]


def _kept_strata(data: dict[str, Any], wanted: tuple[str, ...], source: str) -> list[dict[str, Any]]:
    from experiments.plan import resolve_repo_path
    from workloads.schema import load_corpus

    kept: list[dict[str, Any]] = []
    found: set[str] = set()
    for ref in data.get("workloads") or []:
        if not isinstance(ref, dict) or "file" not in ref:
            return data.get("workloads")  # the spec's own check reports a malformed entry
        have = ref.get("strata") or load_corpus(resolve_repo_path(ref["file"])).strata
        strata = [s for s in wanted if s in have]
        found.update(strata)
        if strata:
            kept.append({**ref, "strata": strata})
    missing = [s for s in wanted if s not in found]
    if missing:
        raise SpecError(f"{source}: strata: no workload of the spec has {', '.join(missing)}")
    return kept
