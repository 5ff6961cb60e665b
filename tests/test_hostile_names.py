"""Names from data that would become paths (issue 34, finding 1), and corpus files made to crash the reader.

A variant name in an imported reference metadata.json, or a stratum (`workload`) in a corpus line, becomes part
of folder names under SPECGAUGE_HOME. Each hostile name here points outside the home (at a sibling folder of
it, in the test's tmp dir); the tests run the real CLI and check that nothing appeared there or anywhere
outside the home, that the command exits as documented, and that its message names the file, line and field.
A bad `started_at` in an import (finding 6) is a damaged file, not a traceback.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_support import REPO, corpus, emulator_spec, write_spec

from artifacts import layout
from artifacts.store import atomic_dir, write_json_atomic
from specgauge.errors import ArtifactError
from workloads.schema import MAX_LINE_BYTES, check_file

pytest_plugins = ["reliability_support"]

CLI = [sys.executable, "-m", "cli"]
FIXTURE = REPO / "tests" / "fixtures" / "seed" / "results" / "8b" / "eagle" / "confirm"
BASELINE_CELL = FIXTURE / "apertus15-8b-baseline-confirm-c1-20260926T131028Z" / "cells" / "code" / "c1"
EAGLE_CELL = FIXTURE / "apertus15-8b-eagle31-k3-confirm-c1-20260926T125727Z" / "cells" / "code" / "c1"
ROW = "names from data that would become paths"


def run_cli(home: Path, *args: str, timeout: float = 180, **kwargs) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECGAUGE_HOME": str(home), "COLUMNS": "400"}
    return subprocess.run(
        [*CLI, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **kwargs
    )


def outside(tmp_path: Path, home: Path, expected: set[str]) -> list[str]:
    """Everything under the test's tmp dir that is neither in the home nor one of the test's own inputs."""
    return sorted(
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if home not in p.parents and p != home and p.relative_to(tmp_path).parts[0] not in expected
    )


def seed_tree(root: Path, cells: dict[str, Path]) -> Path:
    """A reference results folder: one copy of a fixture cell per relative folder."""
    for relative, source in cells.items():
        shutil.copytree(source, root / relative)
    return root


def edit_metadata(cell: Path, change) -> Path:
    path = cell / "metadata.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


# -- the seed importer ----------------------------------------------------------------------------------------
HOSTILE_IMPORTS = {
    # variant.name -> slot, deployment and cell folders: 4 levels up from RAW/seed-t/cells is the tmp dir.
    "variant.name": ("../../../../escaped", lambda d, v: d["variant"].__setitem__("name", v)),
    "cell.workload": ("../../../../../escaped", lambda d, v: d["cell"].__setitem__("workload", v)),
    "cell.workload newline": ("a\nb", lambda d, v: d["cell"].__setitem__("workload", v)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_IMPORTS))
def test_import_seed_refuses_names_that_would_leave_the_home(case: str, tmp_path: Path, observe) -> None:
    value, put = HOSTILE_IMPORTS[case]
    field = case.split()[0]
    home = tmp_path / "home"
    study = seed_tree(tmp_path / "study", {"good/c1": EAGLE_CELL, "bad/c1": BASELINE_CELL})
    metadata = edit_metadata(study / "bad" / "c1", lambda d: put(d, value))

    done = run_cli(home, "import", "seed", str(study), "--campaign", "t")

    escaped = outside(tmp_path, home, {"study"})
    raw = home / "raw"
    written = [str(p.relative_to(raw)) for p in raw.rglob("*")] if raw.exists() else []
    assert escaped == [], f"written outside SPECGAUGE_HOME: {escaped}"
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and f"{metadata}: field {field}: " in errors[0] and "nothing was imported" in errors[0]
    assert written == []  # refused before anything was written (the good cell too)
    observe(
        ROW,
        done=f"`specgauge import seed` of a reference tree whose metadata.json has {field} {value!r}",
        expected="refused before writing anything, exit 2, one error naming the file and field; nothing "
        "outside SPECGAUGE_HOME",
        observed=f"exit {done.returncode}; {errors[0][:160]!r}; {len(escaped)} paths outside the home, "
        f"{len(written)} under its raw tree",
        records_lost=0,
        leaked=len(escaped),
    )


def test_import_seed_with_a_bad_started_at_names_the_file_and_field(tmp_path: Path) -> None:
    """Finding 6: a `started_at` that is not a time was a traceback (ValueError from fromisoformat)."""
    home = tmp_path / "home"
    study = seed_tree(tmp_path / "study", {"good/c1": EAGLE_CELL, "bad/c1": BASELINE_CELL})
    metadata = edit_metadata(study / "bad" / "c1", lambda d: d.__setitem__("started_at", "yesterday at noon"))

    done = run_cli(home, "import", "seed", str(study), "--campaign", "t")

    assert "Traceback" not in done.stderr + done.stdout
    assert done.returncode == 1, done.stdout + done.stderr  # the rest imported, one file damaged
    (row,) = [line for line in done.stdout.splitlines() if str(metadata) in line]
    assert "DAMAGED: field started_at: 'yesterday at noon' is not an ISO 8601 time" in row
    assert "seed-t: 1 cell(s) written" in done.stdout


def test_a_time_without_utc_offset_is_damage_not_a_guess(tmp_path: Path) -> None:
    home = tmp_path / "home"
    study = seed_tree(tmp_path / "study", {"a/c1": EAGLE_CELL, "b/c1": BASELINE_CELL})
    edit_metadata(study / "b" / "c1", lambda d: d.__setitem__("started_at", "2026-09-26T13:18:12"))
    done = run_cli(home, "import", "seed", str(study), "--campaign", "t")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "field started_at: '2026-09-26T13:18:12' has no UTC offset" in done.stdout


# -- corpora ----------------------------------------------------------------------------------------------------
def prompt_line(stratum: str, ident: str = "p0") -> str:
    return json.dumps(
        {"id": ident, "workload": stratum, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    )


@pytest.mark.parametrize("stratum", ["../../x", "a\nb", ".hidden", "x" * 49])
def test_workloads_validate_names_a_stratum_that_cannot_be_a_folder(stratum: str, tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text(prompt_line("chat") + "\n" + prompt_line(stratum, "p1") + "\n")
    done = run_cli(tmp_path / "home", "workloads", "validate", str(path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"{path}:2: workload: stratum "), done.stderr
    assert "letters, digits" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.server  # a real Prefect API: on the code before the fix the campaign ran and wrote outside
def test_campaign_run_refuses_a_stratum_that_would_leave_the_home(
    prefect_api, standin_engine, home: Path, tmp_path: Path, observe
) -> None:
    # cells/plain.r0.<stratum>.c1.a1: five levels up from cells/plain.r0.. is the tmp dir.
    hostile = "../../../../../escaped"
    work = corpus(tmp_path / "w.jsonl", [("p0", "chat", "hi", 8), ("p1", hostile, "hello", 8)])
    spec = write_spec(tmp_path / "s.yaml", emulator_spec("hostile-stratum", work))
    done = subprocess.run(
        [*CLI, "campaign", "run", str(spec), "--no-gate", "--no-analyze"],
        cwd=REPO,
        env={**os.environ, "PREFECT_API_URL": prefect_api, "SPECGAUGE_HOME": str(home), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    escaped = outside(tmp_path, home, {"w.jsonl", "s.yaml", "standin-args"})
    raw = home / "raw"
    written = [str(p.relative_to(raw)) for p in raw.rglob("*")] if raw.exists() else []
    assert escaped == [], f"written outside SPECGAUGE_HOME: {escaped}"
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{work}:2: workload: stratum " in done.stderr and "Traceback" not in done.stderr
    assert written == []
    observe(
        ROW,
        done=f"`specgauge campaign run` of a spec whose corpus has a line with workload {hostile!r}",
        expected="refused before anything runs, exit 2, FILE:LINE: workload: message; nothing outside "
        "SPECGAUGE_HOME",
        observed=f"exit {done.returncode}; the message names {work.name}:2 workload; {len(escaped)} paths "
        f"outside the home, {len(written)} under its raw tree",
        records_lost=0,
        leaked=len(escaped),
    )


def _limited_memory() -> None:  # the child may not take the machine's memory down with it
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_a_corpus_that_is_dev_zero_is_a_line_error_not_memory_exhaustion(tmp_path: Path, observe) -> None:
    done = run_cli(tmp_path / "home", "workloads", "validate", "/dev/zero", preexec_fn=_limited_memory)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.startswith("/dev/zero:1: (line): longer than 8 MiB"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    observe(
        ROW,
        done="`specgauge workloads validate /dev/zero` (memory limited to 4 GiB)",
        expected="one FILE:LINE problem, exit 1, no MemoryError",
        observed=f"exit {done.returncode}; {done.stderr.strip()[:120]!r}",
        records_lost=0,
        leaked=0,
    )


def test_a_gigantic_line_and_deep_nesting_are_line_errors(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    huge = json.dumps(
        {"id": "big", "workload": "chat", "messages": [{"role": "user", "content": "x" * MAX_LINE_BYTES}]}
    )
    deep = '{"id": "deep", "workload": "chat", "messages": ' + "[" * 5000 + "]" * 5000 + "}"
    path.write_text("\n".join([prompt_line("chat"), deep, huge, prompt_line("chat", "never-read")]) + "\n")
    done = run_cli(tmp_path / "home", "workloads", "validate", str(path))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        f"{path}:2: (json): nested too deeply to be a prompt",
        f"{path}:3: (line): longer than 8 MiB: not a prompt (the rest of the file was not read)",
    ]
    prompts, problems = check_file(path)  # the library too, not just the command
    assert [p.id for p in prompts] == ["p0"] and len(problems) == 2


# -- the last guard: artifact paths -----------------------------------------------------------------------
@pytest.mark.parametrize("cell_id", ["../../../../escaped", "a\nb", "x/y", "..", ""])
def test_the_layout_refuses_a_cell_path_outside_its_root(cell_id: str, tmp_path: Path) -> None:
    campaign = tmp_path / "home" / "raw" / "c"
    with pytest.raises(ArtifactError, match="refused, an artifact path must stay under"):
        layout.cell_dir(campaign, cell_id, 1)
    with pytest.raises(ArtifactError):
        layout.next_cell_attempt(layout.cells_dir(campaign), cell_id)
    for build in (layout.campaign_dir, layout.deployment_dir, layout.capture_dir, layout.profile_dir):
        with pytest.raises(ArtifactError):
            build(campaign, cell_id)
    assert not (tmp_path / "escaped.a1").exists() and not (tmp_path / "home").exists()


def test_the_store_refuses_an_artifact_named_dot_dot(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="refused"):
        write_json_atomic(tmp_path / "a" / "..", {"x": 1})
    with pytest.raises(ArtifactError, match="refused"), atomic_dir(tmp_path / "a" / ".hidden"):
        pass
    assert sorted(p.name for p in tmp_path.rglob("*")) in ([], ["a"])
