"""Per-cell math: the request records and `/metrics` deltas of one cell become its summary.json.

Every figure follows the measurement contract (shared facts, metrics.md); the document's structure and
what each figure means is artifacts.documents.CellSummary. Only measured requests (`phase == "measured"`) count; latency figures cover the successful ones.
Percentiles are numpy's default ("linear" interpolation between closest ranks), the same as vLLM's
`bench serve`, so p99 of [1, 2, 3, 4] is 3.97.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from artifacts.documents import (
    BurstCheck,
    CellSummary,
    CrossChecks,
    Distribution,
    GaugeSummary,
    GenerationTokensCheck,
    Goodput,
    Latency,
    RequestCounts,
    Speculation,
    TokensPerChunkCheck,
)
from experiments.spec import SLO
from tasks.metrics.prometheus import SpecDelta

PERCENTILES = (50, 90, 95, 99)

# Client tokens per chunk vs the server's tokens per decode step (see `tokens_per_chunk_check`). On the
# embedded engine the two agreed within 4% (draft model and n-gram, C = 1 and 4); the residue is most
# likely tokens accepted past max_tokens in a request's last step. Legitimate causes of a larger gap are few
# and are themselves measurement problems: the server merging several steps into one chunk (a client that
# reads too slowly, or a proxy), or token counts per chunk that are wrong. Beyond 10% chunk gaps stop
# being step times, so the check flags it.
TOKENS_PER_STEP_TOLERANCE = 0.10
# Client completion tokens vs d(vllm:generation_tokens_total): the same tokens counted twice, so they
# agree exactly on a clean window (they did on the embedded engine). 2% leaves room for a rare cut stream,
# whose tokens the server counted but whose usage block the client never got.
GENERATION_TOKENS_TOLERANCE = 0.02


def distribution(values: np.ndarray | list[float]) -> dict[str, float | int | None]:
    """mean, p50, p90, p95, p99 (numpy, linear interpolation) and n; all None when there are no values."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}, "n": 0}
    points = np.percentile(array, PERCENTILES, method="linear")
    return {
        "mean": float(array.mean()),
        **{f"p{q}": float(v) for q, v in zip(PERCENTILES, points, strict=True)},
        "n": int(array.size),
    }


def chunk_gaps(ok: pl.DataFrame) -> np.ndarray:
    """Time between consecutive token-bearing chunks of each request, all requests' gaps pooled."""
    gaps = ok.select(gap=pl.col("chunk_offsets_s").list.diff().list.slice(1)).explode("gap").drop_nulls()
    return gaps["gap"].to_numpy()


def itl_per_token(ok: pl.DataFrame) -> np.ndarray:
    """Inter-token latency per token, token-weighted.

    The gap before chunk i (offset[i] - offset[i-1]) is divided by the number of tokens chunk i carries,
    k_i, and that per-token value is counted k_i times, once for each token that arrived in the chunk. So
    a 30 ms gap before a 3-token chunk adds three values of 10 ms, and the mean equals the sum of gaps
    divided by the tokens in every chunk but the first. The first chunk of each request has no gap (its
    time is TTFT) and adds nothing. Chunks whose token count is unknown or 0 add nothing either.
    """
    mismatched = ok.filter(pl.col("chunk_offsets_s").list.len() != pl.col("chunk_tokens").list.len())
    if mismatched.height:
        raise ValueError(
            "request records with chunk_offsets_s and chunk_tokens of different lengths, index "
            f"{mismatched['index'].to_list()[:10]}"
        )
    pairs = (
        ok.select(
            gap=pl.col("chunk_offsets_s").list.diff().list.slice(1),
            tokens=pl.col("chunk_tokens").list.slice(1),
        )
        .explode(["gap", "tokens"])
        .drop_nulls()
        .filter(pl.col("tokens") > 0)
    )
    tokens = pairs["tokens"].to_numpy().astype(np.int64)
    return np.repeat(pairs["gap"].to_numpy() / tokens, tokens)


def _rel_diff(client: float | None, server: float | None) -> float | None:
    """(client - server) / server: signed, so the direction of a disagreement shows."""
    if client is None or server is None or server == 0:
        return None
    return (client - server) / server


def _window_problem(requests: pl.DataFrame, window: tuple[float, float] | None) -> str | None:
    """Why the server's window would not hold exactly the measured requests' tokens (None: it does)."""
    if window is None:
        return "measured window not given: warm-up overlap not checked"
    start, end = window
    finished = pl.coalesce("ended_s", "last_token_s", "sent_s")
    warm_overlap = requests.filter(
        (pl.col("phase") == "warmup") & (pl.col("sent_s") < end) & (finished > start)
    ).height
    measured = requests.filter(pl.col("phase") == "measured")
    outside = measured.filter((pl.col("sent_s") < start) | (finished > end)).height
    problems = []
    if warm_overlap:
        problems.append(f"{warm_overlap} warm-up request(s) overlap the measured window")
    if outside:
        problems.append(f"{outside} measured request(s) ran outside the measured window")
    return "; ".join(problems) or None


def tokens_per_chunk_check(
    client_tokens_per_chunk: float | None, spec: SpecDelta | None, tokens: int | None
) -> TokensPerChunkCheck:
    """Client tokens per chunk vs the server's mean acceptance length over all decode steps.

    vLLM's mean acceptance length, 1 + accepted / drafts, averages over the steps that carried a draft.
    A streamed chunk is one decode step of one request whether or not it carried a draft (n-gram lookup
    often finds none, and each request's first token comes from prefill), so the comparable server figure
    is tokens per step over all steps: T / (T - accepted), with T the server's generated tokens in the
    window. It equals the mean acceptance length when every step drafted (measured: draft model 2.03 vs
    2.03; n-gram 1.43 vs a mean acceptance length of 1.99 and a client figure of 1.42). Both are reported.
    """
    out = TokensPerChunkCheck(
        client=client_tokens_per_chunk,
        server=None,
        rel_diff=None,
        ok=None,
        mean_acceptance_length=spec.mean_acceptance_length if spec else None,
        tolerance=TOKENS_PER_STEP_TOLERANCE,
        note=None,
    )
    if spec is None:
        out.note = "no speculation counters (plain deployment or no /metrics): not applicable"
        return out
    if not tokens or tokens <= spec.accepted_tokens:
        out.note = "no generated tokens beyond accepted ones in the window: tokens per step undefined"
        return out
    out.server = tokens / (tokens - spec.accepted_tokens)
    out.rel_diff = _rel_diff(client_tokens_per_chunk, out.server)
    if out.rel_diff is not None:
        out.ok = abs(out.rel_diff) <= TOKENS_PER_STEP_TOLERANCE
    return out


def _gauge_summary(
    gauges: pl.DataFrame | None, window: tuple[float, float] | None, failures: int | None
) -> GaugeSummary:
    frame = gauges if gauges is not None else pl.DataFrame(schema={"t_s": pl.Float64()})
    if window is not None and frame.height:
        frame = frame.filter(pl.col("t_s").is_between(window[0], window[1]))

    def stat(column: str, how: str) -> float | int | None:
        if column not in frame.columns:
            return None
        values = frame[column].drop_nulls()
        if values.is_empty():
            return None
        return values.max() if how == "max" else float(values.mean())  # type: ignore[return-value]

    preemptions = None
    if "preemptions_total" in frame.columns and frame["preemptions_total"].drop_nulls().len() >= 1:
        seen = frame.sort("t_s")["preemptions_total"].drop_nulls()
        preemptions = int(seen[-1] - seen[0])
    return GaugeSummary(
        kv_cache_usage_max=stat("kv_cache_usage", "max"),
        kv_cache_usage_mean=stat("kv_cache_usage", "mean"),
        running_max=stat("running", "max"),
        waiting_max=stat("waiting", "max"),
        preemptions=preemptions,
        samples=frame.height,
        scrape_failures=failures,
    )


def _wall_s(measured: pl.DataFrame) -> float | None:
    """From the first measured request sent to the last one ended (None without a positive span)."""
    start = measured["sent_s"].drop_nulls().to_numpy()
    end = measured.select(pl.coalesce("ended_s", "last_token_s")).to_series().drop_nulls().to_numpy()
    return float(end.max() - start.min()) if start.size and end.size and end.max() > start.min() else None


def achieved_concurrency(measured: pl.DataFrame) -> float | None:
    """The time-weighted mean number of measured requests in flight over the wall_s window (first send to
    last end): each request's time in flight, clipped to the window, summed, over the window's length.
    Failures count (they held a slot); a request without a send or an end time is left out."""
    wall = _wall_s(measured)
    if wall is None:
        return None
    start = float(measured["sent_s"].drop_nulls().to_numpy().min())  # wall_s's window
    end = start + wall
    spans = measured.select(
        pl.col("sent_s").alias("start"), pl.coalesce("ended_s", "last_token_s").alias("end")
    ).drop_nulls()
    in_flight = (pl.col("end").clip(upper_bound=end) - pl.col("start").clip(lower_bound=start)).clip(
        lower_bound=0.0
    )
    return float(spans.select(in_flight.sum()).item()) / wall


def _latency(ok: pl.DataFrame) -> Latency:
    """The successful requests' latency distributions (TPOT over those of at least 2 tokens)."""
    tpot_rows = ok.filter(pl.col("completion_tokens") >= 2)
    return Latency(
        ttft=Distribution(**distribution(ok["ttft_s"].drop_nulls().to_numpy())),
        tpot=Distribution(**distribution(tpot_rows["tpot_s"].drop_nulls().to_numpy())),
        e2e=Distribution(**distribution(ok["e2e_s"].drop_nulls().to_numpy())),
        chunk_gap=Distribution(**distribution(chunk_gaps(ok))),
        itl_per_token=Distribution(**distribution(itl_per_token(ok))),
    )


def _good_requests(ok: pl.DataFrame, slo: SLO) -> int:
    """Goodput's count: a request is good when it succeeded, TTFT <= the TTFT SLO and TPOT <= the TPOT SLO.
    A request of fewer than 2 tokens has no TPOT and meets that half (as in vLLM's bench). Failures miss."""
    return ok.filter(
        (pl.col("ttft_s") <= slo.ttft_p99_s)
        & ((pl.col("completion_tokens") < 2) | (pl.col("tpot_s") <= slo.tpot_p99_s)).fill_null(False)
    ).height


def cell_status(measured_requests: int, server_problem: str | None) -> tuple[str, str | None]:
    """A cell's status and error: failed without measured requests or with an invalid server side."""
    if measured_requests == 0:
        return "failed", "no measured requests"
    if server_problem:
        return "failed", f"server side invalid: {server_problem}"
    return "ok", None


def request_counts(total: int, ok: int, failed: int, errors: dict[str, int]) -> RequestCounts:
    """A cell's request counts (`errors`: failures by class) and its success rate."""
    return RequestCounts(
        total=total, ok=ok, failed=failed, success_rate=ok / total if total else None, errors=errors
    )


def speculation_block(
    spec: SpecDelta | None, tokens: int, tokens_basis: str, tpot_mean: float | None
) -> Speculation | None:
    """The speculation block over `tokens` generated tokens (None for a plain deployment)."""
    if spec is None:
        return None
    steps = tokens - spec.accepted_tokens
    return Speculation(
        **spec.to_json(),
        accepted_per_position=dict(spec.accepted_per_position),
        decode_steps=steps,
        inferred_step_time_s=tpot_mean * tokens / steps if tpot_mean is not None and steps > 0 else None,
        tokens=tokens,
        tokens_basis=tokens_basis,
    )


def _generation_tokens_check(
    requests: pl.DataFrame,
    measured_window: tuple[float, float] | None,
    client_tokens: int,
    generation_tokens_delta: int | None,
) -> GenerationTokensCheck:
    window_problem = _window_problem(requests, measured_window)
    check = GenerationTokensCheck(
        client=client_tokens,
        server=generation_tokens_delta,
        rel_diff=_rel_diff(client_tokens, generation_tokens_delta),
        ok=None,
        tolerance=GENERATION_TOKENS_TOLERANCE,
        note=window_problem,
    )
    # Judged unless the window is known to hold other tokens (warm-up overlap, requests outside it).
    rel = check.rel_diff
    if rel is not None and (measured_window is None or window_problem is None):
        check.ok = abs(rel) <= GENERATION_TOKENS_TOLERANCE
    return check


def summarize_cell(
    requests: pl.DataFrame,
    *,
    spec: SpecDelta | None,
    generation_tokens_delta: int | None,
    gauges: pl.DataFrame | None,
    slo: SLO,
    measured_window: tuple[float, float] | None,
    server_problem: str | None = None,
    gauge_scrape_failures: int | None = None,
) -> CellSummary:
    """The cell's summary.json (artifacts.documents.CellSummary) from its request records and server-side
    figures.

    `requests` is `tasks.load.records.REQUEST_SCHEMA`, warm-up rows included. `spec` is the speculation
    delta over the measured window (None for plain), `generation_tokens_delta` is
    d(vllm:generation_tokens_total) over the same window, `gauges` the sampler's frame, `measured_window`
    the (before, after) scrape times on the records' clock. `server_problem` (e.g. a CounterReset's
    message) marks the server side invalid, and the cell failed. `gauge_scrape_failures`: the sampler's
    failed scrapes (gauges.scrape_failures).
    """
    measured = requests.filter(pl.col("phase") == "measured")
    ok = measured.filter(pl.col("ok").fill_null(False))
    failed = measured.filter(~pl.col("ok").fill_null(False))
    total, n_ok = measured.height, ok.height
    wall = _wall_s(measured)

    completion_tokens = int(ok["completion_tokens"].fill_null(0).sum())
    prompt_tokens = int(ok["prompt_tokens"].fill_null(0).sum())
    chunks = int(ok["chunks"].sum())
    tokens_per_chunk = completion_tokens / chunks if chunks else None
    errors = failed.group_by(pl.col("error_class").fill_null("unknown")).len().sort("error_class").rows()
    latency = _latency(ok)
    good = _good_requests(ok, slo)

    # T for the speculation block: the server's generated tokens in the window when known (the same
    # window and requests as its accepted count), else the client's measured completion tokens.
    client_tokens_all = int(measured["completion_tokens"].fill_null(0).sum())
    tokens = generation_tokens_delta if generation_tokens_delta is not None else client_tokens_all
    tokens_basis = "server" if generation_tokens_delta is not None else "client"
    tpot_mean = latency.tpot.mean if latency.tpot else None

    status, error = cell_status(total, server_problem)

    def per_wall(count: int) -> float | None:
        return count / wall if wall else None

    return CellSummary(
        status=status,
        error=error,
        requests=request_counts(total, n_ok, failed.height, dict(errors)),
        wall_s=wall,
        achieved_concurrency=achieved_concurrency(measured),
        measured_window_s=list(measured_window) if measured_window else None,
        output_throughput_tok_s=per_wall(completion_tokens),
        request_throughput_rps=per_wall(n_ok),
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        latency_s=latency,
        tokens_per_chunk_mean=tokens_per_chunk,
        tokens_exact=bool(n_ok) and bool(ok["tokens_exact"].fill_null(False).all()),
        goodput=Goodput(
            ttft_slo_s=slo.ttft_p99_s,
            tpot_slo_s=slo.tpot_p99_s,
            good=good,
            share=good / total if total else None,
            rate_rps=per_wall(good),
        ),
        speculation=speculation_block(spec, tokens, tokens_basis, tpot_mean),
        cross_checks=CrossChecks(
            tokens_per_chunk_vs_acceptance_length=tokens_per_chunk_check(tokens_per_chunk, spec, tokens),
            completion_tokens_vs_generation_tokens=_generation_tokens_check(
                requests, measured_window, client_tokens_all, generation_tokens_delta
            ),
            streamed_token_by_token=burst_check(ok),
        ),
        gauges=_gauge_summary(gauges, measured_window, gauge_scrape_failures),
        server_valid=server_problem is None,
        server_problem=server_problem,
    )


BURST_SPREAD_S = 1e-3  # a response of >= 4 chunks that arrived within 1 ms was not streamed token by token
BURST_TOLERANCE = 0.10


def burst_check(ok: pl.DataFrame) -> BurstCheck:
    """Share of successful responses whose chunks all reached the client at once.

    Such a response was held back by the server, or read at once by a client that was not scheduled while
    its chunks queued (why the client stamps chunks with the kernel's receive time: with those, the embedded
    engine bursts in 0.2% of responses at C <= 4, docs/performance.md), so its TTFT equals its E2E and its
    TPOT reads 0: latency figures of the cell are then not token-level observations. Judged ok when at most
    10% of the responses burst.
    """
    multi = ok.filter(pl.col("chunks") >= 4)
    if multi.is_empty():
        return BurstCheck(bursts=0, responses=0, share=None, ok=None, tolerance=BURST_TOLERANCE)
    spread = multi.select(
        (pl.col("chunk_offsets_s").list.max() - pl.col("chunk_offsets_s").list.min()).alias("spread")
    )["spread"]
    bursts = int((spread < BURST_SPREAD_S).sum())
    share = bursts / multi.height
    return BurstCheck(
        bursts=bursts,
        responses=multi.height,
        share=share,
        ok=share <= BURST_TOLERANCE,
        tolerance=BURST_TOLERANCE,
    )
