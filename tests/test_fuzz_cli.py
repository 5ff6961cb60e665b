"""Fuzzed arguments and files to every command (issue 34): no traceback ever reaches the user.

The command tree is walked from cli.app.app, so a new command is fuzzed without editing this file (unless it
would launch an engine or serve forever: EXCLUDED says why for each one left out). Hypothesis draws, for
each command, arguments from random text, numbers out of any range, and paths to generated bad files
(random bytes, JSON and YAML nested thousands deep, a 2 MB line, empty files, directories, /dev/null), and
runs the real app in-process (typer's CliRunner, exceptions not caught by the runner: one that escapes the
app fails the test as it would reach the user). Every run must end with exit code 0, 1 or 2 and print no
traceback. derandomize=True: CI runs the same examples every time.
"""

from __future__ import annotations

import collections
import json
import signal
import string
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.app import app

pytest_plugins = ["reliability_support"]

TRACEBACK = "Traceback (most recent call last)"
EXAMPLES_PER_COMMAND = 20
EXAMPLE_TIMEOUT_S = 30  # one command on bad input answers in well under a second; more means it blocked

# Commands not fuzzed, by path, and why: each would start something real and long-lived when the drawn
# arguments happen to be acceptable (most of their options have working defaults).
EXCLUDED: dict[str, str] = {
    "emulator": "serves until SIGINT when its options are valid (its port bound: test_hostile_errors.py)",
    "reports serve": "serves until Ctrl-C when host and port are valid (bad ones: test_hostile_errors.py)",
    "prefect server": "execs the Prefect server",
    "prefect worker": "execs a Prefect worker",
    "prefect deploy": "runs the Prefect CLI against a server",
    "prefect alerts": "writes blocks and automations to the Prefect API",
    "blocks register": "registers block types with the Prefect API",
    "demo": "takes no arguments: runs the decision loop on the embedded engine",
    "decide": "its default spec is valid: it would sweep on the embedded engine",
    "campaign verify-recommendation": "with a campaign id it starts the decide flow (Prefect)",
    "drafters train": "an empty --jsonl passes the early checks and starts the training flow (Prefect, torch)",
}


class Blocked(BaseException):
    """Raised by the alarm in a command that ran too long (not an Exception: the CLI boundary lets it by)."""


def leaf_commands() -> list[tuple[str, Any]]:
    """(path, click command) of every runnable command under the app, in name order."""

    def walk(command: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), command

    return list(walk(typer.main.get_command(app), []))


# -- bad files -------------------------------------------------------------------------------------------------
SUFFIXES = ["", ".txt", ".json", ".jsonl", ".yaml", ".yml", ".sqlite", ".duckdb", ".parquet", ".gz", ".csv"]


def bad_contents() -> st.SearchStrategy[bytes | None]:
    """A file's bytes (None: a directory instead of a file)."""
    depth = st.integers(min_value=100, max_value=6000)
    return st.one_of(
        st.binary(max_size=2000),
        st.just(b""),
        st.none(),
        depth.map(lambda n: b"[" * n + b"]" * n),  # JSON nested thousands deep
        depth.map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        depth.map(lambda n: b"- " * n + b"x\n"),  # YAML nested thousands deep
        depth.map(lambda n: b"[" * n),  # unclosed
        st.integers(min_value=1, max_value=2_000_000).map(lambda n: b"a" * n),  # a huge line
        st.just(b'{"name": 1, "variants": "x", "workloads": [null]}\n'),
        st.just(b'{"id": "p", "workload": "w", "messages": 5}\n' * 3),
        st.just(b"a: &a [1]\nb: &b [*a, *a]\nc: [*b, *b]\n"),
        st.just(b"\xff\xfe\x00\x00garbage"),
        st.just(b'vllm:num_requests_running{model_name="m"} NaN\n# TYPE x counter\nx 1e999\n'),
    )


def file_value(base: Path, counter: Iterator[int]) -> st.SearchStrategy[str]:
    """A path to a freshly written bad file or folder under `base`, /dev/null, or a path that is not there."""

    @st.composite
    def make(draw: st.DrawFn) -> str:
        choice = draw(st.sampled_from(["file", "file", "file", "devnull", "missing"]))
        if choice == "devnull":
            return "/dev/null"
        path = base / f"f{next(counter)}{draw(st.sampled_from(SUFFIXES))}"
        if choice == "missing":
            return str(path / "not-there")
        content = draw(bad_contents())
        if content is None:
            path.mkdir()
            if draw(st.booleans()):  # a folder that looks like a head, a capture or a results tree
                (path / draw(st.sampled_from(["config.json", "meta.json", "metadata.json"]))).write_bytes(
                    draw(bad_contents().filter(lambda c: c is not None))  # type: ignore[arg-type]
                )
        else:
            path.write_bytes(content)
        return str(path)

    return make()


TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)  # argv cannot carry NUL or lone surrogates
NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([-1, 0, 65536, 99999, 2**31, 2**63, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "0x10", "1_000", "", " "]),
).map(str)
LISTS = st.lists(st.one_of(NUMBERS, st.text(string.ascii_letters + ",.-_/ ", max_size=8)), max_size=4).map(
    ",".join
)


def value(base: Path, counter: Iterator[int]) -> st.SearchStrategy[str]:
    return st.one_of(TEXT, NUMBERS, LISTS, file_value(base, counter))


def kind_of(param: Any) -> type:
    """int, float or str: what the option's annotation parses to (Optional unwrapped)."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    parts = typing.get_args(annotation) or (annotation,)
    return next((t for t in (int, float) if t in parts), str)


def value_for(param: Any, base: Path, counter: Iterator[int]) -> st.SearchStrategy[str]:
    """Mostly values that parse (so the command body runs on them), some that do not."""
    if kind_of(param) is int:
        return st.one_of(st.integers(-3, 10**7).map(str), st.integers(-3, 64).map(str), NUMBERS)
    if kind_of(param) is float:
        return st.one_of(st.floats(-10, 10).map(str), st.floats(0, 1).map(str), NUMBERS)
    return value(base, counter)


@st.composite
def arguments(draw: st.DrawFn, command: Any, base: Path, counter: Iterator[int]) -> list[str]:
    """A command line for `command`: some of its options (required ones always), its positionals, and
    sometimes a stray token."""
    options: list[str] = []
    positionals: list[str] = []
    for param in command.params:
        opts = list(getattr(param, "opts", []))
        is_argument = type(param).__name__.endswith("Argument")
        if is_argument:
            count = draw(st.integers(0, 3)) if param.nargs == -1 else param.nargs
            if not param.required and draw(st.booleans()):
                continue
            positionals += [draw(value(base, counter)) for _ in range(max(count, 0))]
            continue
        if not param.required and draw(st.integers(0, 2)):  # a third of the optional ones
            continue
        if getattr(param, "is_flag", False):
            flags = opts + list(getattr(param, "secondary_opts", []))
            options.append(draw(st.sampled_from(flags)))
            continue
        options.append(draw(st.sampled_from(opts)))
        options += [draw(value_for(param, base, counter)) for _ in range(max(param.nargs, 1))]
    tokens = options + positionals
    if draw(st.integers(0, 19)) == 0:
        tokens.insert(draw(st.integers(0, len(tokens))), draw(st.sampled_from(["--bogus", "-x", "--", "-"])))
    return tokens


def _alarm(signum: int, frame: Any) -> None:
    raise Blocked(f"a command ran longer than {EXAMPLE_TIMEOUT_S} s")


@dataclass
class Seen:
    examples: int = 0
    codes: collections.Counter[int] = field(default_factory=collections.Counter)
    internal: list[str] = field(default_factory=list)
    answers: collections.Counter[str] = field(default_factory=collections.Counter)


def fuzz_one(
    runner: CliRunner, path: str, command: Any, files: Path, counter: Iterator[int], seen: Seen
) -> Callable[[], None]:
    """The hypothesis test of one command: drawn arguments in, no traceback and exit 0/1/2 out."""

    @settings(
        max_examples=EXAMPLES_PER_COMMAND,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        args = data.draw(arguments(command, files, counter), label="args")
        signal.alarm(EXAMPLE_TIMEOUT_S)
        try:
            done = runner.invoke(app, [*path.split(), *args], catch_exceptions=False)
        finally:
            signal.alarm(0)
        seen.examples += 1
        seen.codes[done.exit_code] += 1
        lines = done.output.splitlines()
        seen.answers[
            "usage"
            if "Usage:" in done.output
            else "error line"
            if any(x.startswith("error: ") for x in lines)
            else "other"
        ] += 1
        shown = f"{path} {json.dumps(args)[:300]}: exit {done.exit_code}\n{done.output[-1500:]}"
        assert TRACEBACK not in done.output, shown
        assert done.exit_code in (0, 1, 2), shown
        seen.internal += [
            f"{path}: {line[:200]}" for line in done.output.splitlines() if "internal error:" in line
        ]

    return fuzz


def test_fuzzed_arguments_and_files_to_every_command(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, observe
) -> None:
    work = tmp_path / "cwd"  # relative output paths (sql -o, profile chart --out) land here, not in the repo
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("SPECGAUGE_DEBUG", raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # nothing fuzzed here may reach a Prefect server
    counter = iter(range(10**9))
    runner = CliRunner()
    commands = [(path, c) for path, c in leaf_commands() if path not in EXCLUDED]
    assert len(commands) >= 20, [p for p, _ in commands]  # the walk found the tree
    seen = Seen()
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for path, command in commands:
            files = tmp_path / "files" / path.replace(" ", "-")
            files.mkdir(parents=True)
            fuzz_one(runner, path, command, files, counter, seen)()
    finally:
        signal.signal(signal.SIGALRM, previous)
    observe(
        "fuzzed arguments and files to every command",
        done=f"{len(commands)} commands (all but {len(EXCLUDED)} that would launch or serve for real: "
        f"{', '.join(EXCLUDED)}), {EXAMPLES_PER_COMMAND} hypothesis examples each (derandomized): random "
        "text, out-of-range numbers, files of random bytes, JSON/YAML nested thousands deep, a 2 MB line, "
        "empty files, folders, /dev/null",
        expected="no traceback; exit 0, 1 or 2",
        observed=f"commands driven: {len(commands)}; examples run: {seen.examples}; tracebacks seen: 0; exit "
        f"codes {dict(sorted(seen.codes.items()))}; answers {dict(seen.answers)}; caught as internal errors (one line): {len(seen.internal)}"
        + (f" ({'; '.join(sorted(set(seen.internal))[:5])})" if seen.internal else ""),
    )
