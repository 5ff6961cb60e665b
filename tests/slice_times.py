"""How long each marker slice of the suite took within one whole run (the tables in tests/README.md).

    make test PYTEST_ARGS="--junitxml=var/junit.xml"
    .venv/bin/python tests/slice_times.py var/junit.xml

Times come from the run's JUnit report (each test's set-up, call and tear-down), so a session fixture counts
in the slice of the first test that asked for it, as it did in the run; slices are selected as
tests/README.md says (`pytest --collect-only -m ...`), and overlap where the markers do. The second table
splits the run by worker: the serial group (tests/conftest.py `runs_serially`) and the rest, which `make
test` runs side by side, so the run takes about as long as the longer of the two.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SLICES = {
    "no marker": "not engine and not slurm and not server and not chromium",
    "`server`, not engine/slurm": "server and not engine and not slurm",
    "`chromium`": "chromium",
    "`slurm`, not engine": "slurm and not engine",
    "`engine`": "engine",
}


def junit_times(report: Path) -> dict[str, float]:
    """Seconds per test id (`tests/test_x.py::test_y[param]`) from a JUnit XML report."""
    times: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = (case.get("name") or "").removesuffix("@serial")  # pytest-xdist's group suffix (conftest.py)
        times[f"{module}.py::{name}"] = float(case.get("time") or 0.0)
    return times


def selected(expression: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", expression],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    return {line.strip() for line in out.stdout.splitlines() if "::" in line}


def serial_ids() -> set[str]:
    """The tests conftest.py puts in the serial worker's group (collected in a child pytest)."""
    plugin = (
        "import pytest\n"
        "class P:\n"
        "    def pytest_collection_finish(self, session):\n"
        "        for item in session.items:\n"
        "            if item.get_closest_marker('xdist_group'):\n"
        "                print('SERIAL', item.nodeid.removesuffix('@serial'))\n"
        "pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider'], plugins=[P()])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", plugin], capture_output=True, text=True, cwd=REPO, check=False
    )
    return {line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("SERIAL ")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("report", type=Path, help="the JUnit XML report of one whole run")
    args = parser.parse_args()
    times = junit_times(args.report)
    print("| slice | tests | time |\n|---|---|---|")
    for name, expression in SLICES.items():
        ids = selected(expression)
        seconds = sum(times.get(i, 0.0) for i in ids)
        missing = len(ids - times.keys())
        note = f" ({missing} not in the report)" if missing else ""
        print(f"| {name} | {len(ids)} | {seconds / 60:.1f} min{note} |")
    print(f"| everything | {len(times)} | {sum(times.values()) / 60:.1f} min |")
    serial = serial_ids()
    print("\n| worker | tests | time |\n|---|---|---|")
    for name, ids in (("serial group", serial), ("the rest", times.keys() - serial)):
        print(f"| {name} | {len(ids)} | {sum(times.get(i, 0.0) for i in ids) / 60:.1f} min |")


if __name__ == "__main__":
    main()
