"""What the pandera models (polars backend) of every table share, and `one_query`, which runs all of a model's
checks at once.

Each table's model lives with its artifact kind (warehouse.kinds). Frames are checked with `strict` (exactly
these columns) and, where the kind does not build them already typed, `coerce`. Frame-level checks name
their column before a colon in their error text, so a quarantine entry can say which column failed. A model
whose columns are a document's (the cell summary's) is derived from it: `with_columns`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import pandera.polars as pa
import polars as pl
from pandera.api.polars.types import PolarsData

from artifacts.documents import StoredColumn
from experiments.methods import REGISTRY

# Every method a row may name: those a spec launches and those only imported results carry.
METHODS = list(REGISTRY.names)


class Strict:
    """Exactly the model's columns; values coerced to the model's types."""

    strict = True
    coerce = True


class Exact:
    """Exactly the model's columns, already of the model's types (the kinds build and cast them):
    pandera's coercion costs a polars collect per column per call, which dominates small batches."""

    strict = True
    coerce = False


def with_columns(
    base: type[pa.DataFrameModel], name: str, columns: Sequence[StoredColumn]
) -> type[pa.DataFrameModel]:
    """`base` plus one column per stored document field (artifacts.documents.Column: type and checks)."""
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": base.__module__, "__annotations__": annotations}
    for stored in columns:
        column = stored.column
        checks: dict[str, Any] = {k: v for k in ("ge", "gt", "le") if (v := getattr(column, k)) is not None}
        if column.isin is not None:
            checks["isin"] = list(column.isin)
        annotations[stored.name] = stored.dtype
        namespace[stored.name] = pa.Field(nullable=column.nullable, **checks)
    return type(name, (base,), namespace)


# -- all checks in one query -----------------------------------------------------------------------------------


@cache
def one_query(model: type[pa.DataFrameModel]) -> pa.DataFrameSchema:
    """`model`'s schema with every check it can fuse (its columns' checks, non-null and unique constraints, and
    its frame-level checks) run as one polars query.

    pandera runs each check as its own query, two `collect`s apiece: for the 107 columns of CellModel about
    280 queries, 0.15 s per batch whatever its rows, a third of the ingest's reading thread. A valid batch
    needs only a yes, which one query gives; a batch that fails is validated again with `model` itself, whose
    errors name the column and the check (warehouse.ingest._checked). Each check keeps pandera's own
    function and null handling, so both accept exactly the same frames (tests/test_warehouse_models.py).
    Types and the exact set of columns are still checked by pandera, from the frame's schema alone.
    """
    schema = model.to_schema()
    fused: list[tuple[str, pa.Check | str]] = []  # (column selector or "*", check | "not_null" | "unique")
    updates: dict[str, dict[str, object]] = {}
    for name, column in schema.columns.items():
        keep = [c for c in column.checks if not _fusable(c)]
        fused += [(column.selector, c) for c in column.checks if _fusable(c)]
        if not column.nullable:
            fused.append((column.selector, "not_null"))
        if column.unique:
            fused.append((column.selector, "unique"))
        updates[name] = {"checks": keep, "nullable": True, "unique": False}
    frame_checks = [c for c in schema.checks if _fusable(c)]
    fused += [("*", c) for c in frame_checks]
    if not fused:
        return schema
    out = schema.update_columns(updates)
    out.checks = [*(c for c in schema.checks if not _fusable(c)), _all_at_once(fused, model.__name__)]
    return out


def _fusable(check: pa.Check) -> bool:
    # element-wise checks run a Python function per value: no query to fuse
    return check._check_fn is not None and not check.element_wise and not check.groupby


def _function(check: pa.Check) -> Callable[..., Any]:
    # A built-in check's function is looked up when it runs, as pandera's Check.__call__ does: the polars
    # implementations register themselves when the polars backend is first used, after the model was built.
    name = getattr(check._check_fn, "__name__", None)
    if name is not None and check.is_builtin_check(name):
        return check.get_builtin_check_fn(name)
    return check._check_fn


def _all_at_once(fused: list[tuple[str, pa.Check | str]], model_name: str) -> pa.Check:
    def check(data: PolarsData) -> pl.LazyFrame:
        frame = data.lazyframe
        schema = frame.collect_schema()
        exprs: list[pl.Expr] = []
        for selector, what in fused:
            if what == "not_null":  # pandera's nullable check: a float must not be NaN either
                for name in _names(selector, schema):
                    expr = pl.col(name).is_not_null()
                    exprs.append(expr & pl.col(name).is_not_nan() if schema[name].is_float() else expr)
            elif what == "unique":
                exprs.append(~pl.col(selector).is_duplicated())
            else:
                assert isinstance(what, pa.Check)
                exprs.append(_expression(what, frame, selector).fill_null(what.ignore_na))
        return frame.select(pl.all_horizontal(exprs).alias("passed"))

    return pa.Check(check, name=f"{model_name}: all checks at once")


def _names(selector: str, schema: pl.Schema) -> list[str]:
    # pandera's regex columns are "^...$" selectors, which polars also reads as a regex
    if selector.startswith("^") and selector.endswith("$"):
        return [name for name in schema.names() if re.fullmatch(selector, name)]
    return [selector]


class _Select:
    """Stands in for the LazyFrame a check function selects from, to capture the expression it builds."""

    def select(self, *exprs: pl.Expr) -> list[pl.Expr]:
        return list(exprs)


def _expression(check: pa.Check, frame: pl.LazyFrame, selector: str) -> pl.Expr:
    """The boolean expression of a check (one output per selected column). pandera's built-in checks and
    ours are `data.lazyframe.select(expression)`: capture that. Any other shape is run for real, as its
    own query, and joined back row by row."""
    function = _function(check)
    try:
        captured = function(PolarsData(_Select(), selector), **check._check_kwargs)  # type: ignore[arg-type]
    except (AttributeError, TypeError):
        captured = None
    if isinstance(captured, list) and captured and all(isinstance(e, pl.Expr) for e in captured):
        return pl.all_horizontal(captured) if len(captured) > 1 else captured[0]
    result = function(PolarsData(frame, selector), **check._check_kwargs)
    if isinstance(result, bool):
        return pl.repeat(result, pl.len())
    return pl.lit(result.select(pl.all_horizontal(pl.all())).collect().to_series())
