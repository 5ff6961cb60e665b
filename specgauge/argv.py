"""Engine command lines as lists of arguments: options taken out of them."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def without_options(args: Sequence[str], options: Collection[str], *, joined: bool = False) -> list[str]:
    """`args` less each of `options` and the value that follows it; with `joined`, less the
    `--option=value` spelling of them too."""
    prefixes = tuple(f"{option}=" for option in options) if joined else ()
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in options:
            skip = True
            continue
        if prefixes and arg.startswith(prefixes):
            continue
        kept.append(arg)
    return kept
