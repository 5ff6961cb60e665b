"""Reading a spec file without trusting it: bounded size, nesting and aliases, no duplicate keys, and the
line of each field, in one pass that never expands an alias bomb and never recurses past a small depth.

A YAML alias bomb (anchors whose lists name the anchor before them nine times, ten lines) expands to 9^9
nodes: PyYAML's own construction shares them, but anything that walks the composed tree (the line map) or
the data expands them. So the document's events are counted first, iteratively, with each alias counted as
the size of what it names; past a budget the file is refused, naming the line, before anything walks it.
A document nested thousands deep makes PyYAML's recursive composer raise RecursionError: the same event pass
refuses it first. Errors are one line each, naming the file and line; they never echo the file's contents.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from specgauge.errors import SpecError
from specgauge.files import read_bounded_text

# A spec is a screenful of YAML; the shipped ones are under 5 KiB and nest at most 5 deep. The budgets are
# far above any real spec (a cluster campaign with hundreds of variants) and far below harm.
MAX_SPEC_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_ALIASES = 64
MAX_NODES = 100_000  # scalars and collections, with each alias counted as the size of what it names

Location = tuple[int | str, ...]

# A key shown in an error: a field name's shape, short. Anything else in a key position is not a field
# anyone misspelt, it is some other file's text (a password line, a token), and is not echoed.
_KEY_SHAPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,47}$")
HIDDEN_KEY = "<a key that is not a field name>"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def shown_key(key: object) -> str:
    """The key as an error may show it: itself when it is short and name-shaped, else a placeholder."""
    return key if isinstance(key, str) and _KEY_SHAPE.fullmatch(key) else HIDDEN_KEY


def read_spec_text(path: Path) -> str:
    """The file's text, read at most MAX_SPEC_BYTES + 1 bytes (so /dev/zero or a huge file is refused, not
    read into memory); SpecError naming the file otherwise."""
    return read_bounded_text(path, MAX_SPEC_BYTES, SpecError, "an experiment spec")


def _yaml_error(source: str, exc: yaml.YAMLError) -> SpecError:
    mark = getattr(exc, "problem_mark", None)
    where = f":{mark.line + 1}" if mark else ""
    return SpecError(f"{source}{where}: invalid YAML: {getattr(exc, 'problem', None) or 'cannot parse'}")


def check_bounds(text: str, source: str) -> None:
    """Refuse a document too deep, with too many aliases, or too large once its aliases are expanded, from its
    parser events alone (iterative: nothing here recurses or expands). SpecError naming the line."""
    depth = aliases = 0
    # One entry per open collection: [its expanded size so far, its anchor].
    open_sizes: list[list[Any]] = []
    anchor_size: dict[str, int] = {}
    total = 0

    def add(size: int, line: int) -> None:
        nonlocal total
        total += size
        if total > MAX_NODES:
            raise SpecError(
                f"{source}:{line}: the document expands to more than {MAX_NODES:,} values (aliases count as "
                "what they name): not an experiment spec"
            )
        if open_sizes:
            open_sizes[-1][0] += size

    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            line = event.start_mark.line + 1
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise SpecError(
                        f"{source}:{line}: nested deeper than {MAX_DEPTH} levels: not an experiment spec"
                    )
                add(1, line)  # the collection itself, to the running total and its parent
                open_sizes.append([1, event.anchor])
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                size, anchor = open_sizes.pop()
                if anchor is not None:
                    anchor_size[anchor] = size
                if open_sizes:  # its contents were counted in the total as they came; now in its parent
                    open_sizes[-1][0] += size - 1
            elif isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    anchor_size[event.anchor] = 1
                add(1, line)
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise SpecError(
                        f"{source}:{line}: more than {MAX_ALIASES} YAML aliases (*name): "
                        "not an experiment spec"
                    )
                add(anchor_size.get(event.anchor, 1), line)
    except yaml.YAMLError as exc:
        raise _yaml_error(source, exc) from None


def load_yaml(text: str, source: str) -> tuple[Any, dict[Location, int]]:
    """The document's data and the line of each field (location as in pydantic's errors -> 1-based line: a
    mapping entry's key line, a list item's first line). Bounds checked first (check_bounds); a key given
    twice in one mapping is refused naming both lines."""
    check_bounds(text, source)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[Location, int] = {}
        if node is not None:
            _walk(node, (), lines, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise _yaml_error(source, exc) from None
    finally:
        loader.dispose()
    return data, lines


def _walk(node: yaml.Node, loc: Location, lines: dict[Location, int], source: str) -> None:
    """Record each field's line and refuse duplicate keys. Depth is bounded by check_bounds, and so is the
    number of nodes visited (each alias's target counted once per alias)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
                continue
            line = key.start_mark.line + 1
            if key.value in seen:
                where = ".".join(str(p) for p in (*loc, shown_key(key.value)))
                raise SpecError(
                    f"{source}:{line}: {where}: given twice (lines {seen[key.value]} and {line}): YAML would "
                    "silently keep the last"
                )
            seen[key.value] = line
            lines[(*loc, key.value)] = line
            _walk(value, (*loc, key.value), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*loc, index)] = item.start_mark.line + 1
            _walk(item, (*loc, index), lines, source)


# -- where a flow may read a spec ---------------------------------------------------------------------------
def spec_roots() -> list[Path]:
    """The folders a flow started from a deployment reads specs from: the repo's experiments/, HOME/specs
    (where `decide` writes its verification specs) and SPECGAUGE_SPEC_DIRS."""
    from specgauge.flow_paths import configured_dirs
    from specgauge.settings import REPO_ROOT, get_settings

    return [REPO_ROOT / "experiments", get_settings().home / "specs", *configured_dirs()]


def check_spec_path(path: str | Path, roots: Sequence[Path] | None = None) -> Path:
    """`path` resolved (relative to the repo root, symlinks followed) when it lies under one of `roots`
    (default spec_roots()); SpecError otherwise, before the file is opened."""
    from specgauge.flow_paths import check_under

    return check_under(path, spec_roots() if roots is None else roots, "spec path", error=SpecError)


def flow_spec_path(path: str) -> str:
    """A flow's spec path parameter, checked when the run came from a deployment (check_spec_path); a run the
    user started in their own shell (the CLI, a script) reads any file they give, as the CLI does."""
    from specgauge.flow_paths import from_deployment

    if from_deployment():
        check_spec_path(path)
    return path
