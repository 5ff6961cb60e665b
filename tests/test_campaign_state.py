"""Campaign state on disk: run records."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.campaign_state import record_run


def test_runs_within_one_second_get_their_own_records_in_order(tmp_path: Path) -> None:
    # A resumed campaign with nothing left to do can finish in the same second as the run before it.
    paths = [record_run(tmp_path, {"run": n}) for n in range(3)]
    assert len(set(paths)) == 3
    ordered = sorted((tmp_path / "runs").glob("*.json"))
    assert [json.loads(p.read_text())["run"] for p in ordered] == [0, 1, 2]


def test_the_closing_table_fits_a_120_column_terminal() -> None:
    # The table `campaign run` and `demo` end with: rich cuts columns that do not fit, so every header must
    # show at 120 columns, with the widest figures a campaign prints.
    from rich.console import Console

    from cli.commands.campaign import headline_table

    row = {
        "variant": "draft-k3",
        "repeat": 1,
        "workload": "summarize",
        "load": "rate12.5",
        "status": "ok",
        "ok": "1000/1000",
        "tok/s": "12345.6",
        "TTFT p50 s": "12.345",
        "TPOT p50 s": "0.1234",
        "acceptance": "0.456",
        "mean acc. len": "3.45",
    }
    long_names = dict(row, variant="eagle3-k5-long-variant-name", status="not run (launch failed)")
    console = Console(width=120, record=True, color_system=None)
    table = headline_table("campaign demo-0123abcd-label", [row, long_names])
    console.print(table)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 120
    headers = [column.header for column in table.columns]
    assert len(headers) == len(row)
    header_lines = text.splitlines()[1:5]  # title, top rule, header rows
    for header in headers:
        assert any(header in line for line in header_lines), (header, text)
    for figure in ("1000/1000", "12345.6", "12.345", "0.1234", "0.456", "3.45"):
        assert figure in text, (figure, text)
