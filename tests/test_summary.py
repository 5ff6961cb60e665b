"""Per-cell math (tasks/metrics/summary.py) on hand-built request records with answers worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from metrics_support import DATA, SPEC_DELTA_KEYS

from experiments.spec import SLO
from tasks.load.records import RequestRecord, records_frame
from tasks.metrics.prometheus import SpecDelta, counter_delta, spec_decode_delta
from tasks.metrics.summary import (
    GENERATION_TOKENS_TOLERANCE,
    TOKENS_PER_STEP_TOLERANCE,
    distribution,
    summarize_cell,
)


def record(
    index: int,
    sent: float,
    offsets: list[float],
    tokens: list[int],
    *,
    phase: str = "measured",
) -> RequestRecord:
    """A successful streamed request: chunk offsets from send, tokens per chunk, usage = their sum."""
    n = sum(tokens)
    ttft, e2e = offsets[0], offsets[-1]
    return RequestRecord(
        index=index,
        prompt_id=f"p{index}",
        workload="chat",
        phase=phase,  # type: ignore[arg-type]
        endpoint="chat",
        queued_s=sent,
        sent_s=sent,
        first_token_s=sent + ttft,
        last_token_s=sent + e2e,
        ended_s=sent + e2e + 0.001,
        ttft_s=ttft,
        e2e_s=e2e,
        tpot_s=(e2e - ttft) / (n - 1) if n >= 2 else None,
        prompt_tokens=10,
        completion_tokens=n,
        chunks=len(offsets),
        chunk_offsets_s=offsets,
        chunk_tokens=tokens,
        tokens_exact=True,
        finish_reason="length",
        http_status=200,
        ok=True,
    )


def failure(index: int, sent: float, ended: float, error_class: str) -> RequestRecord:
    return RequestRecord(
        index=index,
        prompt_id=f"p{index}",
        workload="chat",
        phase="measured",
        endpoint="chat",
        queued_s=sent,
        sent_s=sent,
        ended_s=ended,
        ok=False,
        error_class=error_class,  # type: ignore[arg-type]
        error=f"injected {error_class}",
    )


def cell_frame() -> pl.DataFrame:
    """One warm-up request (its slow TTFT must not show), four good measured ones, two failures."""
    return records_frame(
        [
            record(0, 0.0, [0.6, 0.9], [1, 1], phase="warmup"),  # ends at 0.901
            record(1, 1.0, [0.1, 0.2, 0.3], [1, 1, 1]),  # 3 tokens, TPOT 0.1
            record(2, 1.1, [0.2, 0.26], [1, 3]),  # 4 tokens, TPOT 0.02
            record(3, 1.2, [0.3], [1]),  # 1 token: no TPOT
            record(4, 1.3, [0.4, 0.5, 0.9], [1, 2, 2]),  # 5 tokens, TPOT 0.125
            failure(5, 1.4, 2.5, "stream_cut"),  # the last measured end: wall = 2.5 - 1.0
            failure(6, 1.45, 1.6, "http_status"),
        ]
    )


SLO_ = SLO(ttft_p99_s=0.35, tpot_p99_s=0.11)


def summarize(frame: pl.DataFrame | None = None, **kwargs) -> dict:
    args = {
        "spec": None,
        "generation_tokens_delta": None,
        "gauges": None,
        "slo": SLO_,
        "measured_window": None,
    }
    return summarize_cell(cell_frame() if frame is None else frame, **(args | kwargs)).model_dump(mode="json")


def test_distribution_is_numpy_linear() -> None:
    assert distribution([1, 2, 3, 4]) == {
        "mean": 2.5,
        "p50": 2.5,
        "p90": pytest.approx(3.7),
        "p95": pytest.approx(3.85),
        "p99": pytest.approx(3.97),
        "n": 4,
    }
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "n": 0}


def test_requests_wall_and_throughput() -> None:
    summary = summarize()
    assert summary["status"] == "ok" and summary["error"] is None
    assert summary["requests"] == {
        "total": 6,
        "ok": 4,
        "failed": 2,
        "success_rate": pytest.approx(4 / 6),
        "errors": {"http_status": 1, "stream_cut": 1},
    }
    assert summary["wall_s"] == pytest.approx(1.5)
    assert summary["completion_tokens"] == 13
    assert summary["prompt_tokens"] == 40
    assert summary["output_throughput_tok_s"] == pytest.approx(13 / 1.5)
    assert summary["request_throughput_rps"] == pytest.approx(4 / 1.5)
    assert summary["tokens_per_chunk_mean"] == pytest.approx(13 / 9)
    assert summary["tokens_exact"] is True


def test_achieved_concurrency_is_requests_in_flight_over_the_window() -> None:
    # cell_frame: window 1.0-2.5 s; in flight 0.301 + 0.261 + 0.301 + 0.901 s (successes) + 1.1 + 0.15 s
    # (failures held a slot too); the warm-up request before the window does not count.
    assert summarize()["achieved_concurrency"] == pytest.approx(3.014 / 1.5)
    overlapping = records_frame([record(i, 0.0, [0.5, 1.0], [1, 1]) for i in range(4)])
    assert summarize(overlapping)["achieved_concurrency"] == pytest.approx(4.0)
    # one wave of 12 requests (what a C=16 cell of 12 requests sends): they end one by one, so fewer than 12
    # are in flight on average, far from 16
    wave = records_frame([record(i, 0.0, [0.5, 1.0 + i / 11], [1, 1]) for i in range(12)])
    assert summarize(wave)["achieved_concurrency"] == pytest.approx((12 * 1.001 + 6) / 2.001)
    # each sent as the previous one ended: one in flight all along
    sequential = records_frame([record(i, i * 1.001, [0.5, 1.0], [1, 1]) for i in range(5)])
    assert summarize(sequential)["achieved_concurrency"] == pytest.approx(1.0)
    warm_only = records_frame([record(0, 0.0, [0.1, 0.2], [1, 1], phase="warmup")])
    assert summarize(warm_only)["achieved_concurrency"] is None


def test_latency_over_successful_measured_requests() -> None:
    latency = summarize()["latency_s"]
    assert latency["ttft"] == {
        "mean": pytest.approx(0.25),
        "p50": pytest.approx(0.25),
        "p90": pytest.approx(0.37),
        "p95": pytest.approx(0.385),
        "p99": pytest.approx(0.397),
        "n": 4,
    }
    # The 1-token request has no TPOT: three values, 0.02, 0.1, 0.125.
    assert latency["tpot"]["n"] == 3
    assert latency["tpot"]["mean"] == pytest.approx((0.1 + 0.02 + 0.125) / 3)
    assert latency["tpot"]["p50"] == pytest.approx(0.1)
    assert latency["tpot"]["p90"] == pytest.approx(0.12)
    assert latency["e2e"]["mean"] == pytest.approx((0.3 + 0.26 + 0.3 + 0.9) / 4)
    assert latency["e2e"]["n"] == 4  # neither the warm-up nor the failures


def test_chunk_gaps_pooled_and_itl_token_weighted() -> None:
    latency = summarize()["latency_s"]
    # Gaps: request 1: 0.1, 0.1; request 2: 0.06; request 3: none; request 4: 0.1, 0.4.
    assert latency["chunk_gap"]["n"] == 5
    assert latency["chunk_gap"]["mean"] == pytest.approx(0.76 / 5)
    assert latency["chunk_gap"]["p50"] == pytest.approx(0.1)
    # Per token: 0.1, 0.1 | 0.02 x3 (0.06 over a 3-token chunk) | 0.05 x2, 0.2 x2 (0.1 and 0.4 over 2 tokens).
    itl = latency["itl_per_token"]
    assert itl["n"] == 9
    assert itl["mean"] == pytest.approx(0.76 / 9)  # sum of gaps / tokens after each first chunk
    assert itl["p50"] == pytest.approx(0.05)
    assert itl["p90"] == pytest.approx(0.2)


def test_goodput() -> None:
    goodput = summarize()["goodput"]
    # Good: requests 1 and 2 (both halves met) and 3 (1 token: TPOT half met). Request 4 misses TTFT
    # (0.4 > 0.35); both failures miss.
    assert goodput == {"ttft_slo_s": 0.35, "tpot_slo_s": 0.11, "good": 3, "share": 0.5, "rate_rps": 2.0}
    tight = summarize(slo=SLO(ttft_p99_s=0.35, tpot_p99_s=0.05))["goodput"]
    assert tight["good"] == 2  # request 1's TPOT of 0.1 now misses


def test_speculation_block_and_tokens_per_chunk_check() -> None:
    spec = SpecDelta(
        drafts=4,
        draft_tokens=12,
        accepted_tokens=4,
        acceptance_rate=4 / 12,
        mean_acceptance_length=2.0,
        acceptance_rate_per_position={"0": 0.75, "1": 0.25, "2": 0.0},
        accepted_per_position={"0": 3, "1": 1, "2": 0},
    )
    summary = summarize(spec=spec, generation_tokens_delta=13, measured_window=(0.95, 2.6))
    block = summary["speculation"]
    tpot_mean = (0.1 + 0.02 + 0.125) / 3
    assert block["decode_steps"] == 13 - 4
    assert block["inferred_step_time_s"] == pytest.approx(tpot_mean * 13 / 9)
    assert block["tokens_basis"] == "server"
    assert {k: block[k] for k in spec.to_json()} == spec.to_json()
    check = summary["cross_checks"]["tokens_per_chunk_vs_acceptance_length"]
    # Server tokens per step 13 / (13 - 4) equals the client's 13 tokens over 9 chunks.
    assert check["client"] == pytest.approx(13 / 9) and check["server"] == pytest.approx(13 / 9)
    assert check["rel_diff"] == pytest.approx(0.0) and check["ok"] is True
    assert check["mean_acceptance_length"] == 2.0

    # Five accepted tokens would mean 8 steps, 1.625 tokens per step: the client's 1.444 is 11% low.
    more = summarize(spec=SpecDelta(4, 12, 5, 5 / 12, 2.25), generation_tokens_delta=13)
    check = more["cross_checks"]["tokens_per_chunk_vs_acceptance_length"]
    assert check["rel_diff"] == pytest.approx((13 / 9 - 13 / 8) / (13 / 8))
    assert abs(check["rel_diff"]) > TOKENS_PER_STEP_TOLERANCE and check["ok"] is False


def test_counts_read_from_a_real_engine_are_whole_numbers() -> None:
    """vLLM's counters parse as floats (Prometheus text): the speculation block takes them, as whole numbers,
    from a real draft-model deployment's before/after snapshots."""
    data = Path(__file__).parent / "data" / "metrics"
    before, after = (data / "draft-k3.before.txt").read_text(), (data / "draft-k3.after.txt").read_text()
    model = next(
        line.split('model_name="')[1].split('"')[0] for line in before.splitlines() if 'model_name="' in line
    )
    spec = spec_decode_delta(before, after, model)
    generated = counter_delta(before, after, "vllm:generation_tokens_total", model)
    assert isinstance(generated, float)  # what counter_delta gives: a float, from Prometheus text
    block = summarize(spec=spec, generation_tokens_delta=generated)["speculation"]
    for key in ("drafts", "draft_tokens", "accepted_tokens", "tokens", "decode_steps"):
        assert isinstance(block[key], int), (key, block[key])
    assert block["tokens"] == generated and block["decode_steps"] == generated - spec.accepted_tokens
    with pytest.raises(ValueError, match="int"):
        summarize(spec=spec, generation_tokens_delta=generated + 0.5)


def test_plain_cell_has_no_speculation() -> None:
    summary = summarize(generation_tokens_delta=13)
    assert summary["speculation"] is None
    check = summary["cross_checks"]["tokens_per_chunk_vs_acceptance_length"]
    assert check["server"] is None and check["ok"] is None and "not applicable" in check["note"]


def test_generation_tokens_check_and_window() -> None:
    clean = summarize(generation_tokens_delta=13, measured_window=(0.95, 2.6))
    check = clean["cross_checks"]["completion_tokens_vs_generation_tokens"]
    assert check == {
        "client": 13,
        "server": 13,
        "rel_diff": 0.0,
        "ok": True,
        "tolerance": GENERATION_TOKENS_TOLERANCE,
        "note": None,
    }
    assert clean["measured_window_s"] == [0.95, 2.6]

    off = summarize(generation_tokens_delta=20, measured_window=(0.95, 2.6))
    check = off["cross_checks"]["completion_tokens_vs_generation_tokens"]
    assert check["rel_diff"] == pytest.approx(-7 / 20) and check["ok"] is False

    # A window that starts before the warm-up ended holds warm-up tokens too: not judged, and said why.
    overlap = summarize(generation_tokens_delta=15, measured_window=(0.5, 2.6))
    check = overlap["cross_checks"]["completion_tokens_vs_generation_tokens"]
    assert check["ok"] is None and "1 warm-up request(s) overlap" in check["note"]
    late = summarize(generation_tokens_delta=13, measured_window=(1.05, 2.6))
    assert (
        "1 measured request(s) ran outside"
        in late["cross_checks"]["completion_tokens_vs_generation_tokens"]["note"]
    )


def test_gauges_summary_within_window() -> None:
    gauges = pl.DataFrame(
        {
            "t_s": [0.5, 1.0, 1.5, 2.0, 3.0],
            "kv_cache_usage": [0.9, 0.1, 0.3, 0.2, 0.95],
            "running": [9, 2, 4, 3, 9],
            "waiting": [5, 0, 1, 0, 7],
            "preemptions_total": [0, 1, 1, 3, 10],
        }
    )
    summary = summarize(gauges=gauges, measured_window=(0.95, 2.6), gauge_scrape_failures=2)
    assert summary["gauges"] == {
        "kv_cache_usage_max": 0.3,
        "kv_cache_usage_mean": pytest.approx(0.2),
        "running_max": 4,
        "waiting_max": 1,
        "preemptions": 2,
        "samples": 3,
        "scrape_failures": 2,
    }
    assert summarize()["gauges"]["samples"] == 0


def test_counter_reset_invalidates_the_cell() -> None:
    summary = summarize(server_problem="vllm:spec_decode_num_drafts_total went down")
    assert summary["status"] == "failed" and "went down" in summary["error"]
    assert summary["server_valid"] is False and summary["server_problem"].endswith("went down")
    assert summarize()["server_valid"] is True


def test_no_measured_requests() -> None:
    warm_only = records_frame([record(0, 0.0, [0.1, 0.2], [1, 1], phase="warmup")])
    summary = summarize(warm_only)
    assert summary["status"] == "failed" and summary["error"] == "no measured requests"
    assert summary["wall_s"] is None and summary["latency_s"]["ttft"]["n"] == 0


def test_mismatched_chunk_lists_are_refused() -> None:
    bad = record(1, 1.0, [0.1, 0.2, 0.3], [1, 1, 1])
    bad.chunk_tokens = [1, 2]
    with pytest.raises(ValueError, match=r"different lengths, index \[1\]"):
        summarize(records_frame([bad]))


def test_summary_has_the_design_structure_and_is_strict_json() -> None:
    before = (DATA / "draft-k3.before.txt").read_text()
    after = (DATA / "draft-k3.after.txt").read_text()
    spec = spec_decode_delta(before, after, "tiny-draft-k3")
    generated = int(counter_delta(before, after, "vllm:generation_tokens_total", "tiny-draft-k3"))
    summary = summarize(spec=spec, generation_tokens_delta=generated, measured_window=(0.95, 2.6))
    assert set(summary) == {
        "host",
        "status",
        "error",
        "requests",
        "wall_s",
        "achieved_concurrency",
        "measured_window_s",
        "output_throughput_tok_s",
        "request_throughput_rps",
        "completion_tokens",
        "prompt_tokens",
        "latency_s",
        "tokens_per_chunk_mean",
        "tokens_exact",
        "goodput",
        "speculation",
        "cross_checks",
        "gauges",
        "server_valid",
        "server_problem",
    }
    assert set(summary["latency_s"]) == {"ttft", "tpot", "e2e", "chunk_gap", "itl_per_token"}
    assert set(summary["speculation"]) >= {*SPEC_DELTA_KEYS, "decode_steps", "inferred_step_time_s"}
    assert summary["speculation"]["decode_steps"] == generated - spec.accepted_tokens
    json.dumps(summary, allow_nan=False)


def test_responses_delivered_in_one_burst_are_flagged() -> None:
    streamed = [record(i, i * 1.0, [0.01, 0.02, 0.03, 0.04], [1, 1, 1, 1]) for i in range(8)]
    burst = [record(8 + i, 8.0 + i, [0.3, 0.3, 0.3, 0.3, 0.3], [1, 1, 1, 1, 1]) for i in range(2)]
    short = [record(10, 10.0, [0.01, 0.01], [1, 1])]  # too few chunks to judge
    check = summarize(records_frame(streamed + burst + short))["cross_checks"]["streamed_token_by_token"]
    assert (check["bursts"], check["responses"], check["share"], check["ok"]) == (2, 10, 0.2, False)
    fine = summarize(records_frame(streamed))["cross_checks"]["streamed_token_by_token"]
    assert (fine["bursts"], fine["ok"]) == (0, True)
