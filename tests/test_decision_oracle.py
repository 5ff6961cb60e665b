"""benchmarks/decision_oracle.py on planted data: an oracle campaign (plain, n-gram k=3 and the draft model k=3,
three launches each at C = 1, 2, 4, with planted speeds) and a decision planted beside it (the schedule drafts
with the draft model at k=3 at every load), read back through the warehouse (`v_decision`) as the benchmark
reads it. At C=2 the decision's config is the oracle's best; at C=1 the oracle puts it at 0.975 of its best
(n-gram), within 5%; at C=4 it runs below plain where n-gram gains: it disagrees. No engine, no timing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import PlantedBuilder, profile
from warehouse_fixtures import RawBuilder, make_spec

from artifacts import layout
from artifacts.documents import DecisionDocument
from artifacts.store import write_json_atomic
from experiments.spec import ExperimentSpec, TargetSpec, Variant
from specgauge.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import decision_oracle  # a script of benchmarks/, which is no package
from decision_oracle import AGREES, DISAGREES, Config, Decision, DecisionAt, OracleFigure

# TPOT speedup over plain per load (closed loop: the throughput speedup follows it, a little below). The
# margins are several times the planted noise of a 3-launch geometric mean of 64-request cells (about 0.6%).
PLANTED = {
    "c1": {"ngram-k3": 1.40, "draft-k3": 1.365},  # the draft model at 0.975 of the best: within 5%
    "c2": {"ngram-k3": 1.10, "draft-k3": 1.50},  # the draft model is the best
    "c4": {"ngram-k3": 1.25, "draft-k3": 0.80},  # the draft model loses, n-gram gains: disagrees
}
DECISION_ID = "chat.draft_model.0a1b2c3d"
DRAFT = {"name": "draft-k3", "method": "draft_model", "k": 3, "draft_model": "models/tiny-draft"}


def plant(variant: str, repeat: int, workload: str, load: str):
    if variant == "plain":
        return profile(0.020, None)
    return profile(0.020 / PLANTED[load][variant], 0.5, tokens_per_chunk=2.5)


def decision_load(concurrency: int, batch: tuple[int, int], span: tuple[float, float, float], outcome: str):
    estimate, low, high = span
    return {
        "concurrency": concurrency,
        "batch_from": batch[0],
        "batch_to": batch[1],
        "k": 3,
        "claim": "beats plain",
        "over_plain": estimate,
        "over_plain_low": low,
        "over_plain_high": high,
        "over_plain_interval": "n=2, t on log-ratios 95%",
        "n_repeats": 2,
        "outcome": outcome,
        "reason": "planted",
    }


def plant_decision(verify: RawBuilder, sweep_id: str, spec: ExperimentSpec) -> dict[str, Any]:
    """A decision of the verification campaign `verify` on the sweep `sweep_id` (here the oracle campaign
    itself: the same target), choosing the schedule: the draft model at k=3 at every load."""
    doc = {
        "decision_id": DECISION_ID,
        "campaign_id": verify.campaign_id,
        "source_campaign_id": sweep_id,
        "workload": "chat",
        "family": "draft_model models/tiny-draft",
        "method": "draft_model",
        "schedule": [[1, 256, 3]],
        "speculative_config": {
            "method": "draft_model",
            "model": "models/tiny-draft",
            "num_speculative_tokens": 3,
        },
        "variant": {**DRAFT, "name": "recommended"},
        "target": spec.target.model_dump(mode="json"),
        "verification_spec": "",
        "fixed_k": 3,
        "tolerance": 0.05,
        "confidence": 0.95,
        "loads": [
            # C=1: the interval leaves out the oracle's best (n-gram, about 1.4x): only the 5% rule agrees
            decision_load(1, (1, 1), (1.20, 1.10, 1.30), "faster, below the minimum effect"),
            decision_load(2, (2, 2), (1.45, 1.30, 1.60), "confirmed"),
            decision_load(4, (3, 256), (0.85, 0.80, 0.90), "refuted"),
        ],
        "outcome": "refuted",
        "summary": "planted",
        "caveats": [],
        "choice": "schedule",
        "choice_reason": "planted",
        "created_utc": "2026-12-05T10:00:00Z",
    }
    DecisionDocument.model_validate(doc)  # what analysis.verification would write
    path = verify.campaign_dir / layout.DECISIONS / f"{DECISION_ID}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)
    return doc


def test_each_load_of_a_planted_decision_is_judged_against_the_oracle(home: Path, tmp_path: Path) -> None:
    from warehouse.db import reader

    spec = make_spec("decision", repeats=3, concurrencies=(1, 2, 4), requests=64, warmup=2)
    oracle = PlantedBuilder(tmp_path / "raw", spec=spec, plant=plant)
    verify = RawBuilder(tmp_path / "raw", spec=make_spec("decision-verify"))
    verify.write_campaign()
    plant_decision(verify, oracle.campaign_id, spec)
    db = oracle.build(tmp_path / "warehouse.duckdb", gates=False)  # ingests both campaigns and the decision

    with reader(db) as con:
        found = decision_oracle.find_decision(con, None, spec.target)
        decision = decision_oracle.read_decision(con, *found)
        choices = decision_oracle.decision_choices(decision)
        rows = decision_oracle.oracle_table(con, oracle.campaign_id, choices, decision.workload)
        assert decision_oracle.find_decision(con, DECISION_ID, {}) == found  # named: whatever the target
        with pytest.raises(InputError, match="no decision in the warehouse for the target"):
            decision_oracle.find_decision(con, None, TargetSpec(model="models/another-target"))

    assert found == (verify.campaign_id, DECISION_ID)
    assert (decision.choice, decision.method, decision.drafter) == (
        "schedule",
        "draft_model",
        "models/tiny-draft",
    )
    assert [(c.concurrency, c.config.method, c.config.k) for c in choices] == [
        (1, "draft_model", 3),
        (2, "draft_model", 3),
        (4, "draft_model", 3),
    ]
    assert [c.over_plain for c in choices] == pytest.approx([1.20, 1.45, 0.85])  # the verification's figures
    by_load = {r.concurrency: r for r in rows}
    assert sorted(by_load) == [1, 2, 4]
    for row in rows:  # every config at every load, three launches each, each with its interval
        assert {f.config.name for f in row.figures} == {"ngram-k3", "draft-k3"}
        assert all(f.n == 3 and f.low is not None and f.low < f.estimate < f.high for f in row.figures)

    one, two, four = by_load[1], by_load[2], by_load[4]
    assert two.best.config.name == "draft-k3" and two.verdict == AGREES
    assert two.reason == "the decision's config is the oracle's best" and two.ratio == pytest.approx(1.0)
    assert one.best.config.name == "ngram-k3" and one.oracle_for_decision is not None
    assert one.oracle_for_decision.config.name == "draft-k3" and 0.95 <= (one.ratio or 0) < 1.0
    assert one.verdict == AGREES and one.reason.startswith("within 5% of the oracle's best")
    assert four.best.config.name == "ngram-k3" and four.verdict == DISAGREES and not four.agrees
    assert four.ratio is not None and four.ratio < 0.95
    assert four.oracle_for_decision is not None and four.oracle_for_decision.estimate < 1.0

    table = decision_oracle.markdown(rows)
    verdicts = [line for line in table[:5] if line.startswith("| ") and "**" in line]
    assert [line.count("**agrees**") + 2 * line.count("**disagrees**") for line in verdicts] == [1, 1, 2]
    assert table[6] == "| C | draft-k3 | ngram-k3 |"  # every config the oracle measured, by method and depth


def figure(name: str, method: str, k: int, estimate: float, low: float, high: float) -> OracleFigure:
    return OracleFigure(Config(name, method, k), estimate, low, high, 3, "n=3, t on log-ratios 95%")


NGRAM = figure("ngram-k3", "ngram", 3, 1.30, 1.20, 1.40)


def test_the_oracles_best_inside_the_decisions_interval_agrees() -> None:
    """More than 5% below the oracle's best by the oracle's own figure, but the decision's interval holds the
    best: the decision could not have told them apart, and agrees."""
    draft = figure("draft-k3", "draft_model", 3, 1.10, 1.02, 1.18)
    mine = DecisionAt(1, Config("schedule", "draft_model", 3), 1.15, 1.05, 1.35, "planted")
    row = decision_oracle.judge_load(1, [NGRAM, draft], mine)
    assert row.best is NGRAM and row.ratio == pytest.approx(1.10 / 1.30)
    assert row.verdict == AGREES and "lies inside the decision's interval" in row.reason


def test_plain_is_the_oracles_best_where_no_config_gains() -> None:
    """Below 1 everywhere: the oracle's best is plain; an off range (k = 0) agrees, drafting there does not."""
    slow = [
        figure("ngram-k3", "ngram", 3, 0.92, 0.88, 0.96),
        figure("draft-k3", "draft_model", 3, 0.85, 0.8, 0.9),
    ]
    off = DecisionAt(16, Config("schedule", "draft_model", 0), 0.86, 0.80, 0.91, "planted")
    row = decision_oracle.judge_load(16, slow, off)
    assert row.best.config.is_plain and row.verdict == AGREES and row.ratio == 1.0
    drafting = DecisionAt(16, Config("schedule", "draft_model", 3), 0.85, 0.80, 0.90, "planted")
    row = decision_oracle.judge_load(16, slow, drafting)
    assert row.verdict == DISAGREES and row.ratio == pytest.approx(0.85)
    assert decision_oracle.judge_load(16, [], off).verdict == "unmeasured"


def _decision(choice: str, options: tuple[dict[str, Any], ...] = ()) -> Decision:
    loads = tuple(
        {
            "concurrency": c,
            "k": k,
            "over_plain": 1.3 if k else 0.86,
            "over_plain_low": 1.2 if k else 0.80,
            "over_plain_high": 1.4 if k else 0.91,
            "over_plain_interval": "n=2",
            "load_outcome": "confirmed" if k else "refuted",
        }
        for c, k in ((1, 3), (4, 0))
    )
    return Decision(
        DECISION_ID,
        "decision-verify",
        "decision",
        "chat",
        "draft_model models/tiny-draft",
        "draft_model",
        "models/tiny-draft",
        "refuted",
        choice,
        loads,
        options,
        {"draft-k3": Variant.model_validate(DRAFT)},
    )


def test_the_decisions_choice_names_its_config_at_each_load() -> None:
    """The schedule drafts where k > 0 and is plain in its off range; 'plain' deploys plain everywhere (1x, the
    baseline); a fixed option runs its method at its depth, with the option's own figures."""
    schedule = decision_oracle.decision_choices(_decision("schedule"))
    assert [(c.config.method, c.config.k, c.config.is_plain) for c in schedule] == [
        ("draft_model", 3, False),
        ("none", 0, True),
    ]
    assert (schedule[1].over_plain, schedule[1].low, schedule[1].outcome) == (0.86, 0.80, "refuted")
    plain = decision_oracle.decision_choices(_decision("plain"))
    assert [(c.concurrency, c.config.is_plain, c.over_plain, c.low) for c in plain] == [
        (1, True, 1.0, None),
        (4, True, 1.0, None),
    ]
    option = {
        "name": "draft-k3",
        "loads": [
            {"concurrency": c, "k": 3, "over_plain": x, "over_plain_low": x - 0.1, "over_plain_high": x + 0.1}
            for c, x in ((1, 1.5), (4, 0.9))
        ],
    }
    fixed = decision_oracle.decision_choices(_decision("draft-k3", (option,)))
    assert [(c.config.name, c.config.method, c.config.k, c.over_plain) for c in fixed] == [
        ("draft-k3", "draft_model", 3, 1.5),
        ("draft-k3", "draft_model", 3, 0.9),
    ]
    assert fixed[0].config.drafter == "models/tiny-draft"
    with pytest.raises(InputError, match="neither among its options"):
        decision_oracle.decision_choices(_decision("eagle3-k1"))
