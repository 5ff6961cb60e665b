"""Draft shapes: how one or two proposers' candidates make the tree a step verifies.

Written `KIND:key=value:...@PROPOSER[+PROPOSER]` (`parse_shape`); the proposers are those of
`analysis.simulate.proposers` by name (ngram, suffix, draft, eagle3). Without `@...` a one-proposer shape
applies to each proposer the caller chooses (`expand`).

| kind  | parameters                          | the step's tree                                                  |
|-------|-------------------------------------|------------------------------------------------------------------|
| chain | k                                   | the proposer's greedy chain of k tokens                           |
| tree  | b, budget, depth (default: budget)  | top-b children per node, filled breadth first until budget tokens |
| graft | b, budget, depth, k  (@BASE+GRAFT)  | BASE's tree united with GRAFT's chain of k at the root             |
| union | k  (@A+B)                           | A's chain and B's chain as two branches of one tree               |

United trees merge shared prefixes (a token both proposed at the same place is verified once), so the
accepted length of a union is the longest path in either tree that matches, and its cost is the number of
distinct nodes. Where a model drafter's tokens are unknown (off the reference path), nodes are not merged:
the verified-token count is then an upper bound (docs/simulate.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from analysis.simulate.proposers import Proposer
from analysis.simulate.replay import Drafter, Request, TokenTree
from specgauge.errors import InputError

PROPOSER_NAMES = ("ngram", "suffix", "draft", "eagle3")


class ShapeError(InputError):
    """A shape that cannot be read: the message names the shape text and what is wrong."""


@dataclass(frozen=True)
class Shape:
    """One draft shape over named proposers."""

    kind: ClassVar[str] = ""
    required: ClassVar[tuple[str, ...]] = ()
    optional: ClassVar[tuple[str, ...]] = ()
    n_proposers: ClassVar[int] = 1

    proposers: tuple[str, ...]
    params: tuple[tuple[str, int], ...]

    def get(self, key: str) -> int:
        return dict(self.params)[key]

    @property
    def label(self) -> str:
        params = "".join(f":{key}={value}" for key, value in self.params)
        return f"{self.kind}{params}@{'+'.join(self.proposers)}"

    @property
    def max_depth(self) -> int:
        """Deepest draft position this shape reaches (rank tables must reach it)."""
        raise NotImplementedError

    @property
    def max_branching(self) -> int:
        return 1

    def build(self, proposers: Sequence[Proposer], request: Request, t: int) -> TokenTree:
        raise NotImplementedError

    def drafter(self, available: Mapping[str, Proposer]) -> Drafter:
        missing = [name for name in self.proposers if name not in available]
        if missing:
            raise ShapeError(f"shape {self.label}: proposer(s) {', '.join(missing)} not available here")
        chosen = [available[name] for name in self.proposers]
        return lambda request, t: self.build(chosen, request, t)


class Chain(Shape):
    kind = "chain"
    required = ("k",)

    @property
    def max_depth(self) -> int:
        return self.get("k")

    def build(self, proposers: Sequence[Proposer], request: Request, t: int) -> TokenTree:
        k = self.get("k")
        return proposers[0].tree(request, t, 1, k, k)


class Tree(Shape):
    kind = "tree"
    required = ("b", "budget")
    optional = ("depth",)

    @property
    def depth(self) -> int:
        return dict(self.params).get("depth", self.get("budget"))

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def max_branching(self) -> int:
        return self.get("b")

    def build(self, proposers: Sequence[Proposer], request: Request, t: int) -> TokenTree:
        return proposers[0].tree(request, t, self.get("b"), self.get("budget"), self.depth)


class Graft(Tree):
    kind = "graft"
    required = ("b", "budget", "k")
    optional = ("depth",)
    n_proposers = 2

    @property
    def max_depth(self) -> int:
        return max(self.depth, self.get("k"))

    def build(self, proposers: Sequence[Proposer], request: Request, t: int) -> TokenTree:
        tree = proposers[0].tree(request, t, self.get("b"), self.get("budget"), self.depth)
        k = self.get("k")
        tree.merge(proposers[1].tree(request, t, 1, k, k))
        return tree


class Union(Shape):
    kind = "union"
    required = ("k",)
    n_proposers = 2

    @property
    def max_depth(self) -> int:
        return self.get("k")

    def build(self, proposers: Sequence[Proposer], request: Request, t: int) -> TokenTree:
        k = self.get("k")
        tree = proposers[0].tree(request, t, 1, k, k)
        tree.merge(proposers[1].tree(request, t, 1, k, k))
        return tree


SHAPES: dict[str, type[Shape]] = {cls.kind: cls for cls in (Chain, Tree, Graft, Union)}

SHAPE_HELP = (
    "Shapes, comma separated: KIND:key=value...[@PROPOSER[+PROPOSER]]. "
    "chain:k=3 (a chain of k); tree:b=2:budget=8[:depth=4] (top-b children per node, breadth first, "
    "budget draft tokens); graft:b=2:budget=8:k=3@eagle3+ngram (the first proposer's tree united with the "
    "second's chain of k); union:k=3@draft+eagle3 (two chains as two branches). Proposers: "
    + ", ".join(PROPOSER_NAMES)
    + ". Without @, chain and tree apply to each proposer chosen with --proposers."
)


def _parse_params(text: str, parts: list[str]) -> tuple[tuple[str, int], ...]:
    params: list[tuple[str, int]] = []
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not value.strip().isdigit() or int(value) < 1:
            raise ShapeError(f"shape {text!r}: {part!r} is not key=N with N a whole number >= 1")
        params.append((key.strip(), int(value)))
    return tuple(params)


def parse_shape(text: str, default_proposers: Sequence[str] = ()) -> list[Shape]:
    """Read one shape; a one-proposer shape without `@` gives one shape per default proposer."""
    body, at, names = text.strip().partition("@")
    kind, *parts = body.split(":")
    cls = SHAPES.get(kind.strip())
    if cls is None:
        raise ShapeError(f"shape {text!r}: unknown kind {kind!r} (known: {', '.join(SHAPES)})")
    params = _parse_params(text, parts)
    keys = [key for key, _ in params]
    unknown = [key for key in keys if key not in cls.required + cls.optional]
    missing = [key for key in cls.required if key not in keys]
    if unknown or missing or len(set(keys)) != len(keys):
        raise ShapeError(
            f"shape {text!r}: {cls.kind} takes {', '.join(cls.required)}"
            + (f" (and optionally {', '.join(cls.optional)})" if cls.optional else "")
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    order = {key: i for i, key in enumerate(cls.required + cls.optional)}
    params = tuple(sorted(params, key=lambda kv: order[kv[0]]))
    if at:
        chosen = [name.strip() for name in names.split("+")]
        groups = [tuple(chosen)]
    elif cls.n_proposers == 1:
        groups = [(name,) for name in default_proposers]
    else:
        raise ShapeError(f"shape {text!r}: {cls.kind} needs two proposers: {cls.kind}:...@A+B")
    shapes = []
    for group in groups:
        bad = [name for name in group if name not in PROPOSER_NAMES]
        if bad or len(group) != cls.n_proposers:
            raise ShapeError(
                f"shape {text!r}: {cls.kind} takes {cls.n_proposers} proposer(s) from "
                f"{', '.join(PROPOSER_NAMES)}; got {'+'.join(group) or 'none'}"
            )
        shapes.append(cls(proposers=group, params=params))
    if not shapes:
        raise ShapeError(f"shape {text!r}: no proposer given (add @PROPOSER)")
    return shapes


def parse_shapes(text: str, default_proposers: Sequence[str] = ()) -> list[Shape]:
    """Read a comma-separated list of shapes (see SHAPE_HELP)."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ShapeError("no shapes given")
    return [shape for item in items for shape in parse_shape(item, default_proposers)]
