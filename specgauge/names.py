"""One rule for names that become parts of paths, deployment ids, job names and shell words.

Campaign names, variant names, strata (a corpus line's `workload`), labels and imported variant names all end
up as directory names under SPECGAUGE_HOME and in commands on clusters. A safe name is letters, digits, '.',
'_' and '-', starts with a letter or digit (so never '.', '..' or a dotfile), and is at most
SAFE_NAME_MAX characters. Check where data enters (spec, corpus validator, importer) with `check_safe_name`
or the `SafeName` pydantic type; the artifact store refuses any path outside its root as a last guard.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

SAFE_NAME_MAX = 48
SAFE_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{SAFE_NAME_MAX - 1}}}$")


def safe_name_problem(value: object, what: str = "name") -> str | None:
    """Why `value` is not a safe name (None when it is). Never echoes more than 60 characters of it."""
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__}"
    if SAFE_NAME.fullmatch(value):
        return None
    shown = repr(value if len(value) <= 60 else value[:57] + "...")
    return (
        f"{what} {shown} may only contain letters, digits, '.', '_' and '-', start with a letter or digit, "
        f"and be at most {SAFE_NAME_MAX} characters (names become folder names and reach shell commands)"
    )


def check_safe_name(value: object, what: str = "name") -> str:
    """`value` when it is a safe name; ValueError saying why otherwise (pydantic turns it into a field error)."""
    problem = safe_name_problem(value, what)
    if problem:
        raise ValueError(problem)
    return value  # type: ignore[return-value]


SafeName = Annotated[str, AfterValidator(lambda value: check_safe_name(value))]
"""A pydantic field type for safe names."""
