"""Prompt-length buckets (workloads/length_buckets.py, issue 33 item 3): built with the target's own tokenizer
(through the engine's Python), every prompt inside its bucket, bad specs named by field, the spec option,
per-bucket acceptance in the warehouse and the report (emulator), and one campaign on the embedded engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from campaign_support import campaign_rows, emulated_campaign, run_campaign

from specgauge.errors import InputError, SpecError
from specgauge.settings import REPO_ROOT
from workloads import length_buckets as lb
from workloads.schema import load_corpus

COMMITTED = REPO_ROOT / "workloads" / "length-buckets.jsonl"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[lb.BucketSpec, Path, list[dict]]:
    spec = lb.parse_bucket_spec({"edges": [128, 256, 512], "per_bucket": 3, "max_tokens": 32, "seed": 7})
    out = tmp_path_factory.mktemp("buckets") / "buckets.jsonl"
    return spec, out, lb.build(spec, out)


def test_buckets_are_built_with_every_prompt_inside_its_bucket(built) -> None:
    spec, out, rows = built
    corpus = load_corpus(out)  # the seed's format: the workload schema reads it
    assert corpus.strata == ["summarization-len-0128", "summarization-len-0256"]
    assert [len(corpus.stratum(s)) for s in corpus.strata] == [3, 3]
    for prompt in corpus.prompts:
        low, high = prompt.model_extra["length_bucket"]
        assert prompt.workload == lb.bucket_stratum("summarization", low)
        assert low <= prompt.model_extra["prompt_tokens"] < high and prompt.max_tokens == 32
    # counted again from the file by a fresh tokenizer process: no problem
    assert lb.check_file(out, spec.model, spec.max_model_len) == []
    # targets are spread inside each bucket, not piled at one edge
    tokens = [r["prompt_tokens"] for r in rows if r["length_bucket"][0] == 256]
    assert max(tokens) - min(tokens) > 100, tokens


def test_a_prompt_outside_its_bucket_is_named_by_file_line_and_field(built, tmp_path: Path) -> None:
    spec, _, rows = built
    moved = [dict(r) for r in rows]
    moved[0]["messages"] = rows[-1]["messages"]  # a 256-512 prompt under the 128 bucket's name
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in moved) + "\n")
    problems = lb.check_file(bad, spec.model, spec.max_model_len)
    assert [(p.line, p.field) for p in problems] == [(1, "messages")], problems
    assert "outside its bucket [128, 256)" in str(problems[0]) and str(bad) in str(problems[0])


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"edges": [512, 256]}, "length buckets: edges: must increase, got 256 after 512"),
        ({"edges": [128]}, "length buckets: edges: give at least two edges"),
        (
            {"edges": [128, 2040]},
            "length buckets: edges: the last edge 2040 plus max_tokens 64 exceeds max_model_len 2048",
        ),
        (
            {"edges": [128, 256], "per_bucket": 0},
            "length buckets: per_bucket: Input should be greater than 0",
        ),
        ({"edges": [128, 256], "stratum": "../x"}, "length buckets: stratum:"),
        ({"edges": [128, 256], "edge": 1}, "length buckets: edge: Extra inputs are not permitted"),
        ({"edges": ["a", 256]}, "length buckets: edges.0: Input should be a valid integer"),
    ],
)
def test_a_bad_bucket_spec_names_the_field(data: dict, named: str) -> None:
    with pytest.raises(InputError) as info:
        lb.parse_bucket_spec(data)
    assert named in str(info.value)


def test_a_first_bucket_too_short_for_any_code_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    spec = lb.parse_bucket_spec({"edges": [8, 24], "per_bucket": 1})  # a 16-token prompt: the request alone
    with pytest.raises(InputError, match=r"edges: bucket \[8, 24\) leaves .* raise the first edge"):
        lb.build(spec, tmp_path / "never.jsonl")
    assert not (tmp_path / "never.jsonl").exists()


def test_the_cli_names_the_bad_field_and_exits_2(tmp_path: Path) -> None:
    import os

    from cli_support import cli_run

    done = cli_run(
        os.environ, "workloads", "length-buckets", str(tmp_path / "x.jsonl"), "--edges", "512,256", timeout=60
    )
    assert (
        done.returncode == 2
        and done.stderr.strip() == "error: length buckets: edges: must increase, got 256 after 512"
    )


def test_the_committed_corpus_is_valid_with_the_tiny_target() -> None:
    assert lb.check_file(COMMITTED, "models/tiny-target", 2048) == []
    strata = load_corpus(COMMITTED).strata
    assert strata == [lb.bucket_stratum("summarization", e) for e in (128, 256, 512, 1024)]


def test_the_spec_option_picks_buckets_as_strata(tmp_path: Path) -> None:
    from experiments.plan import plan_campaign
    from experiments.spec import load_spec

    data = yaml.safe_load((REPO_ROOT / "experiments" / "demo.yaml").read_text())
    data["workloads"] = [{"file": "workloads/length-buckets.jsonl", "length_buckets": [128, 1024]}]
    path = tmp_path / "buckets.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(path)
    assert spec.workloads[0].strata == ("summarization-len-0128", "summarization-len-1024")
    assert {c.workload for _, c in plan_campaign(spec).cells()} == set(spec.workloads[0].strata)

    data["workloads"] = [{"file": "workloads/length-buckets.jsonl", "length_buckets": [128], "strata": ["x"]}]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(
        SpecError, match="workloads\\[0\\]: length_buckets: give the buckets or the strata, not both"
    ):
        load_spec(path)
    data["workloads"] = [{"file": "workloads/length-buckets.jsonl", "length_buckets": [100]}]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError, match="has no stratum summarization-len-0100"):
        plan_campaign(load_spec(path))


def test_per_bucket_acceptance_reaches_the_warehouse_and_the_report(
    prefect_harness: None, home: Path, emulator, tmp_path: Path
) -> None:
    """On the emulator (its acceptance is configured, not measured: this checks the path, not the figures): a
    plain + n-gram campaign over two buckets gives v_context_length a row per bucket with the counters' sums,
    and the report a section with the chart."""
    emulator.configure(k=3, acceptance=(0.8, 0.5, 0.3))
    data = emulated_campaign(
        "buckets-emulated",
        emulator.url,
        workloads=[{"file": "workloads/length-buckets.jsonl", "length_buckets": [128, 1024]}],
        load={
            "concurrencies": [1],
            "requests": 4,
            "warmup": 0,
            "allow_short_cells": True,
            "request_timeout_s": 30,
        },
    )
    result = run_campaign(tmp_path / "buckets.yaml", data)
    rows = campaign_rows(
        "SELECT variant, bucket_tokens, base_stratum, cells, draft_tokens > 0, accepted_tokens <= draft_tokens, "
        "acceptance_rate, mean_acceptance_length, mean_prompt_tokens, throughput_speedup IS NOT NULL "
        "FROM v_context_length WHERE campaign_id = ? ORDER BY bucket_tokens",
        result["campaign_id"],
    )
    counters = campaign_rows(
        "SELECT workload, sum(accepted_tokens) / sum(draft_tokens) FROM v_acceptance WHERE campaign_id = ? "
        "GROUP BY workload ORDER BY workload",
        result["campaign_id"],
    )
    assert [r[:6] for r in rows] == [
        ("ngram-k3", 128, "summarization", 1, True, True),
        ("ngram-k3", 1024, "summarization", 1, True, True),
    ]
    assert [r[6] for r in rows] == pytest.approx([rate for _, rate in counters])
    assert all(r[7] > 1 and r[9] for r in rows)
    assert rows[0][8] < rows[1][8]  # the emulator counts words, still longer for the longer bucket
    page = Path(result["analysis"]["report"]).read_text()
    assert "Acceptance against context length" in page and "context_length.html" in " ".join(
        p.name for p in Path(result["analysis"]["report"]).parent.iterdir()
    )


TWO_BUCKETS = """
name: context-length-engine
target: {model: models/tiny-target, served_model_name: tiny, max_model_len: 2048, seed: 0}
variants:
  - {name: plain, method: none}
  - {name: ngram-k3, method: ngram, k: 3, prompt_lookup_min: 1, prompt_lookup_max: 4}
workloads: [{file: workloads/length-buckets.jsonl, length_buckets: [128, 1024]}]
load: {concurrencies: [1], requests: 2, warmup: 0, allow_short_cells: true, request_timeout_s: 120}
sampling: {temperature: 0.0, seed: 0}
repeats: 1
capture: {enabled: false}
validity: {aa_control: false}
launcher: {kind: local, kv_cache_gib: 1, ready_timeout_s: 600}
"""


@pytest.mark.engine
@pytest.mark.timeout(1200)
def test_a_two_bucket_campaign_on_the_engine_has_acceptance_per_bucket(
    prefect_harness: None, home: Path, no_idle_engines, tmp_path: Path
) -> None:
    """Plain and n-gram k=3 on the tiny target, two requests per cell in the shortest and the longest bucket:
    the warehouse holds the engine's own counters per bucket, and the prompts the server counted lie in
    their buckets (the builder's count is the server's)."""
    result = run_campaign(tmp_path / "two-buckets.yaml", TWO_BUCKETS)
    rows = campaign_rows(
        "SELECT bucket_tokens, drafts, draft_tokens, accepted_tokens, acceptance_rate, mean_acceptance_length, "
        "mean_prompt_tokens, throughput_speedup FROM v_context_length WHERE campaign_id = ? "
        "ORDER BY bucket_tokens",
        result["campaign_id"],
    )
    cells = campaign_rows(
        "SELECT mean_acceptance_length FROM v_acceptance WHERE campaign_id = ? ORDER BY workload",
        result["campaign_id"],
    )
    served = campaign_rows(
        "SELECT r.prompt_id, r.prompt_tokens FROM requests r JOIN cells c USING (cell_key) "
        "WHERE c.campaign_id = ? AND r.ok",
        result["campaign_id"],
    )
    print("per bucket (edge, drafts, draft tokens, accepted, rate, MAL, prompt tokens, x plain):", rows)
    assert [r[0] for r in rows] == [128, 1024]
    for row, (cell_mal,) in zip(rows, cells, strict=True):
        assert row[1] > 0 and row[2] > 0 and 0 <= row[3] <= row[2] and row[7] is not None
        assert row[5] == pytest.approx(cell_mal)  # one cell a bucket: the view's sums are the cell's counters
    # the builder counted each prompt as the server did (chat template included), request by request
    built = {p.id: p.model_extra["prompt_tokens"] for p in load_corpus(COMMITTED).prompts}
    assert len(served) == 8 and all(built[prompt] == tokens for prompt, tokens in served), served


def test_the_context_length_table_keeps_only_buckets_and_pairs_each_with_its_speedup() -> None:
    import polars as pl

    from analysis.context_length import context_length_chart, context_length_table

    def acceptance(workload: str, mal: float) -> dict:
        return {
            "variant": "ngram-k3",
            "method": "ngram",
            "k": 3,
            "workload": workload,
            "load_label": "c1",
        } | {
            "mean_acceptance_length": mal,
            "mean_acceptance_length_low": mal - 0.1,
            "mean_acceptance_length_high": mal + 0.1,
            "acceptance_rate": (mal - 1) / 3,
            "acceptance_rate_low": None,
            "acceptance_rate_high": None,
            "acceptance_interval": "n=4",
            "prompts": 4,
        }

    frame = pl.DataFrame(
        [
            acceptance("summarization-len-1024", 1.3),
            acceptance("code", 2.2),
            acceptance("summarization-len-0128", 1.6),
        ]
    )
    speedup = pl.DataFrame(
        {
            "variant": ["ngram-k3"] * 3,
            "workload": ["summarization-len-0128", "summarization-len-0128", "summarization-len-1024"],
            "load_label": ["c1"] * 3,
            "metric": ["throughput", "tpot_p50", "throughput"],
            "estimate": [1.1, 9.0, 0.8],
            "ci_low": [None, None, 0.7],
            "ci_high": [None, None, 0.9],
            "interval": ["n=1, no interval", "x", "n=3, t"],
        }
    )
    table = context_length_table(frame, speedup)
    assert table.select(
        "bucket_tokens", "base_stratum", "mean_acceptance_length", "throughput_speedup"
    ).rows() == [
        (128, "summarization", 1.6, 1.1),
        (1024, "summarization", 1.3, 0.8),
    ]
    spec = context_length_chart(table).to_dict()
    assert spec["title"]["text"] == "Acceptance against context length"
    assert (
        context_length_chart(context_length_table(frame.filter(pl.col("workload") == "code"), speedup))
        is None
    )
