"""The workload format (the seed study's JSONL) and its validator.

One JSON object a line: `id` (unique string), `workload` (stratum name), `messages` (OpenAI chat
messages), `max_tokens` (> 0). Extra fields are kept but ignored; blank lines and `#` lines are skipped.
Every problem is reported as `FILE:LINE: field: message`, all of them, not just the first (up to
MAX_PROBLEMS).

A stratum becomes part of cell ids and so of folder names: it must be a safe name (specgauge.names). The
file is read as a stream with lines of at most MAX_LINE_BYTES: a line longer than that (a gigantic line,
/dev/zero) is reported at its line and ends the reading, and JSON nested too deeply for the parser is a
problem of its line, never a crash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specgauge.errors import WorkloadError, WorkloadFileError
from specgauge.names import safe_name_problem

MAX_LINE_BYTES = 8 * 1024 * 1024  # one prompt a line: 8 MiB is far beyond any context window
MAX_PROBLEMS = 1000  # a file that is not a corpus at all stops being read after this many

Role = Literal["system", "user", "assistant", "tool", "developer"]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Role
    content: str

    @field_validator("content")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class Prompt(BaseModel):
    """One request of a corpus. Extra fields survive in `model_extra`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str = Field(min_length=1)
    workload: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    max_tokens: int = Field(gt=0)

    @field_validator("id", "workload", mode="before")
    @classmethod
    def strict_string(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {type(value).__name__}")
        return value

    @field_validator("workload")
    @classmethod
    def safe_stratum(cls, value: str) -> str:
        # The stratum is part of cell ids, hence of folder names under SPECGAUGE_HOME.
        problem = safe_name_problem(value, "stratum")
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("max_tokens", mode="before")
    @classmethod
    def strict_int(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, got {type(value).__name__}")
        return value

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.messages]


class Corpus(BaseModel):
    """A validated workload file: its prompts in file order, and the file's identity."""

    model_config = ConfigDict(frozen=True)

    path: str
    sha256: str
    prompts: tuple[Prompt, ...]

    @property
    def strata(self) -> list[str]:
        return sorted({p.workload for p in self.prompts})

    def stratum(self, name: str) -> list[Prompt]:
        return [p for p in self.prompts if p.workload == name]


def _field_name(loc: tuple[int | str, ...]) -> str:
    name = ""
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "(object)"


def _problems_of_line(path: Path, lineno: int, text: str) -> tuple[Prompt | None, list[WorkloadError]]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [WorkloadError(path, lineno, "(json)", f"invalid JSON: {exc.msg} at column {exc.colno}")]
    except RecursionError:
        return None, [WorkloadError(path, lineno, "(json)", "nested too deeply to be a prompt")]
    if not isinstance(obj, dict):
        return None, [WorkloadError(path, lineno, "(json)", f"expected an object, got {type(obj).__name__}")]
    try:
        return Prompt.model_validate(obj), []
    except RecursionError:
        return None, [WorkloadError(path, lineno, "(object)", "nested too deeply to be a prompt")]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            message = err["msg"].removeprefix("Value error, ")
            problems.append(WorkloadError(path, lineno, _field_name(err["loc"]), message))
        return None, problems


def _scan(path: Path) -> tuple[list[Prompt], list[WorkloadError], str]:
    """(prompts, problems, sha256 of what was read), reading the file as a stream of bounded lines."""
    prompts: list[Prompt] = []
    problems: list[WorkloadError] = []
    digest = hashlib.sha256()
    first_line_of: dict[str, int] = {}
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; OSError must be told apart from reading errors
    except OSError as exc:
        return [], [WorkloadError(path, 0, "(file)", f"cannot read: {exc.strerror or exc}")], ""
    with fh:
        lineno = 0
        while len(problems) < MAX_PROBLEMS:
            try:
                line_bytes = fh.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                problems.append(
                    WorkloadError(path, lineno + 1, "(file)", f"cannot read: {exc.strerror or exc}")
                )
                break
            if not line_bytes:
                break
            lineno += 1
            digest.update(line_bytes)
            if len(line_bytes) > MAX_LINE_BYTES:
                problems.append(
                    WorkloadError(
                        path,
                        lineno,
                        "(line)",
                        f"longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB: not a prompt (the rest of the file "
                        "was not read)",
                    )
                )
                break
            try:
                line = line_bytes.decode("utf-8")
            except UnicodeDecodeError as exc:
                problems.append(WorkloadError(path, lineno, "(encoding)", f"not UTF-8: byte {exc.start + 1}"))
                continue
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            prompt, line_problems = _problems_of_line(path, lineno, stripped)
            problems.extend(line_problems)
            if prompt is None:
                continue
            if prompt.id in first_line_of:
                problems.append(
                    WorkloadError(
                        path,
                        lineno,
                        "id",
                        f"duplicate id {prompt.id!r} (first on line {first_line_of[prompt.id]})",
                    )
                )
                continue
            first_line_of[prompt.id] = lineno
            prompts.append(prompt)
        else:
            problems.append(
                WorkloadError(
                    path, lineno, "(file)", f"{MAX_PROBLEMS} problems: the rest of the file was not read"
                )
            )
    if not prompts and not problems:
        problems.append(WorkloadError(path, 0, "(file)", "no prompts: the file is empty or all comments"))
    return prompts, problems, digest.hexdigest()


def check_file(path: Path | str) -> tuple[list[Prompt], list[WorkloadError]]:
    """Parse a workload file and return its prompts and every problem found (possibly none)."""
    prompts, problems, _ = _scan(Path(path))
    return prompts, problems


def load_corpus(path: Path | str) -> Corpus:
    """Load a workload file, or raise WorkloadFileError listing every problem."""
    path = Path(path)
    prompts, problems, sha256 = _scan(path)
    if problems:
        raise WorkloadFileError(problems)
    return Corpus(path=str(path), sha256=sha256, prompts=tuple(prompts))


def validate_files(paths: Iterable[Path | str]) -> list[WorkloadError]:
    problems: list[WorkloadError] = []
    for path in paths:
        problems.extend(check_file(path)[1])
    return problems
