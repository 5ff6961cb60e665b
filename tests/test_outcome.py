"""What a campaign run reports per cell (tasks/outcome.py): the run log's line for people."""

from __future__ import annotations

from artifacts.documents import CellSummary, Distribution, Latency, RequestCounts
from tasks.outcome import cell_log_line


def test_a_cells_log_line_rounds_its_figures_and_names_their_units() -> None:
    summary = CellSummary(
        status="ok",
        requests=RequestCounts(total=8, ok=7, failed=1),
        output_throughput_tok_s=123.456789,
        latency_s=Latency(ttft=Distribution(p50=0.12345678), tpot=Distribution(p50=0.038000470146821425)),
    )
    line = cell_log_line("plain.r1.chat.c4", "ok", summary)
    assert line == "plain.r1.chat.c4: 7/8 ok, 123.5 tok/s, TTFT p50 123.5 ms, TPOT p50 38.0 ms"


def test_figures_a_cell_lacks_read_not_available_rather_than_zero() -> None:
    # One-token answers have no TPOT; a cell without a positive wall time has no throughput.
    summary = CellSummary(
        status="ok",
        requests=RequestCounts(total=2, ok=2, failed=0),
        latency_s=Latency(ttft=Distribution(p50=0.5)),
    )
    assert cell_log_line("c", "ok", summary) == "c: 2/2 ok, n/a tok/s, TTFT p50 500.0 ms, TPOT p50 n/a"


def test_a_failed_cells_line_says_why() -> None:
    summary = CellSummary(status="failed", error="every measured request failed: timeout=3")
    assert cell_log_line("c", "failed", summary) == "c failed: every measured request failed: timeout=3"
