"""Acceptance with its interval over prompts (issue 30): from the requests' own acceptance (vLLM's per-request
block) to analysis_acceptance and v_acceptance, on a planted campaign; and on the real engine."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from warehouse_fixtures import RawBuilder, make_spec

from analysis.stats import cluster_ratio_interval, has_interval

PROMPTS = 12


def _with_acceptance(frame: pl.DataFrame) -> pl.DataFrame:
    """Twelve prompts whose acceptance differs (prompt i accepts i % 4 + 1 drafts in 3 of 5 steps), as a
    greedy campaign gives them: every launch the same, prompts apart."""
    n = frame.height
    prompt = [i % PROMPTS for i in range(n)]
    steps = [20 + 3 * p for p in prompt]
    accepted = [(p % 4 + 1) * 3 * s // 5 // 2 for p, s in zip(prompt, steps, strict=True)]
    return frame.with_columns(
        pl.Series("prompt_id", [f"p{p:02d}" for p in prompt]),
        pl.Series("spec_steps", steps, dtype=pl.Int64),
        pl.Series("spec_draft_tokens", [3 * s for s in steps], dtype=pl.Int64),
        pl.Series("spec_accepted_tokens", accepted, dtype=pl.Int64),
        pl.Series("spec_acceptance_histogram", [None] * n, dtype=pl.List(pl.Int64)),
    )


def test_one_greedy_launch_gets_an_acceptance_interval_from_its_prompts(tmp_path: Path) -> None:
    from analysis.run import analyze_campaign
    from warehouse.db import reader
    from warehouse.ingest import ingest_raw

    builder = RawBuilder(tmp_path / "raw", spec=make_spec(repeats=1, requests=24, concurrencies=(1,)))
    builder.write_all(captures=False)
    slot = builder.slot("draft-k3", 0)
    for cell in slot.cells:  # a later attempt of each draft cell, whose requests carry their acceptance
        builder.write_cell(slot, cell, mutate_requests=_with_acceptance)
    db = tmp_path / "w.duckdb"
    assert ingest_raw(builder.raw_dir, db).ok
    analyze_campaign(builder.campaign_id, db, render=False)
    with reader(db) as con:
        rows = con.execute(
            "SELECT variant, mean_acceptance_length_prompts, mean_acceptance_length_low, "
            "mean_acceptance_length_high, acceptance_rate_low, acceptance_rate_high, acceptance_interval "
            "FROM v_acceptance WHERE campaign_id = ? ORDER BY variant",
            [builder.campaign_id],
        ).fetchall()
        requests = con.sql(
            "SELECT r.prompt_id, r.spec_steps, r.spec_accepted_tokens FROM v_cells c JOIN requests r "
            "USING (cell_key) WHERE c.variant = 'draft-k3' AND r.phase = 'measured' AND r.ok"
        ).pl()
    by_variant = {r[0]: r for r in rows}
    draft, ngram = by_variant["draft-k3"], by_variant["ngram-k3"]
    expected = 1 + requests["spec_accepted_tokens"].sum() / requests["spec_steps"].sum()
    assert draft[1] == pytest.approx(expected)
    assert draft[2] < draft[1] < draft[3], draft  # one launch, yet an interval: the prompts differ
    assert 0 < draft[4] < draft[5] < 1
    assert f"n={PROMPTS}, bootstrap over {PROMPTS} prompts" in draft[6]
    # the planted n-gram cells carry no per-request acceptance: the counters' figure, and no interval
    assert ngram[2] is None and ngram[3] is None and "counters only" in ngram[6]


@pytest.mark.engine
def test_the_engine_gives_each_request_its_acceptance_and_prompts_give_the_interval(engines) -> None:
    """On the real engine (the pool's draft model, k=3, greedy): twelve code prompts, each once. The requests'
    acceptance sums to the server's counters, and one launch gets a non-degenerate interval of MAL."""
    import uvloop

    from experiments.spec import Sampling
    from tasks.load.client import StreamingClient
    from tasks.metrics.prometheus import ascrape, spec_decode_delta
    from workloads.schema import load_corpus

    deployment = engines.get("draft-k3")
    prompts = [p for p in load_corpus(Path("workloads/capture.jsonl")).prompts if p.workload == "code"][
        :PROMPTS
    ]

    async def main() -> tuple[list, object, object]:
        before = await ascrape(deployment.metrics_url)
        async with StreamingClient(
            deployment.base_url, deployment.served_model_name, timeout_s=120
        ) as client:
            t0 = time.perf_counter()
            records = [
                await client.send(
                    p,
                    Sampling(temperature=0.0, max_tokens=32),
                    index=i,
                    phase="measured",
                    t0=t0,
                    queued_s=0.0,
                )
                for i, p in enumerate(prompts)
            ]
        return records, before, await ascrape(deployment.metrics_url)

    records, before, after = uvloop.run(main())
    assert all(r.ok and r.spec_steps for r in records), [r.error for r in records]
    counters = spec_decode_delta(before, after, deployment.served_model_name)
    assert sum(r.spec_accepted_tokens for r in records) == counters.accepted_tokens
    assert sum(r.spec_draft_tokens for r in records) == counters.draft_tokens
    accepted = [r.spec_accepted_tokens for r in records]
    interval = cluster_ratio_interval(
        accepted, [r.spec_steps for r in records], [r.prompt_id for r in records], offset=1.0
    )
    assert has_interval(interval) and interval.low < interval.estimate < interval.high, interval
    assert interval.n == PROMPTS and np.isfinite(interval.high)


def test_later_campaigns_pool_the_launch_spread_of_earlier_ones(tmp_path: Path) -> None:
    """Two earlier campaigns of two plain launches a cell (same launcher, host and model) lend their launch
    variance to a later one: its throughput interval says so, with the campaigns and dates; the first has none."""
    from analysis.data import load_campaign
    from analysis.history import launch_history
    from analysis.speedup import speedup_table
    from warehouse.db import reader
    from warehouse.ingest import ingest_raw

    db = tmp_path / "w.duckdb"
    ids = []
    for name in ("first", "second", "third"):
        builder = RawBuilder(tmp_path / "raw", spec=make_spec(name, repeats=2, concurrencies=(1,)))
        builder.write_all(captures=False)
        ids.append(builder.campaign_id)
        assert ingest_raw(builder.raw_dir, db).ok
    with reader(db) as con:
        first, third = load_campaign(con, ids[0]), load_campaign(con, ids[2])
        assert first.history is None  # nothing before it
        history = launch_history(con, third.campaign)
    assert history is not None and third.history == history
    assert history.campaigns == 2 and history.df == 2 and history.variance > 0
    rows = speedup_table(third).filter(pl.col("metric") == "throughput")
    assert rows.height and all("launch variance pooled from 2 campaigns (" in i for i in rows["interval"])
    assert rows["ci_low"].is_not_null().all()


def test_a_bounded_ratio_has_no_interval_past_its_bound() -> None:
    """An acceptance rate is at most 1 and a mean acceptance length at most 1 + k; the symmetric bootstrap-t
    reaches past them on few, spread prompts (seen on the context-length buckets: rate [0, 1.79])."""
    accepted = [30, 30, 30, 30, 30, 1, 0]
    drafted = [30, 30, 30, 30, 30, 60, 90]
    prompts = [f"p{i}" for i in range(len(accepted))]
    unbounded = cluster_ratio_interval(accepted, drafted, prompts)
    assert unbounded.high > 1.0  # what the ceiling is for
    rate = cluster_ratio_interval(accepted, drafted, prompts, ceiling=1.0)
    assert rate.high == 1.0 and rate.low == unbounded.low and rate.estimate == unbounded.estimate
    steps = [10, 10, 10, 10, 10, 20, 30]  # k = 3: at most 3 accepted per step
    assert cluster_ratio_interval(accepted, steps, prompts, offset=1.0).high > 4.0
    mal = cluster_ratio_interval(accepted, steps, prompts, offset=1.0, ceiling=3.0)
    assert mal.high == 4.0  # 1 + k
