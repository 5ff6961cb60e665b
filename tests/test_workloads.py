"""The workload validator: every problem, as FILE:LINE: field: message, and nothing else passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specgauge.errors import WorkloadFileError
from workloads.schema import check_file, load_corpus

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "cli"]


def line(**fields) -> str:
    base = {"id": "a", "workload": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def write(tmp_path: Path, *lines: str | bytes) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")
    return path


def problems(path: Path) -> list[str]:
    return [str(p) for p in check_file(path)[1]]


def test_shipped_corpora_are_valid_and_cover_the_strata() -> None:
    for name, minimum in (("smoke.jsonl", 12), ("capture.jsonl", 32)):
        corpus = load_corpus(REPO / "workloads" / name)
        assert len(corpus.prompts) >= minimum
        assert set(corpus.strata) == {"chat", "code", "summarization"}


def test_comments_blank_lines_and_extra_fields_are_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "# a comment", "", line(id="x", extra={"kept": True}), "   ", line(id="y"))
    corpus = load_corpus(path)
    assert [p.id for p in corpus.prompts] == ["x", "y"]
    assert corpus.prompts[0].model_extra == {"extra": {"kept": True}}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"id": "a", "workload": "chat", "messages": [', ":1: (json): invalid JSON"),
        ("[1, 2]", ":1: (json): expected an object, got list"),
        (line(id=...), ":1: id: Field required"),
        (line(id=7), ":1: id: must be a string, got int"),
        (line(max_tokens=0), ":1: max_tokens: Input should be greater than 0"),
        (line(max_tokens="8"), ":1: max_tokens: must be an integer, got str"),
        (line(max_tokens=True), ":1: max_tokens: must be an integer, got bool"),
        (line(messages=[]), ":1: messages: List should have at least 1 item"),
        (line(messages=[{"role": "user", "content": "  "}]), ":1: messages[0].content: must not be empty"),
        (line(messages=[{"role": "robot", "content": "x"}]), ":1: messages[0].role: Input should be"),
        (line(workload=...), ":1: workload: Field required"),
    ],
)
def test_each_problem_names_file_line_and_field(tmp_path: Path, content: str, expected: str) -> None:
    path = write(tmp_path, content)
    found = problems(path)
    assert len(found) == 1, found
    assert found[0].startswith(str(path) + expected), found


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path) -> None:
    path = write(tmp_path, line(id="a"), line(id="a"), b'{"id": "b\xff"}', line(id="c", max_tokens=-1))
    found = problems(path)
    assert any(":2: id: duplicate id 'a' (first on line 1)" in p for p in found)
    assert any(":3: (encoding): not UTF-8" in p for p in found)
    assert any(":4: max_tokens:" in p for p in found)
    with pytest.raises(WorkloadFileError) as info:
        load_corpus(path)
    assert len(info.value.problems) == 3


def test_empty_and_missing_files_are_errors(tmp_path: Path) -> None:
    assert problems(write(tmp_path, "# only a comment"))[0].endswith(
        "no prompts: the file is empty or all comments"
    )
    assert "cannot read" in problems(tmp_path / "missing.jsonl")[0]


def test_cli_exit_codes_and_messages(tmp_path: Path) -> None:
    good = subprocess.run(
        [*CLI, "workloads", "validate", str(REPO / "workloads" / "smoke.jsonl")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert good.returncode == 0, good.stderr
    assert "ok, 12 prompts" in good.stdout
    bad_path = write(tmp_path, line(id="a"), line(id="a", max_tokens=0))
    bad = subprocess.run(
        [*CLI, "workloads", "validate", str(bad_path)], capture_output=True, text=True, cwd=REPO
    )
    assert bad.returncode == 1
    assert f"{bad_path}:2: max_tokens: Input should be greater than 0" in bad.stderr
