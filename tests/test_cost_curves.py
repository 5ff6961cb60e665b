"""benchmarks/cost_curves.py at its smallest: a real 3-cell campaign through the campaign flow on the stand-in
engine (the in-repo emulator, local launcher), ingested and analysed, and a generated 3-cell tree; its
table has every column, its phases add up to the flow's wall time, and its chart is a PNG. No timing is
judged here: the figures are docs/performance.md's, "Cost curves"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "cost_curves.py"

pytestmark = pytest.mark.server


def table_columns() -> tuple[str, ...]:
    """The benchmark's table columns, from the script itself (a script of benchmarks/, which is no package)."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.append(str(SCRIPT.parent))
    import cost_curves

    return cost_curves.COLUMNS


@pytest.mark.timeout(900)
def test_three_cells_on_the_emulator_give_every_column(tmp_path: Path) -> None:
    saved, chart = tmp_path / "rows.json", tmp_path / "chart.png"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--sizes",
            "3",
            "--synthetic",
            "3",
            "--launchers",
            "emulator",
            "--workdir",
            str(tmp_path),
            "--json",
            str(saved),
            "--chart",
            str(chart),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    header, _, *lines = [line for line in done.stdout.splitlines() if line.startswith("|")]
    columns = table_columns()
    assert [c.strip() for c in header.strip("|").split("|")] == list(columns)
    # the real run's line and the generated tree's (at least), each filling every column
    assert len(lines) >= 2 and all(len(line.strip("|").split("|")) == len(columns) for line in lines)
    rows = json.loads(saved.read_text())["rows"]
    real = next(r for r in rows if r["source"] == "measured")
    synthetic = next(r for r in rows if r["source"] == "synthetic")
    assert (real["launcher"], real["cells"], real["deployments"]) == ("emulator", 3, 1)
    # The phases come from the campaign's own records and add up to the flow's wall time.
    parts = real["windows_s"] + real["engine_starts_s"] + real["plan_s"] + real["run_overhead_s"]
    assert parts == pytest.approx(real["flow_s"])
    assert real["windows_s"] > 0 and real["engine_starts_s"] > 0 and real["run_overhead_s"] > 0
    assert real["ingest_s"] > 0 and real["analysis_s"] > 0 and real["prefect_start_s"] > 0
    assert synthetic["cells"] == 3 and synthetic["run_overhead_s"] is None
    # The 3-cell generated tree's line takes its run overhead from the real run, and says so.
    extrapolated = [line for line in done.stdout.splitlines() if "per-cell overhead at 3 cells" in line]
    assert len(extrapolated) == 1
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_size_without_a_campaign_shape_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "7", "--synthetic", "", "--launchers", "emulator"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "--sizes: 7 cells has no campaign shape" in done.stderr
