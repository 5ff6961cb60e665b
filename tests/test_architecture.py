"""The house's rules (docs/design.md, issue 31), checked on the tree as it stands: import-linter's contracts in
pyproject.toml hold with no exception listed, no module needs `noqa: E402` (imports after code), and no
function outside tests/ and models/ (training scripts) runs over 120 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LONGEST_FUNCTION = 120
SKIPPED = ("tests", "models", "var", ".venv", ".engine-venv")


def source_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO / name for name in tracked if (REPO / name).is_file()]


def test_the_import_contracts_hold_with_no_exception_listed() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["contracts"], "no import-linter contract in pyproject.toml"
    for contract in config["contracts"]:
        assert not contract.get("ignore_imports"), f"{contract['name']}: exceptions listed"
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert f"Contracts: {len(config['contracts'])} kept, 0 broken." in done.stdout


def test_no_module_imports_after_code() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in source_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if "noqa: E402" in line and path.name != "test_architecture.py"
    ]
    assert not offenders, offenders


def test_no_function_runs_over_120_lines_outside_tests_and_training_scripts() -> None:
    long = []
    for path in source_files():
        relative = path.relative_to(REPO)
        if relative.parts[0] in SKIPPED:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(relative))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONGEST_FUNCTION:
                    long.append(f"{relative}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long
