"""The decision loop's documents in the warehouse (warehouse/kinds/decisions.py, migration 0015): planted
decisions/<decision_id>.json and promotions/<decision_id>.json of a verification campaign are ingested into
`decisions`, `decision_loads` and `promotions`, joined by `v_decision`; a document that does not match where
it is, or whose values break a rule, is quarantined with its file named; ingesting again changes nothing."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest
from warehouse_fixtures import RawBuilder, make_spec

from artifacts import layout
from artifacts.documents import DecisionDocument, PromotionDocument
from artifacts.store import write_json_atomic
from warehouse.ingest import ingest_raw

SWEEP = "decision-sweep-0123abcd"
SCHEDULE = [[1, 2, 3], [3, 8, 1], [9, 256, 0]]
CONFIG = {
    "method": "eagle3",
    "model": "models/twin-eagle3",
    "num_speculative_tokens": 3,
    "num_speculative_tokens_per_batch_size": SCHEDULE,
}


def load(concurrency: int, batch_from: int, batch_to: int, k: int, **measured: Any) -> dict[str, Any]:
    """One verified load: by default confirmed, with an interval over three repeats."""
    return {
        "concurrency": concurrency,
        "batch_from": batch_from,
        "batch_to": batch_to,
        "k": k,
        "claim": "beats plain" if k else "no worse than plain",
        "sweep_speedup": 1.4,
        "sweep_interval": "1.30-1.50",
        "over_plain": 1.25,
        "over_plain_low": 1.10,
        "over_plain_high": 1.40,
        "over_plain_interval": "1.10-1.40",
        "n_repeats": 3,
        "over_fixed": 1.02,
        "over_fixed_low": 0.98,
        "over_fixed_high": 1.06,
        "outcome": "confirmed",
        "reason": "the interval over plain lies above 1",
        **measured,
    }


def decision(campaign_id: str, decision_id: str, **fields: Any) -> dict[str, Any]:
    doc = {
        "decision_id": decision_id,
        "campaign_id": campaign_id,
        "source_campaign_id": SWEEP,
        "workload": "code",
        "family": "eagle3 models/twin-eagle3",
        "method": "eagle3",
        "schedule": SCHEDULE,
        "speculative_config": CONFIG,
        "variant": {"name": "eagle3-sched", "method": "eagle3", "k": 3, "k_schedule": SCHEDULE},
        "target": {"model": "models/twin-target", "served_model_name": "twin"},
        "verification_spec": "experiments/decision.yaml",
        "fixed_k": 3,
        "tolerance": 0.05,
        "confidence": 0.95,
        "loads": [
            load(1, 1, 2, 3),
            load(4, 3, 8, 1, over_plain=1.08, over_plain_low=1.01, over_plain_high=1.15),
            load(
                16,
                9,
                256,
                0,
                over_plain=0.99,
                over_plain_low=0.97,
                over_plain_high=1.01,
                over_fixed=None,
                over_fixed_low=None,
                over_fixed_high=None,
                reason="within the tolerance of plain",
            ),
        ],
        "outcome": "confirmed",
        "summary": "Deploy eagle3 k3 up to batch 2, k1 up to 8, off above: confirmed at every load.",
        "caveats": ["one workload"],
        "created_utc": "2026-12-03T09:00:00+01:00",
        "tool": {"specgauge_version": "0.9.0", "git_revision": "abc1234"},
        **fields,
    }
    DecisionDocument.model_validate(
        doc
    )  # what analysis.verification would write: the contract's own model accepts it
    return doc


def promotion(campaign_id: str, decision_id: str, **fields: Any) -> dict[str, Any]:
    doc = {
        "decision_id": decision_id,
        "campaign_id": campaign_id,
        "approved": True,
        "approver": "ops@example.org",
        "note": "go",
        "via": "cli",
        "speculative_config": CONFIG,
        "vllm_args": ["--speculative-config", json.dumps(CONFIG)],
        "files": ["deploy/code.speculative.json"],
        "decided_utc": "2026-12-03T10:30:00Z",
        **fields,
    }
    PromotionDocument.model_validate(doc)
    return doc


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    """A verification campaign's directory in a raw tree (campaign.json as the campaign flow writes it)."""
    builder = RawBuilder(tmp_path / "raw", spec=make_spec("decision-verify"))
    builder.write_campaign()
    return builder.campaign_dir


def plant(folder: Path, name: str, doc: dict[str, Any]) -> Path:
    path = folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)
    return path


def query(db: Path, sql: str, *parameters: Any) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(parameters)).fetchall()
    finally:
        con.close()


def quarantined(report: Any, kind: str) -> list[str]:
    return [o.message for o in report.quarantined if o.kind == kind]


def test_decisions_and_a_later_promotion_reach_the_warehouse_once(campaign: Path, tmp_path: Path) -> None:
    raw, db, cid = campaign.parent, tmp_path / "w.duckdb", campaign.name
    plant(campaign / layout.DECISIONS, "code.eagle3.0a1b2c3d", decision(cid, "code.eagle3.0a1b2c3d"))
    below = {"over_plain": 0.9, "over_plain_low": 0.85, "over_plain_high": 0.95}
    refuted_load = load(1, 1, 256, 2, **below, outcome="refuted", reason="the interval lies below 1")
    refuted = decision(
        cid,
        "chat.ngram.0f0f0f0f",
        workload="chat",
        family="ngram",
        method="ngram",
        schedule=[[1, 256, 2]],
        loads=[refuted_load],
        outcome="refuted",
        caveats=[],
        created_utc=None,
        tool=None,
    )
    plant(campaign / layout.DECISIONS, "chat.ngram.0f0f0f0f", refuted)
    assert [p.stem for p in layout.decision_files(campaign)] == [
        "chat.ngram.0f0f0f0f",
        "code.eagle3.0a1b2c3d",
    ]

    report = ingest_raw(raw, db)

    assert report.ok, report.as_dict()
    assert report.counts()["decisions"] == {"inserted": 2}
    assert report.rows_by_table["decisions"] == 2 and report.rows_by_table["decision_loads"] == 4
    assert "promotions" not in report.counts()  # none written yet
    assert query(
        db,
        "SELECT decision_key, source_campaign_id, outcome, schedule, speculative_config IS NULL, caveats, "
        "created_utc, specgauge_version, source_path, length(sha256) FROM decisions ORDER BY decision_key",
    ) == [
        (
            f"{cid}/chat.ngram.0f0f0f0f",
            SWEEP,
            "refuted",
            "[[1,256,2]]",
            False,
            "[]",
            None,
            None,
            f"{cid}/decisions/chat.ngram.0f0f0f0f.json",
            64,
        ),
        (
            f"{cid}/code.eagle3.0a1b2c3d",
            SWEEP,
            "confirmed",
            "[[1,2,3],[3,8,1],[9,256,0]]",
            False,
            '["one workload"]',
            datetime(2026, 12, 3, 8, 0),  # +01:00 stored as UTC
            "0.9.0",
            f"{cid}/decisions/code.eagle3.0a1b2c3d.json",
            64,
        ),
    ]
    config = query(db, "SELECT speculative_config FROM decisions WHERE decision_id = 'code.eagle3.0a1b2c3d'")
    assert json.loads(config[0][0]) == CONFIG
    view = (
        "SELECT decision_id, concurrency, batch_from, batch_to, k, claim, outcome, load_outcome, over_plain, "
        "over_fixed FROM v_decision"
    )
    code, chat = "code.eagle3.0a1b2c3d", "chat.ngram.0f0f0f0f"
    # ordered by campaign, creation time (one without a time comes last), decision and load
    assert query(db, view) == [
        (code, 1, 1, 2, 3, "beats plain", "confirmed", "confirmed", 1.25, 1.02),
        (code, 4, 3, 8, 1, "beats plain", "confirmed", "confirmed", 1.08, 1.02),
        (code, 16, 9, 256, 0, "no worse than plain", "confirmed", "confirmed", 0.99, None),
        (chat, 1, 1, 256, 2, "beats plain", "refuted", "refuted", 0.9, 1.02),
    ]
    assert query(db, "SELECT DISTINCT approved, approver, promoted_utc FROM v_decision") == [
        (None, None, None)
    ]

    # the person's answer comes later, as its own file: the next ingest adds it and nothing else
    plant(campaign / layout.PROMOTIONS, "code.eagle3.0a1b2c3d", promotion(cid, "code.eagle3.0a1b2c3d"))
    later = ingest_raw(raw, db)
    assert later.ok, later.as_dict()
    assert later.counts()["promotions"] == {"inserted": 1}
    assert later.counts()["decisions"] == {"skipped": 2} and later.rows_by_table["decision_loads"] == 0
    assert query(
        db,
        "SELECT promotion_key, approved, approver, note, via, vllm_args, files, decided_utc, source_path "
        "FROM promotions",
    ) == [
        (
            f"{cid}/code.eagle3.0a1b2c3d",
            True,
            "ops@example.org",
            "go",
            "cli",
            json.dumps(["--speculative-config", json.dumps(CONFIG)], separators=(",", ":")),
            '["deploy/code.speculative.json"]',
            datetime(2026, 12, 3, 10, 30),
            f"{cid}/promotions/code.eagle3.0a1b2c3d.json",
        )
    ]
    promoted = "SELECT DISTINCT decision_id, approved, approver, promoted_utc FROM v_decision ORDER BY 1"
    assert query(db, promoted) == [
        ("chat.ngram.0f0f0f0f", None, None, None),
        ("code.eagle3.0a1b2c3d", True, "ops@example.org", datetime(2026, 12, 3, 10, 30)),
    ]
    counts = (
        "SELECT (SELECT count(*) FROM decisions), (SELECT count(*) FROM decision_loads), "
        "(SELECT count(*) FROM promotions), (SELECT count(*) FROM v_decision)"
    )
    before = query(db, counts)
    assert before == [(2, 4, 1, 4)]

    again = ingest_raw(raw, db)  # idempotent: every document skipped, nothing written

    assert again.ok and again.rows == 0, again.as_dict()
    assert again.counts()["decisions"] == {"skipped": 2} and again.counts()["promotions"] == {"skipped": 1}
    assert query(db, counts) == before


def test_decisions_with_nothing_measured_are_kept_as_inconclusive(campaign: Path, tmp_path: Path) -> None:
    """Speculation off at every load (analysis.verification launches nothing: no spec, no figures), and a decision with
    no load at all: both are stored, and each shows in v_decision."""
    db, cid = tmp_path / "w.duckdb", campaign.name
    unmeasured = {
        **{f: None for f in ("over_plain", "over_plain_low", "over_plain_high", "over_fixed")},
        **{f: None for f in ("over_fixed_low", "over_fixed_high")},
        "over_plain_interval": "",
        "n_repeats": 0,
        "outcome": "inconclusive",
        "reason": "speculation is off at every load: nothing was launched to verify",
    }
    off = decision(
        cid,
        "code.ngram.11111111",
        schedule=[[1, 256, 0]],
        speculative_config=None,
        variant=None,
        verification_spec="",
        loads=[load(1, 1, 2, 0, **unmeasured), load(4, 3, 256, 0, sweep_speedup=0.8, **unmeasured)],
        outcome="inconclusive",
    )
    plant(campaign / layout.DECISIONS, "code.ngram.11111111", off)
    empty = decision(cid, "code.eagle3.00000000", loads=[], outcome="inconclusive", created_utc=None)
    plant(campaign / layout.DECISIONS, "code.eagle3.00000000", empty)

    report = ingest_raw(campaign.parent, db)

    assert report.ok and report.counts()["decisions"] == {"inserted": 2}, report.as_dict()
    view = (
        "SELECT decision_id, outcome, concurrency, k, load_outcome, over_plain, speculative_config "
        "FROM v_decision"
    )
    assert query(db, view) == [
        ("code.ngram.11111111", "inconclusive", 1, 0, "inconclusive", None, None),
        ("code.ngram.11111111", "inconclusive", 4, 0, "inconclusive", None, None),
        (
            "code.eagle3.00000000",
            "inconclusive",
            None,
            None,
            None,
            None,
            json.dumps(CONFIG, sort_keys=True, separators=(",", ":")),
        ),
    ]
    assert query(db, "SELECT verification_spec, variant FROM decisions ORDER BY 1") == [
        ("", None),
        (
            "experiments/decision.yaml",
            '{"k":3,"k_schedule":[[1,2,3],[3,8,1],[9,256,0]],"method":"eagle3","name":"eagle3-sched"}',
        ),
    ]


@pytest.mark.parametrize("kind", ["decisions", "promotions"])
def test_a_document_that_does_not_match_where_it_is_is_quarantined(
    campaign: Path, tmp_path: Path, kind: str
) -> None:
    raw, db, cid = campaign.parent, tmp_path / "w.duckdb", campaign.name
    make = decision if kind == "decisions" else promotion
    folder = campaign / kind
    plant(folder, "code.eagle3.0a1b2c3d", make(cid, "code.eagle3.0a1b2c3d"))  # a good one beside
    plant(folder, "code.eagle3.ffffffff", make(cid, "code.eagle3.0a1b2c3d"))  # copied under another name
    plant(folder, "chat.eagle3.eeeeeeee", make("another-campaign-00000000", "chat.eagle3.eeeeeeee"))

    report = ingest_raw(raw, db)

    assert not report.ok
    assert report.counts()[kind] == {"inserted": 1, "quarantined": 2}
    messages = sorted(quarantined(report, kind))
    assert messages == [
        f"{cid}/{kind}/chat.eagle3.eeeeeeee.json/chat.eagle3.eeeeeeee.json: column campaign_id: "
        f"'another-campaign-00000000' does not match where it is ('{cid}')",
        f"{cid}/{kind}/code.eagle3.ffffffff.json/code.eagle3.ffffffff.json: column decision_id: "
        "'code.eagle3.0a1b2c3d' does not match where it is ('code.eagle3.ffffffff')",
    ]
    table = "decisions" if kind == "decisions" else "promotions"
    assert query(db, f"SELECT decision_id FROM {table}") == [("code.eagle3.0a1b2c3d",)]
    assert query(
        db,
        "SELECT artifact_key, source_path, file, column_name FROM quarantine WHERE kind = ? ORDER BY 1",
        kind,
    ) == [
        (
            f"{cid}/chat.eagle3.eeeeeeee",
            f"{cid}/{kind}/chat.eagle3.eeeeeeee.json",
            "chat.eagle3.eeeeeeee.json",
            "campaign_id",
        ),
        (
            f"{cid}/code.eagle3.ffffffff",
            f"{cid}/{kind}/code.eagle3.ffffffff.json",
            "code.eagle3.ffffffff.json",
            "decision_id",
        ),
    ]
    again = ingest_raw(raw, db)  # unchanged: still quarantined, nothing written
    assert again.counts()[kind] == {"skipped": 1, "quarantined": 2} and again.rows == 0


BAD_DECISIONS = {
    "a range that runs backwards": (
        {"loads": [load(1, 8, 3, 1)]},
        "loads: column batch_to: check a load's range runs from batch_from up to batch_to",
    ),
    "an interval that misses its estimate": (
        {"loads": [load(1, 1, 2, 3, over_plain=1.5)]},
        "loads: column over_plain_low: check the interval must hold its estimate",
    ),
    "an interval with one bound": (
        {"loads": [load(1, 1, 2, 3, over_fixed_high=None)]},
        "loads: column over_fixed_low: check the interval must hold its estimate",
    ),
    "bounds without their estimate": (
        {"loads": [load(1, 1, 2, 3, over_plain=None)]},
        "loads: column over_plain_low: check the interval must hold its estimate",
    ),
    "a negative depth": (
        {"loads": [load(1, 1, 2, -1)]},
        "loads: column k: check greater_than_or_equal_to(0)",
    ),
    "an unknown load outcome": (
        {"loads": [load(1, 1, 2, 3, outcome="maybe")], "outcome": "inconclusive"},
        "loads: column outcome: check isin",
    ),
    "an unknown decision outcome": ({"outcome": "adopted"}, "decisions: column outcome: check isin"),
    "a load measured twice": (
        {"loads": [load(4, 3, 8, 1), load(4, 3, 8, 1)]},
        "loads: column concurrency: check a decision measures each load once",
    ),
    "a confirmed decision with a refuted load": (
        {"loads": [load(1, 1, 2, 3), load(4, 3, 8, 1, outcome="refuted")]},
        "column outcome: a decision is confirmed only when every load is: not at concurrency 4",
    ),
    "a confirmed decision with no load": (
        {"loads": []},
        "column outcome: a decision is confirmed only when every load is: it has no load",
    ),
    "a schedule entry that is not a range": (
        {"schedule": [[1, 2, 3], [3, 8]]},
        "column schedule[1]: expected [batch_from, batch_to, k]",
    ),
}


@pytest.mark.parametrize("case", list(BAD_DECISIONS))
def test_a_decision_that_breaks_a_rule_is_quarantined_whole(
    campaign: Path, tmp_path: Path, case: str
) -> None:
    fields, words = BAD_DECISIONS[case]
    db, cid = tmp_path / "w.duckdb", campaign.name
    plant(
        campaign / layout.DECISIONS, "code.eagle3.0a1b2c3d", decision(cid, "code.eagle3.0a1b2c3d", **fields)
    )

    report = ingest_raw(campaign.parent, db)

    [message] = quarantined(report, "decisions")
    assert message.startswith(f"{cid}/decisions/code.eagle3.0a1b2c3d.json"), message
    assert words in message, message
    # nothing of it is written: neither its row nor any of its loads
    assert query(db, "SELECT (SELECT count(*) FROM decisions), (SELECT count(*) FROM decision_loads)") == [
        (0, 0)
    ]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"via": "email"}, "promotions: column via: check isin"),
        ({"approver": ""}, "promotions: column approver: check str_length"),
        ({"decided_utc": "yesterday"}, "column decided_utc"),
    ],
)
def test_a_promotion_that_breaks_a_rule_is_quarantined(
    campaign: Path, tmp_path: Path, fields: dict[str, Any], words: str
) -> None:
    db, cid = tmp_path / "w.duckdb", campaign.name
    doc = {**promotion(cid, "code.eagle3.0a1b2c3d"), **fields}
    plant(campaign / layout.PROMOTIONS, "code.eagle3.0a1b2c3d", doc)

    report = ingest_raw(campaign.parent, db)

    [message] = quarantined(report, "promotions")
    assert message.startswith(f"{cid}/promotions/code.eagle3.0a1b2c3d.json"), message
    assert words in message, message
    assert query(db, "SELECT count(*) FROM promotions") == [(0,)]
