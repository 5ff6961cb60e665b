"""Campaign state on disk: run records."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.campaign import record_run


def test_runs_within_one_second_get_their_own_records_in_order(tmp_path: Path) -> None:
    # A resumed campaign with nothing left to do can finish in the same second as the run before it.
    paths = [record_run(tmp_path, {"run": n}) for n in range(3)]
    assert len(set(paths)) == 3
    ordered = sorted((tmp_path / "runs").glob("*.json"))
    assert [json.loads(p.read_text())["run"] for p in ordered] == [0, 1, 2]
