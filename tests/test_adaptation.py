"""Adaptation confirmation (docs/adaptation.md): the randomised schedule and its swap-back, the paired ratios
and their intervals, the benefit rule's verdicts, the verdict's way into the warehouse and the report."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

from analysis.adaptation import (
    METRICS,
    adopt_strata,
    cells_frame,
    compare_heads,
    confirm,
    judge,
    new_head_success,
    write_adaptation_report,
)
from analysis.stats import ratio_interval
from artifacts import ids, layout
from artifacts.store import write_json_atomic
from experiments.adaptation import GAIN_METRICS, Rule
from experiments.spec import parse_spec
from specgauge.errors import InputError
from tasks import adapt
from tasks.adapt import Block, HeadRef, ScheduleResult
from warehouse.ingest import ingest_raw

REPO = Path(__file__).resolve().parents[1]
OLD_SHA, NEW_SHA = "a" * 64, "b" * 64


# --- the schedule ---------------------------------------------------------------------------------------------


def test_schedule_holds_every_block_once_per_repeat_in_a_seeded_order() -> None:
    strata = ["chat", "code", "shifted"]
    blocks = adapt.schedule(strata, 3, seed=7)
    assert [b.position for b in blocks] == list(range(18))
    for repeat in range(3):
        mine = [(b.head, b.stratum) for b in blocks if b.repeat == repeat]
        assert sorted(mine) == sorted((h, s) for h in ("old", "new") for s in strata)
    assert adapt.schedule(strata, 3, seed=7) == blocks  # recorded seed, same schedule
    orders = {tuple((b.head, b.stratum) for b in adapt.schedule(strata, 3, seed=s)) for s in range(20)}
    assert len(orders) > 15  # the seed draws the order: not one fixed pattern
    # across seeds, each head leads a repeat about as often (no head is always measured first)
    firsts = Counter(
        b.head for s in range(200) for b in adapt.schedule(strata, 3, seed=s) if b.position % 6 == 0
    )
    assert 0.4 < firsts["new"] / sum(firsts.values()) < 0.6


def test_schedule_refuses_bad_input() -> None:
    with pytest.raises(InputError, match="repeats"):
        adapt.schedule(["chat"], 0, seed=0)
    with pytest.raises(InputError, match="each stratum once"):
        adapt.schedule(["chat", "chat"], 2, seed=0)


def test_swaps_needed_counts_the_swap_back() -> None:
    b = [Block(0, 0, "new", "a"), Block(1, 0, "new", "b"), Block(2, 0, "old", "a"), Block(3, 0, "new", "b")]
    assert adapt.swaps_needed(b) == 4  # old->new, new->old, old->new, and back to old
    assert adapt.swaps_needed(b[2:3]) == 0


class PlantedServer:
    """A server's head state: swap() changes what serving() reports (`lie` makes it report the wrong head)."""

    def __init__(self, heads: dict[str, HeadRef], fail_on: int | None = None) -> None:
        self.by_path = {h.path: h.sha256 for h in heads.values()}
        self.sha = heads["old"].sha256
        self.calls: list[str | None] = []
        self.fail_on = fail_on
        self.lie = False

    def swap(self, head_dir: Path) -> dict[str, Any]:
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            self.calls.append(None)
            raise RuntimeError("the RPC timed out")
        old, self.sha = self.sha, self.by_path[head_dir]
        self.calls.append(self.sha)
        return {
            "at": "2026-12-02T10:00:00+00:00",
            "old_sha256": old,
            "new_sha256": self.sha,
            "head": str(head_dir),
        }

    def serving(self) -> str | None:
        return "c" * 64 if self.lie else self.sha


@pytest.fixture
def heads(tmp_path: Path) -> dict[str, HeadRef]:
    return {
        "old": HeadRef("old", tmp_path / "old", OLD_SHA),
        "new": HeadRef("new", tmp_path / "new", NEW_SHA),
    }


def test_run_schedule_swaps_only_when_the_head_changes_and_ends_on_the_old_head(
    heads: dict[str, HeadRef],
) -> None:
    blocks = adapt.schedule(["chat", "shifted"], 2, seed=3)
    server = PlantedServer(heads)
    seen: list[tuple[str, str | None]] = []

    def run_cells(block: Block) -> list[tuple[str, str]]:
        seen.append((block.head, server.serving()))
        return [(f"{block.head}.{block.repeat}.{block.stratum}", "ok")]

    result = adapt.run_schedule(blocks, heads, server, run_cells)
    # every block ran with its own head serving
    assert seen == [(b.head, heads[b.head].sha256) for b in blocks]
    assert len(server.calls) == adapt.swaps_needed(blocks)
    assert result.swapped_back and result.final_sha256 == OLD_SHA and server.sha == OLD_SHA
    assert result.error is None
    assert [r.swap is not None for r in result.blocks] == [
        b.head != (blocks[i - 1].head if i else "old") for i, b in enumerate(blocks)
    ]


def test_run_schedule_swaps_back_when_a_block_fails(heads: dict[str, HeadRef]) -> None:
    blocks = [Block(0, 0, "new", "chat"), Block(1, 0, "old", "chat")]
    server = PlantedServer(heads)

    def run_cells(block: Block) -> list[tuple[str, str]]:
        raise KeyboardInterrupt  # Ctrl-C in the middle of the new head's block

    result = ScheduleResult()
    with pytest.raises(KeyboardInterrupt):
        adapt.run_schedule(blocks, heads, server, run_cells, result=result)
    assert server.sha == OLD_SHA and result.swapped_back and result.final_sha256 == OLD_SHA
    assert result.error == "KeyboardInterrupt: "
    assert [s["new_sha256"] for s in result.swaps] == [NEW_SHA, OLD_SHA]


def test_run_schedule_refuses_a_server_that_serves_another_head(heads: dict[str, HeadRef]) -> None:
    server = PlantedServer(heads)
    ran: list[Block] = []

    def run_cells(block: Block) -> list[tuple[str, str]]:
        ran.append(block)
        server.lie = True  # the swap "worked" but the server now reports a third head
        return []

    with pytest.raises(adapt.AdaptationError, match="serves head cccc"):
        adapt.run_schedule([Block(0, 0, "old", "a"), Block(1, 0, "new", "a")], heads, server, run_cells)
    assert len(ran) == 1  # no cells measured under the wrong head


def test_a_failed_swap_back_is_recorded(heads: dict[str, HeadRef]) -> None:
    server = PlantedServer(heads, fail_on=1)  # the swap to new works, the swap back fails
    result = adapt.run_schedule([Block(0, 0, "new", "a")], heads, server, lambda b: [])
    assert not result.swapped_back
    assert "swap back to the old head failed: RuntimeError: the RPC timed out" in (result.error or "")


def test_the_after_step_runs_last_and_its_swap_is_undone(heads: dict[str, HeadRef]) -> None:
    server = PlantedServer(heads)
    served_during: list[str | None] = []

    def capture(tracked: adapt.Swapper) -> None:
        tracked.swap(heads["new"].path)
        served_during.append(tracked.serving())

    result = adapt.run_schedule([Block(0, 0, "old", "a")], heads, server, lambda b: [], after=capture)
    assert served_during == [NEW_SHA]
    assert result.swapped_back and server.sha == OLD_SHA


# --- the statistics -------------------------------------------------------------------------------------------


def planted_cells(
    gains: dict[str, list[float]], *, mal_old: float = 2.0, mal_gain: dict[str, list[float]] | None = None
) -> pl.DataFrame:
    """Cells of both heads: per stratum the new head's throughput (and MAL) ratio in each repeat."""
    rows = []
    for stratum, ratios in gains.items():
        for repeat, ratio in enumerate(ratios):
            mal_ratio = (mal_gain or {}).get(stratum, ratios)[repeat]
            for head, factor, mal in (("old", 1.0, mal_old), ("new", ratio, mal_old * mal_ratio)):
                rows.append(
                    {
                        "cell_id": ids.adapted_cell_id("eagle3-k3", head, repeat, stratum, "c1"),
                        "head": head,
                        "repeat": repeat,
                        "stratum": stratum,
                        "load_label": "c1",
                        "status": "ok",
                        "requests_ok": 8,
                        "requests_total": 8,
                        "mean_acceptance_length": mal,
                        "output_throughput_tok_s": 100.0 * factor * (1 + 0.01 * repeat),
                        "tpot_p50_s": 0.02 / factor,
                    }
                )
    return cells_frame(rows)


def test_ratios_are_paired_by_repeat_with_t_intervals() -> None:
    cells = planted_cells({"shifted": [1.20, 1.25, 1.22], "chat": [1.0, 0.99, 1.01]})
    rows = {(c["stratum"], c["metric"]): c for c in compare_heads(cells)}
    thr = rows[("shifted", "throughput")]
    expected = ratio_interval([1.20, 1.25, 1.22])
    assert thr["ratios"] == pytest.approx([1.20, 1.25, 1.22])
    assert (thr["estimate"], thr["ci_low"], thr["ci_high"]) == pytest.approx(
        (expected.estimate, expected.low, expected.high)
    )
    assert thr["n_repeats"] == 3 and thr["repeats"] == [0, 1, 2]
    # TPOT is oriented old / new: a faster new head gives a ratio above 1 too
    assert rows[("shifted", "tpot_p50")]["estimate"] == pytest.approx(expected.estimate)
    mal = rows[("shifted", "mean_acceptance_length")]
    assert mal["old_mean"] == pytest.approx(2.0) and mal["new_mean"] == pytest.approx(2.0 * 1.2233, rel=1e-3)


def test_a_failed_cell_drops_its_repeat_from_the_pairs() -> None:
    cells = planted_cells({"shifted": [1.2, 1.3, 1.25]})
    cells = cells.with_columns(
        pl.when((pl.col("head") == "new") & (pl.col("repeat") == 1))
        .then(pl.lit("failed"))
        .otherwise(pl.col("status"))
        .alias("status")
    )
    thr = next(c for c in compare_heads(cells) if c["metric"] == "throughput")
    assert thr["repeats"] == [0, 2] and thr["ratios"] == pytest.approx([1.2, 1.25])
    success = new_head_success(cells)
    assert success[("shifted", "c1")] == pytest.approx(16 / 24)


def test_rule_adopts_the_target_when_its_interval_clears_the_minimum_effect() -> None:
    cells = planted_cells({"shifted": [1.20, 1.25, 1.22], "chat": [1.0, 0.99, 1.01]})
    out = confirm(cells, target_stratum="shifted", gate_passed=True)
    verdicts = {v["stratum"]: v for v in out["verdicts"]}
    assert verdicts["shifted"]["adopt"] and verdicts["shifted"]["target"]
    assert verdicts["shifted"]["reason"].startswith("adopt: throughput ratio 1.22")
    assert not verdicts["chat"]["adopt"] and "not above 1.10" in verdicts["chat"]["reason"]
    assert out["adopt_strata"] == ["shifted"]
    assert out["summary"].startswith("adopt the adapted head for shifted")


def test_rule_refuses_when_another_stratum_is_harmed_beyond_the_limit() -> None:
    # +22% on the target, but chat loses 8% (> 5%): no stratum gets the head
    cells = planted_cells({"shifted": [1.20, 1.25, 1.22], "chat": [0.92, 0.91, 0.93]})
    verdicts = {
        v["stratum"]: v for v in confirm(cells, target_stratum="shifted", gate_passed=True)["verdicts"]
    }
    assert not verdicts["shifted"]["adopt"] and not verdicts["shifted"]["harm_ok"]
    assert "chat is worse with the new head (0.92 < 0.95)" in verdicts["shifted"]["reason"]
    # at exactly the edge (4% worse) the harm is within the limit
    edge = planted_cells({"shifted": [1.20, 1.25, 1.22], "chat": [0.96, 0.96, 0.96]})
    assert confirm(edge, target_stratum="shifted", gate_passed=True)["adopt_strata"] == ["shifted"]
    # a looser limit lets it through
    loose = confirm(cells, target_stratum="shifted", gate_passed=True, rule=Rule(max_harm=0.10))
    assert loose["adopt_strata"] == ["shifted"]


def test_rule_needs_the_interval_above_the_minimum_effect_not_the_estimate() -> None:
    # estimate 1.14 but the repeats spread so much that the interval reaches below 1.10
    cells = planted_cells({"shifted": [1.02, 1.30, 1.12]})
    v = confirm(cells, target_stratum="shifted", gate_passed=True)["verdicts"][0]
    assert v["estimate"] > 1.10 and v["ci_low"] < 1.10 and not v["adopt"]
    assert "not above 1.10" in v["reason"]
    # a smaller minimum effect is judged against its own threshold
    tight = planted_cells({"shifted": [1.07, 1.08, 1.075]})
    assert not confirm(tight, target_stratum="shifted", gate_passed=True)["verdicts"][0]["adopt"]
    assert confirm(tight, target_stratum="shifted", gate_passed=True, rule=Rule(min_effect=0.05))[
        "adopt_strata"
    ] == ["shifted"]


def test_rule_needs_two_repeats_a_passed_gate_and_successful_requests() -> None:
    one = planted_cells({"shifted": [1.4]})
    v = confirm(one, target_stratum="shifted", gate_passed=True)["verdicts"][0]
    assert not v["adopt"] and "no interval, so no decision" in v["reason"]
    good = planted_cells({"shifted": [1.20, 1.25, 1.22]})
    for gate, words in ((None, "no correctness verdict"), (False, "correctness gate after the swap failed")):
        v = confirm(good, target_stratum="shifted", gate_passed=gate)["verdicts"][0]
        assert not v["adopt"] and words in v["reason"]
    failing = good.with_columns(
        pl.when(pl.col("head") == "new").then(pl.lit(7)).otherwise(pl.col("requests_ok")).alias("requests_ok")
    )
    v = confirm(failing, target_stratum="shifted", gate_passed=True)["verdicts"][0]
    assert not v["adopt"] and "success rate 87.5% < 99%" in v["reason"]


def test_the_gain_metric_can_be_acceptance() -> None:
    # acceptance rises 30% while throughput does not move (a CPU where drafting costs as much as it saves)
    cells = planted_cells({"shifted": [1.0, 1.01, 0.99]}, mal_gain={"shifted": [1.3, 1.28, 1.32]})
    assert confirm(cells, target_stratum="shifted", gate_passed=True)["adopt_strata"] == []
    rule = Rule(gain_metric="mean_acceptance_length")
    assert confirm(cells, target_stratum="shifted", gate_passed=True, rule=rule)["adopt_strata"] == [
        "shifted"
    ]
    with pytest.raises(ValueError, match="gain_metric"):
        Rule(gain_metric="speed")


def test_every_gain_metric_the_rule_accepts_has_a_cell_column_to_judge() -> None:
    # the rule (experiments/adaptation.py) checks names; analysis.adaptation maps each to its cell column
    assert tuple(METRICS) == GAIN_METRICS


# --- acceptance over prompts (per-request acceptance) -------------------------------------------------------------

MAL = "mean_acceptance_length"


def greedy_cells(strata: tuple[str, ...] = ("shifted",), mal_ratio: float = 1.08) -> pl.DataFrame:
    """Greedy decoding: every repeat gives the same MAL, so the per-repeat MAL ratios are all equal."""
    return planted_cells(
        {s: [1.0, 1.01, 0.99] for s in strata}, mal_gain={s: [mal_ratio] * 3 for s in strata}
    )


def planted_requests(
    stratum: str = "shifted",
    *,
    effect: float = 1.08,
    spread: float = 0.03,
    prompts: int = 24,
    seed: int = 11,
    heads: tuple[str, ...] = ("old", "new"),
) -> list[dict[str, Any]]:
    """Per prompt the old head's MAL from 1.3 to 3.5 and the new head's that times `effect` x the prompt's
    own log-normal factor (sd `spread`); each head's counts identical in every repeat (greedy)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mal_old = rng.uniform(1.3, 3.5, prompts)
    mal_new = mal_old * effect * np.exp(rng.normal(0.0, spread, prompts))
    steps_old = rng.integers(20, 400, prompts)
    steps_new = np.round(steps_old * mal_old / mal_new).astype(int)  # the same tokens in fewer steps
    counts = {
        "old": (steps_old, np.round((mal_old - 1) * steps_old).astype(int)),
        "new": (steps_new, np.round((mal_new - 1) * steps_new).astype(int)),
    }
    return [
        {
            "cell_id": ids.adapted_cell_id("eagle3-k3", head, repeat, stratum, "c1"),
            "head": head,
            "repeat": repeat,
            "stratum": stratum,
            "load_label": "c1",
            "prompt_id": f"{stratum}-{i}",
            "spec_steps": int(counts[head][0][i]),
            "spec_accepted_tokens": int(counts[head][1][i]),
        }
        for head in heads
        for repeat in range(3)
        for i in range(prompts)
    ]


def mal_row(comparisons: list[dict[str, Any]], stratum: str = "shifted") -> dict[str, Any]:
    return next(c for c in comparisons if c["metric"] == MAL and c["stratum"] == stratum)


def test_greedy_acceptance_without_requests_has_no_interval() -> None:
    cells = greedy_cells()
    row = mal_row(compare_heads(cells))
    assert row["estimate"] == pytest.approx(1.08) and row["ci_low"] is None and row["ci_high"] is None
    assert row["interval"] == "n=3, degenerate (all repeats equal): no interval"
    rule = Rule(gain_metric=MAL, min_effect=0.02)
    v = confirm(cells, target_stratum="shifted", gate_passed=True, rule=rule)["verdicts"][0]
    assert not v["adopt"] and "no interval, so no decision" in v["reason"]
    # request rows without acceptance for both heads (older files: none at all) change nothing
    for requests in ([], planted_requests(heads=("old",))):
        assert mal_row(compare_heads(cells, requests)) == row


def test_greedy_acceptance_gets_an_interval_over_prompts_from_the_requests() -> None:
    cells = greedy_cells()
    requests = planted_requests()
    before = {c["metric"]: c for c in compare_heads(cells)}
    after = {c["metric"]: c for c in compare_heads(cells, requests)}
    mal = after[MAL]
    assert has_interval_row(mal) and mal["ci_low"] < 1.08 < mal["ci_high"]
    assert mal["ci_high"] - mal["ci_low"] < 0.06  # paired: the prompts' spread (MAL 1.3-3.5) cancels
    assert mal["interval"] == (
        "n=24, bootstrap over 24 prompts paired new/old, symmetric bootstrap-t (jackknife SE) 95%"
    )
    assert mal["estimate"] == pytest.approx(mal["new_mean"] / mal["old_mean"])
    # the repeats stay the cells' own (all equal under greedy decoding)
    assert mal["n_repeats"] == 3 and mal["repeats"] == [0, 1, 2]
    assert mal["ratios"] == pytest.approx([1.08] * 3)
    # throughput and TPOT keep the per-repeat t
    for metric in ("throughput", "tpot_p50"):
        assert after[metric] == before[metric]
    # a frame works as the rows do
    from analysis.adaptation import requests_frame

    assert mal_row(compare_heads(cells, requests_frame(requests))) == mal


def has_interval_row(row: dict[str, Any]) -> bool:
    return row["ci_low"] is not None and row["ci_high"] is not None and row["ci_high"] > row["ci_low"]


def test_the_rule_on_acceptance_over_prompts_adopts_only_when_the_interval_clears() -> None:
    cells, requests = greedy_cells(), planted_requests()
    low = Rule(gain_metric=MAL, min_effect=0.02)
    out = confirm(cells, target_stratum="shifted", gate_passed=True, rule=low, requests=requests)
    v = out["verdicts"][0]
    assert v["adopt"] and out["adopt_strata"] == ["shifted"], v["reason"]
    assert v["reason"].startswith("adopt: mean_acceptance_length ratio 1.07")
    assert v["n_repeats"] == 3
    assert "bootstrap over 24 prompts paired new/old" in out["summary"]
    # 8% planted: an interval around 1.08 straddles 1 + 8% -> no adoption
    edge = Rule(gain_metric=MAL, min_effect=0.08)
    v = confirm(cells, target_stratum="shifted", gate_passed=True, rule=edge, requests=requests)["verdicts"][
        0
    ]
    assert v["ci_low"] < 1.08 < v["ci_high"]
    assert not v["adopt"] and "not above 1.08" in v["reason"]
    # no effect: the interval holds 1, nothing adopted even at a minimum effect of 0
    flat = planted_requests(effect=1.0)
    none = confirm(
        greedy_cells(mal_ratio=1.0),
        target_stratum="shifted",
        gate_passed=True,
        rule=Rule(gain_metric=MAL, min_effect=0.0),
        requests=flat,
    )["verdicts"][0]
    assert none["ci_low"] < 1.0 < none["ci_high"] and not none["adopt"]


def test_identical_per_prompt_ratios_are_no_interval_and_no_decision() -> None:
    """Every prompt exactly 8% better (old MAL 1.6, new 1.728 on each, steps from 125 to 1000): the prompts
    do not differ in the gain, so there is nothing uncertain to bound and no decision."""
    requests = [
        {
            "cell_id": ids.adapted_cell_id("eagle3-k3", head, repeat, "shifted", "c1"),
            "head": head,
            "repeat": repeat,
            "stratum": "shifted",
            "load_label": "c1",
            "prompt_id": f"p{i}",
            "spec_steps": 125 * (i + 1),
            "spec_accepted_tokens": (75 if head == "old" else 91) * (i + 1),
        }
        for head in ("old", "new")
        for repeat in range(3)
        for i in range(8)
    ]
    rule = Rule(gain_metric=MAL, min_effect=0.02)
    out = confirm(greedy_cells(), target_stratum="shifted", gate_passed=True, rule=rule, requests=requests)
    mal = mal_row(out["comparisons"])
    assert mal["estimate"] == pytest.approx(1.08) and mal["ci_low"] is None
    assert mal["interval"] == "n=8, every one of the prompts has the same ratio: no interval"
    v = out["verdicts"][0]
    assert not v["adopt"] and "no interval, so no decision" in v["reason"]


def test_requests_of_a_failed_cell_do_not_count() -> None:
    cells = greedy_cells().with_columns(
        pl.when((pl.col("head") == "new") & (pl.col("repeat") == 1))
        .then(pl.lit("failed"))
        .otherwise(pl.col("status"))
        .alias("status")
    )
    requests = planted_requests()
    clean = mal_row(compare_heads(cells, requests))
    failed_cell = ids.adapted_cell_id("eagle3-k3", "new", 1, "shifted", "c1")
    spoiled = [
        {**r, "spec_accepted_tokens": 50 * r["spec_steps"]} if r["cell_id"] == failed_cell else r
        for r in requests
    ]
    assert mal_row(compare_heads(cells, spoiled))["estimate"] == pytest.approx(clean["estimate"])
    assert clean["estimate"] == pytest.approx(mal_row(compare_heads(greedy_cells(), requests))["estimate"])


def test_cell_rows_read_the_requests_acceptance(tmp_path: Path) -> None:
    from artifacts.documents import REQUEST_OPTIONAL_COLUMNS, REQUEST_SCHEMA
    from tasks.adaptation.verdict import cell_rows

    summary = {
        "speculation": {"mean_acceptance_length": 2.0},
        "requests": {"ok": 3, "total": 4},
        "output_throughput_tok_s": 10.0,
        "latency_s": {"tpot": {"p50": 0.1}},
    }
    meta = {"deployment": {"drafter": {"sha256": NEW_SHA}}}
    block = Block(0, 2, "new", "shifted")
    cells = {c: ids.adapted_cell_id("eagle3-k3", "new", 2, "shifted", c) for c in ("c1", "c4")}
    requests = [
        {"prompt_id": "p0", "phase": "measured", "ok": True, "spec_steps": 10, "spec_accepted_tokens": 7},
        {"prompt_id": "p1", "phase": "warmup", "ok": True, "spec_steps": 10, "spec_accepted_tokens": 7},
        {"prompt_id": "p2", "phase": "measured", "ok": False, "spec_steps": 10, "spec_accepted_tokens": 7},
        {
            "prompt_id": "p3",
            "phase": "measured",
            "ok": True,
            "spec_steps": None,
            "spec_accepted_tokens": None,
        },
        {"prompt_id": "p4", "phase": "measured", "ok": True, "spec_steps": 0, "spec_accepted_tokens": 0},
        {"prompt_id": "p5", "phase": "measured", "ok": True, "spec_steps": 4, "spec_accepted_tokens": 0},
    ]
    older = {k: v for k, v in REQUEST_SCHEMA.items() if k not in REQUEST_OPTIONAL_COLUMNS}
    for label, cell in cells.items():
        attempt = layout.cell_dir(tmp_path, cell, 1)
        attempt.mkdir(parents=True)
        write_json_atomic(attempt / layout.SUMMARY, summary)
        write_json_atomic(attempt / layout.META, meta)
        schema = REQUEST_SCHEMA if label == "c1" else older  # c4: a file from before the columns
        rows = [{k: r.get(k) for k in schema} for r in requests]
        pl.DataFrame(rows, schema=schema, orient="row").write_parquet(attempt / layout.REQUESTS)
    result = adapt.BlockResult(block, [(cells["c1"], "ok"), (cells["c4"], "ok")], None, NEW_SHA)
    rows, request_rows = cell_rows(tmp_path, [result])
    assert [r["cell_id"] for r in rows] == [cells["c1"], cells["c4"]]
    assert rows[0]["mean_acceptance_length"] == 2.0 and rows[0]["load_label"] == "c1"
    where = {"cell_id": cells["c1"], "head": "new", "repeat": 2, "stratum": "shifted", "load_label": "c1"}
    assert request_rows == [
        {**where, "prompt_id": "p0", "spec_steps": 10, "spec_accepted_tokens": 7},
        {**where, "prompt_id": "p5", "spec_steps": 4, "spec_accepted_tokens": 0},
    ]


def test_adopt_strata_needs_every_load() -> None:
    verdicts = [
        {"stratum": "a", "adopt": True},
        {"stratum": "a", "adopt": False},
        {"stratum": "b", "adopt": True},
    ]
    assert adopt_strata(verdicts) == ["b"]
    assert judge([], {}, target_stratum="a", gate_passed=True) == []


# --- heads and plain captures ---------------------------------------------------------------------------------


def test_resolve_head_hashes_a_directory_and_refuses_what_is_none(tmp_path: Path) -> None:
    head = adapt.resolve_head("models/tiny-eagle3", label="old", raw_dir=tmp_path)
    from specgauge.checkpoints import drafter_digest

    assert head.sha256 == drafter_digest(REPO / "models" / "tiny-eagle3") and head.drafter_id is None
    artifact = tmp_path / "drafters" / "d1" / "head"
    artifact.mkdir(parents=True)
    for f in (REPO / "models" / "tiny-eagle3").iterdir():
        if f.suffix in (".json", ".safetensors"):
            (artifact / f.name).write_bytes(f.read_bytes())
    by_id = adapt.resolve_head("d1", label="new", raw_dir=tmp_path)
    assert by_id.drafter_id == "d1" and by_id.sha256 == head.sha256
    with pytest.raises(InputError, match="neither a head directory"):
        adapt.resolve_head("no-such-head", label="new", raw_dir=tmp_path)


def _plain_capture(
    raw: Path, name: str, deployment: str, model: str = "/m/tiny-target", cap: int = 24
) -> None:
    d = layout.capture_dir(raw, name)
    d.mkdir(parents=True)
    meta = {
        "capture_id": name,
        "deployment_id": deployment,
        "variant": {"name": "plain", "method": "none"},
        "max_tokens": cap,
        "deployment": {"command": ["python", "-m", "vllm", "--model", model, "--port", "1"]},
    }
    write_json_atomic(d / layout.META, meta)
    (d / layout.OUTPUTS).write_bytes(b"")


def test_plain_captures_of_an_earlier_campaign(tmp_path: Path) -> None:
    camp = tmp_path / "demo-1"
    _plain_capture(camp, "plain.r0", "demo-1.plain.r0.l1")
    _plain_capture(camp, "plain.r0.again", "demo-1.plain.r0.l1")
    _plain_capture(camp, "plain.ctl1", "demo-1.plain.ctl1.l1")
    found = adapt.plain_captures_of(camp, target_model="/m/tiny-target", max_tokens=24)
    assert found.base.name == "plain.r0" and found.campaign_id == "demo-1"
    assert sorted(b.name for _, b in found.controls) == ["plain.ctl1", "plain.r0.again"]
    with pytest.raises(InputError, match="served"):
        adapt.plain_captures_of(camp, target_model="/m/other", max_tokens=24)
    with pytest.raises(InputError, match="capped"):
        adapt.plain_captures_of(camp, target_model="/m/tiny-target", max_tokens=48)
    lone = tmp_path / "lone"
    _plain_capture(lone, "plain.r0", "lone.plain.r0.l1")
    _plain_capture(lone, "plain.r0.again", "lone.plain.r0.l1")
    with pytest.raises(InputError, match="cross-deployment"):
        adapt.plain_captures_of(lone, target_model="/m/tiny-target", max_tokens=None)


def test_cli_refuses_bad_input_before_launching(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.app import app

    spec = tmp_path / "adapt.yaml"
    spec.write_text(E2E_SPEC)
    runner = CliRunner()
    base = ["drafters", "confirm", "--spec", str(spec)]
    cases = [
        (["--new", str(tmp_path / "nothing"), "--target", "code"], "neither a head directory"),
        (["--new", "models/tiny-eagle3", "--target", "code"], "is the old head"),
        (["--new", "models/tiny-draft", "--target", "code"], "new head"),  # not an EAGLE-3 head: the contract
        (["--new", "models/tiny-eagle3", "--old", "models/tiny-draft", "--target", "chat"], "old head"),
    ]
    for args, words in cases:
        result = runner.invoke(app, [*base, *args])
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output, (args, result.output)


# --- into the warehouse and the report ------------------------------------------------------------------------


def write_planted_adaptation(raw: Path, *, failed: bool = False) -> tuple[str, str]:
    spec = parse_spec(
        {
            "name": "adapt-test",
            "target": {"model": "models/tiny-target"},
            "variants": [
                {"name": "plain", "method": "none"},
                {"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": "models/tiny-eagle3"},
            ],
            "workloads": [{"file": "workloads/smoke.jsonl"}],
            "load": {"concurrencies": [1]},
            "launcher": {"kind": "local"},
        }
    )
    campaign_id = ids.campaign_id("adapt-test-adapt", "0123456789abcdef")
    directory = layout.campaign_dir(raw, campaign_id)
    blocks = adapt.schedule(["chat", "code"], 3, seed=1)
    adapt.record_adaptation_campaign(
        directory,
        campaign_id,
        spec,
        name="adapt-test-adapt",
        spec_sha256="0123456789abcdef",
        label=None,
        slot=f"{campaign_id}.eagle3-k3.r0",
        variant="eagle3-k3",
        blocks=blocks,
        cells=[],
        captures=[],
    )
    cells = planted_cells({"code": [1.20, 1.25, 1.22], "chat": [0.97, 0.98, 0.99]})
    if failed:  # the first swap failed: no cell, no verdict
        cells = cells.clear()
    out = confirm(cells, target_stratum="code", gate_passed=True)
    adaptation_id = ids.adaptation_id("eagle3-k3", "code", "fedcba9876543210")
    adapt.write_adaptation(
        directory,
        {
            "adaptation_id": adaptation_id,
            "campaign_id": campaign_id,
            "deployment_id": f"{campaign_id}.eagle3-k3.r0.l1",
            "variant": "eagle3-k3",
            "target_stratum": "code",
            "strata": ["chat", "code"],
            "loads": ["c1"],
            "repeats": 3,
            "seed": 1,
            "min_effect": 0.1,
            "max_harm": 0.05,
            "confidence": 0.95,
            "gain_metric": "throughput",
            "old_head": {"label": "old", "path": "/m/old", "sha256": OLD_SHA},
            "new_head": {"label": "new", "path": "/m/new", "sha256": NEW_SHA, "drafter_id": "d1"},
            "schedule": [
                {**b.__dict__, "cells": [], "statuses": [], "swap": None, "serving_sha256": None}
                for b in blocks
            ],
            "swaps": [
                {
                    "at": "2026-12-02T10:00:00+00:00",
                    "old_sha256": OLD_SHA,
                    "new_sha256": NEW_SHA,
                    "head": "/m/new",
                }
            ],
            "swapped_back": True,
            "final_sha256": OLD_SHA,
            "gate": {
                "verdict_id": "eagle3-k3.01234567",
                "passed": True,
                "outcome": "consistent",
                "claim": "ok",
            },
            **out,
            "status": "failed" if failed else "ok",
            "error": "SwapFailed: the RPC timed out" if failed else None,
        },
    )
    return campaign_id, adaptation_id


def test_the_verdict_reaches_the_warehouse_and_the_report(tmp_path: Path) -> None:
    raw, db = tmp_path / "raw", tmp_path / "w.duckdb"
    campaign_id, adaptation_id = write_planted_adaptation(raw)
    report = ingest_raw(raw, db)
    assert report.counts()["adaptations"] == {"inserted": 1}, report.as_dict()
    assert not [q for q in report.as_dict()["quarantined"] if "adaptations" in q], report.as_dict()
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT stratum, target, adopt, round(gain, 4), round(mal_ratio, 4), adopt_strata, swapped_back "
        "FROM v_adaptation ORDER BY stratum"
    ).fetchall()
    gain = ratio_interval([1.20, 1.25, 1.22]).estimate
    assert rows == [
        (
            "chat",
            False,
            False,
            round(ratio_interval([0.97, 0.98, 0.99]).estimate, 4),
            round(ratio_interval([0.97, 0.98, 0.99]).estimate, 4),
            '["code"]',
            True,
        ),
        ("code", True, True, round(gain, 4), round(gain, 4), '["code"]', True),
    ]
    assert con.execute("SELECT count(*) FROM adaptation_comparisons").fetchone() == (6,)
    con.close()
    assert ingest_raw(raw, db).counts()["adaptations"]["inserted"] == 0  # immutable: ingested once
    page = write_adaptation_report(campaign_id, db=db, reports_dir=tmp_path / "reports")
    text = page.read_text()
    assert "Strata that should get the adapted head: code." in text
    assert "Keep the old head for chat." in text
    assert adaptation_id in text and (page.parent / "adaptation.png").stat().st_size > 1000
    assert not math.isnan(gain)


def test_a_failed_confirmation_is_in_the_warehouse_and_the_report_with_its_error(tmp_path: Path) -> None:
    raw, db = tmp_path / "raw", tmp_path / "w.duckdb"
    campaign_id, _ = write_planted_adaptation(raw, failed=True)
    assert ingest_raw(raw, db).counts()["adaptations"] == {"inserted": 1}
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT stratum, adopt, status, error FROM v_adaptation").fetchall() == [
        (None, None, "failed", "SwapFailed: the RPC timed out")
    ]
    con.close()
    text = write_adaptation_report(campaign_id, db=db, reports_dir=tmp_path / "reports").read_text()
    assert (
        "No stratum should get the adapted head: keep the old one. The confirmation FAILED: SwapFailed"
        in text
    )


def test_a_verdict_that_adopts_without_the_gate_is_quarantined(tmp_path: Path) -> None:
    raw, db = tmp_path / "raw", tmp_path / "w.duckdb"
    campaign_id, adaptation_id = write_planted_adaptation(raw)
    path = layout.adaptation_file(layout.campaign_dir(raw, campaign_id), adaptation_id)
    import json

    data = json.loads(path.read_text())
    data["gate"]["passed"] = False  # a writer that ignored the gate: the warehouse refuses the document
    for v in data["verdicts"]:
        v["gate_passed"] = False
    path.chmod(0o644)
    path.write_text(json.dumps(data))
    report = ingest_raw(raw, db)
    quarantined = [q for q in report.as_dict().get("quarantined", []) if "adaptations" in str(q)]
    assert quarantined and "adopt" in str(quarantined[0])


# --- end to end on the embedded engine (one engine start; the gate reuses the session campaign's plain captures) ---

E2E_SPEC = """
name: adapt-e2e
target: {model: models/tiny-target, served_model_name: tiny, max_model_len: 2048, seed: 0}
variants:
  - {name: plain, method: none}
  - {name: eagle3-k3, method: eagle3, k: 3, eagle_head: models/tiny-eagle3, hot_swap: true}
workloads:
  - {file: workloads/smoke.jsonl, strata: [chat, code]}
load: {concurrencies: [1], requests: 2, warmup: 0, allow_short_cells: true, request_timeout_s: 120}
sampling: {temperature: 0.0, seed: 0}  # as the session campaign's captures (the gate compares sampling)
capture: {corpus: workloads/capture.jsonl, max_tokens: 24}
launcher: {kind: local, kv_cache_gib: 1, ready_timeout_s: 600}
"""


# About 2.5 min on this 2-core machine (fresh-clone CI run, 2026-12-02 15:30-15:33 UTC): one engine start, 8 cells
# (12 s), 36 captured prompts; junit charges it the session campaign's setup too when it runs first.
@pytest.mark.engine
@pytest.mark.timeout(1200)
def test_confirmation_flow_on_the_embedded_engine(demo_campaign: dict, tmp_path: Path) -> None:
    """A head whose drafts land on the wrong tokens (lm_head rows permuted) swapped into a running server:
    every block measured with the head it should have, the old head serving again at the end, the gate
    taken with the new head, acceptance down with an interval below 1, and the rule keeps the old head."""
    import json

    from hot_swap_heads import derive_head

    from flows.adapt import AdaptationRequest, confirm_adaptation
    from specgauge.settings import get_settings
    from warehouse.db import reader

    settings = get_settings()
    new = derive_head(settings.engine_python, tmp_path / "permuted", "permute_lm_head")
    spec = tmp_path / "adapt.yaml"
    spec.write_text(E2E_SPEC)

    def confirm() -> dict:
        return confirm_adaptation(
            AdaptationRequest(
                spec_path=str(spec),
                new_head=str(new),
                target_stratum="code",
                repeats=2,
                plain_from=demo_campaign["campaign_id"],
            )
        )

    doc = confirm()
    assert doc["status"] == "ok", doc["error"]
    old_sha, new_sha = doc["old_head"]["sha256"], doc["new_head"]["sha256"]
    blocks = [Block(b["position"], b["repeat"], b["head"], b["stratum"]) for b in doc["schedule"]]
    assert len(blocks) == 8 and blocks == adapt.schedule(["chat", "code"], 2, seed=0)
    # the swaps the schedule needs, plus the gate's capture under the new head and the swap back after it
    assert len(doc["swaps"]) == adapt.swaps_needed([*blocks, Block(8, 1, "new", "capture")])
    assert doc["swapped_back"] and doc["final_sha256"] == old_sha
    # each block ran under its own head, and its cells carry that head's hash (not the launched one's)
    cells_dir = layout.cells_dir(Path(doc["path"]).parents[1])
    for block in doc["schedule"]:
        want = old_sha if block["head"] == "old" else new_sha
        assert block["serving_sha256"] == want and block["statuses"] == ["ok"]
        meta = json.loads((layout.cell_attempts(cells_dir, block["cells"][0])[-1] / layout.META).read_text())
        assert meta["deployment"]["drafter"]["sha256"] == want
    assert doc["notes"] == []
    gate = doc["gate"]
    assert gate["passed"], gate  # a bad head drafts badly but speculation stays lossless
    mal = {c["stratum"]: c for c in doc["comparisons"] if c["metric"] == "mean_acceptance_length"}
    for stratum in ("chat", "code"):
        assert mal[stratum]["n_repeats"] == 2 and mal[stratum]["new_mean"] < mal[stratum]["old_mean"]
        # from the requests' own acceptance, paired by prompt: the smoke strata have 4 prompts, fewer than
        # the 5 an interval needs, so none is drawn (and nothing is decided from a zero-width one)
        assert mal[stratum]["estimate"] < 1.0 and mal[stratum]["ci_high"] is None, mal[stratum]
        assert "prompts" in mal[stratum]["interval"], mal[stratum]
    assert doc["adopt_strata"] == [] and doc["summary"].startswith("keep the old head")
    with reader() as con:
        rows = con.execute(
            "SELECT stratum, adopt, gate_passed, mal_ratio < 1 FROM v_adaptation WHERE adaptation_id = ? "
            "ORDER BY stratum",
            [doc["adaptation_id"]],
        ).fetchall()
        hashes = con.execute(
            "SELECT count(DISTINCT drafter_sha256) FROM cells WHERE campaign_id = ?", [doc["campaign_id"]]
        ).fetchone()
    assert rows == [("chat", False, True, True), ("code", False, True, True)]
    assert hashes == (2,)
    page = Path(doc["report"]).read_text()
    assert "No stratum should get the adapted head: keep the old one." in page
    # the same confirmation again: its document is read back (nothing launched), ingested and reported again
    again = confirm()
    assert again["adaptation_id"] == doc["adaptation_id"] and again["path"] == doc["path"]
    assert again["started_utc"] == doc["started_utc"] and Path(again["report"]).exists()
