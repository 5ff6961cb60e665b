"""Capture comparison and the calibrated gate, on synthetic capture artifacts written in the real format
(tests/test_capture.py runs the same code on the real engine)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from artifacts.documents.captures import load_capture
from specgauge.errors import ArtifactError
from tasks.capture import write_capture_artifact
from tasks.gate import (
    MIN_PROMPTS,
    GateRefusal,
    compare,
    gate,
    tolerated_worse,
    write_verdict,
)

STRATA = ("chat", "code", "summarization")
PROMPT_IDS = [f"{s}-{i:02d}" for s in STRATA for i in range(12)]  # 36, like workloads/capture.jsonl
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": None, "seed": 0, "max_tokens": None, "ignore_eos": False}
FAIL = "FAIL"  # marker for a failed request in `outputs`
Outputs = dict[str, Any]  # prompt id -> list of token ids, or FAIL


def reference() -> Outputs:
    rng = random.Random(7)
    return {pid: [rng.randrange(2, 2048) for _ in range(40)] for pid in PROMPT_IDS}


def diverge(ids: list[int], at: int) -> list[int]:
    """Same tokens up to `at`, then different ones (token 1 never appears in reference outputs)."""
    return [*ids[:at], *[1] * (len(ids) - at)]


def with_changes(base: Outputs, changes: dict[str, Any]) -> Outputs:
    return {**base, **changes}


def write(
    root: Path,
    name: str,
    outputs: Outputs,
    *,
    deployment_id: str,
    variant: str = "plain",
    port: int = 8000,
    sampling: dict[str, Any] | None = None,
    token_ids: bool = True,
    prompt_sha: dict[str, str] | None = None,
    workloads: dict[str, str] | None = None,
) -> Path:
    rows = []
    for pid, ids in outputs.items():
        failed = ids == FAIL
        rows.append(
            {
                "prompt_id": pid,
                "workload": (workloads or {}).get(pid, pid.split("-")[0]),
                "ok": not failed,
                "error": "timeout: no response in 120 s" if failed else None,
                "text": None if failed else " ".join(f"w{t}" for t in ids),
                "token_ids": None if failed or not token_ids else ids,
                "finish_reason": None if failed else "length",
                "prompt_tokens": None if failed else 20,
                "completion_tokens": None if failed else len(ids),
            }
        )
    meta = {
        "capture_id": name,
        "campaign_id": "synthetic-00000000",
        "deployment_id": deployment_id,
        "variant": {"name": variant, "method": "none" if variant == "plain" else "ngram"},
        "prompt_ids": list(outputs),
        "prompt_sha256": prompt_sha or {pid: f"sha-{pid}" for pid in outputs},
        "sampling": sampling or GREEDY,
        "max_tokens": None,
        "deployment": {
            "served_model_name": f"tiny-{variant}",
            "command": ["python", "-m", "vllm", "--model", "m", "--port", str(port), "--seed", "0"],
        },
    }
    return write_capture_artifact(root / name, meta, rows)


@pytest.fixture()
def base() -> Outputs:
    return reference()


@pytest.fixture()
def envelope(tmp_path: Path, base: Outputs) -> dict[str, Path]:
    """plain captured twice on one deployment (identical), and a separately launched plain deployment that
    diverges late on three prompts: the benign variation the gate calibrates against."""
    cross = with_changes(
        base, {pid: diverge(base[pid], 30) for pid in ("chat-01", "code-02", "summarization-03")}
    )
    return {
        "plain": write(tmp_path, "plain", base, deployment_id="d.plain.r1"),
        "plain_again": write(tmp_path, "plain.again", base, deployment_id="d.plain.r1"),
        "plain_ctl": write(tmp_path, "plain.ctl1", cross, deployment_id="d.plain.r1.ctl1", port=8001),
    }


def controls(env: dict[str, Path]) -> list[tuple[Path, Path]]:
    return [(env["plain"], env["plain_again"]), (env["plain"], env["plain_ctl"])]


# --- compare ----------------------------------------------------------------------------------------------


def test_identical_captures_match_exactly(tmp_path: Path, base: Outputs) -> None:
    a = write(tmp_path, "a", base, deployment_id="d1")
    b = write(tmp_path, "b", base, deployment_id="d1")
    result = compare(a, b)
    assert result.overall.exact == result.overall.n == 36
    assert result.overall.mean_prefix_fraction == 1.0
    assert result.overall.mean_edit_distance == 0.0
    assert result.overall.median_first_divergence is None
    assert result.overall.token_level == 36
    assert set(result.per_stratum) == set(STRATA)
    assert result.worst() == []


def test_divergence_position_prefix_and_edit_distance(tmp_path: Path, base: Outputs) -> None:
    b_out = with_changes(base, {"code-00": diverge(base["code-00"], 10)})
    result = compare(
        write(tmp_path, "a", base, deployment_id="d1"), write(tmp_path, "b", b_out, deployment_id="d2")
    )
    row = result.by_id()["code-00"]
    assert (row.exact, row.status, row.unit) == (False, "diverged", "token")
    assert row.first_divergence == row.common_prefix == 10
    assert row.prefix_fraction == pytest.approx(10 / 40)
    assert row.divergence_relative == pytest.approx(10 / 40)
    assert row.edit_distance == pytest.approx(30 / 40)  # 30 substitutions over 40 tokens
    assert row.excerpt_a and row.excerpt_b and row.excerpt_a != row.excerpt_b
    assert result.overall.exact == 35
    assert result.per_stratum["code"].exact == 11 and result.per_stratum["chat"].exact == 12
    assert result.overall.median_first_divergence == 10
    assert result.worst()[0].prompt_id == "code-00"


def test_different_lengths_one_output_a_prefix_of_the_other(tmp_path: Path, base: Outputs) -> None:
    b_out = with_changes(base, {"chat-00": base["chat-00"][:25]})
    result = compare(
        write(tmp_path, "a", base, deployment_id="d1"), write(tmp_path, "b", b_out, deployment_id="d2")
    )
    row = result.by_id()["chat-00"]
    assert (row.exact, row.status) == (False, "length")
    assert (row.len_a, row.len_b) == (40, 25)
    assert row.first_divergence == 25
    assert row.prefix_fraction == pytest.approx(25 / 40)
    assert row.edit_distance == pytest.approx(15 / 40)
    assert row.completion_token_diff == -15
    assert "b ended after 25 tokens" in (row.reason or "")


def test_empty_output(tmp_path: Path, base: Outputs) -> None:
    a_out = with_changes(base, {"chat-02": [], "chat-03": []})
    b_out = with_changes(base, {"chat-02": []})
    result = compare(
        write(tmp_path, "a", a_out, deployment_id="d1"), write(tmp_path, "b", b_out, deployment_id="d2")
    )
    both_empty, one_empty = result.by_id()["chat-02"], result.by_id()["chat-03"]
    assert both_empty.exact and both_empty.prefix_fraction == 1.0 and both_empty.edit_distance == 0.0
    assert not one_empty.exact and one_empty.status == "length"
    assert one_empty.first_divergence == 0 and one_empty.prefix_fraction == 0.0
    assert one_empty.edit_distance == 1.0


def test_failed_side_is_a_mismatch_with_its_reason_never_dropped(tmp_path: Path, base: Outputs) -> None:
    b_out = with_changes(base, {"summarization-05": FAIL})
    result = compare(
        write(tmp_path, "a", base, deployment_id="d1"), write(tmp_path, "b", b_out, deployment_id="d2")
    )
    row = result.by_id()["summarization-05"]
    assert (row.exact, row.status) == (False, "failed")
    assert "b failed: timeout" in (row.reason or "")
    assert row.prefix_fraction == 0.0 and row.edit_distance == 1.0
    assert result.overall.n == 36 and result.overall.failed == 1 and result.overall.exact == 35
    assert result.worst()[0].prompt_id == "summarization-05"


def test_no_token_ids_compares_characters(tmp_path: Path, base: Outputs) -> None:
    b_out = with_changes(base, {"code-04": diverge(base["code-04"], 20)})
    a = write(tmp_path, "a", base, deployment_id="d1")
    b = write(tmp_path, "b", b_out, deployment_id="d2", token_ids=False)  # a server that gave no ids
    result = compare(a, b)
    row = result.by_id()["code-04"]
    assert row.unit == "char" and result.overall.token_level == 0
    text_a = " ".join(f"w{t}" for t in base["code-04"])
    text_b = " ".join(f"w{t}" for t in b_out["code-04"])
    prefix = next(i for i, (x, y) in enumerate(zip(text_a, text_b, strict=False)) if x != y)
    assert row.first_divergence == prefix
    assert row.len_a == len(text_a) and row.len_b == len(text_b)
    assert result.by_id()["code-05"].exact  # equal texts match on characters too


def test_refuses_different_prompt_sets_naming_them(tmp_path: Path, base: Outputs) -> None:
    fewer = {pid: ids for pid, ids in base.items() if pid not in ("chat-07", "code-09")}
    a = write(tmp_path, "a", base, deployment_id="d1")
    b = write(tmp_path, "b", fewer, deployment_id="d2")
    with pytest.raises(GateRefusal, match=r"prompt ids only in a .*chat-07, code-09"):
        compare(a, b)


def test_refuses_changed_prompt_behind_the_same_id(tmp_path: Path, base: Outputs) -> None:
    shas = {pid: f"sha-{pid}" for pid in base} | {"code-01": "sha-edited"}
    a = write(tmp_path, "a", base, deployment_id="d1")
    b = write(tmp_path, "b", base, deployment_id="d2", prompt_sha=shas)
    with pytest.raises(GateRefusal, match=r"same id but a different request.*code-01"):
        compare(a, b)


def test_refuses_different_sampling_naming_the_field(tmp_path: Path, base: Outputs) -> None:
    a = write(tmp_path, "a", base, deployment_id="d1")
    b = write(tmp_path, "b", base, deployment_id="d2", sampling={**GREEDY, "temperature": 1.0})
    with pytest.raises(GateRefusal, match=r"sampling\.temperature differs: 0\.0 .* vs 1\.0"):
        compare(a, b)


def test_refuses_a_capture_compared_with_itself(tmp_path: Path, base: Outputs) -> None:
    a = write(tmp_path, "a", base, deployment_id="d1")
    with pytest.raises(GateRefusal, match="same capture"):
        compare(a, a)


def test_incomplete_capture_directory_names_the_file(tmp_path: Path, base: Outputs) -> None:
    a = write(tmp_path, "a", base, deployment_id="d1")
    (a / "outputs.parquet").unlink()
    with pytest.raises(ArtifactError, match=r"outputs\.parquet: missing"):
        load_capture(a)


# --- gate -------------------------------------------------------------------------------------------------


def test_sign_test_tolerance_grows_with_evidence() -> None:
    # With no prompt where the treatment is better, five worse prompts pass at 0.05/3 (0.5**5 = 0.031) and
    # six do not (0.5**6 = 0.016); prompts where the treatment is better buy tolerance.
    assert tolerated_worse(0, 36, 0.05 / 3) == 5
    assert tolerated_worse(3, 36, 0.05 / 3) > 5 + 3 - 1
    assert tolerated_worse(0, 36, 0.05) == 4


def test_gate_passes_a_treatment_within_the_envelope(
    tmp_path: Path, base: Outputs, envelope: dict[str, Path]
) -> None:
    # Late divergences on four prompts, like the cross-deployment control's three.
    spec = with_changes(
        base, {pid: diverge(base[pid], 28) for pid in ("chat-05", "code-06", "code-07", "summarization-08")}
    )
    spec_dir = write(tmp_path, "spec", spec, deployment_id="d.ngram.r1", variant="ngram-k3", port=8002)
    verdict = gate((envelope["plain"], spec_dir), controls(envelope))
    assert verdict.passed and verdict.outcome == "consistent", verdict.claim
    assert verdict.claim.startswith("consistent with lossless speculation")
    assert "proven" not in verdict.claim
    kinds = [kind for _, kind, _ in verdict.controls]
    assert kinds == ["same_deployment", "cross_deployment"]
    exact = next(c for c in verdict.checks if c.name == "exact_match")
    assert exact.against == "control1:cross-deployment"  # the most divergent control is the envelope's edge
    assert (exact.worse, exact.better, exact.passed) == (4, 3, True)
    assert exact.value == pytest.approx(32 / 36) and exact.control_value == pytest.approx(33 / 36)
    assert exact.value >= exact.threshold and exact.margin > 0
    data = verdict.to_json()
    assert data["envelope"]["exact_match_rate"] == {"min": 33 / 36, "max": 1.0}
    assert {c["name"] for c in data["checks"]} == {
        "exact_match",
        "prefix_fraction",
        "edit_distance",
        "requests_ok",
    }
    for check in data["checks"]:
        assert {"name", "value", "threshold", "margin", "passed"} <= set(check)
    assert set(data["per_stratum"]) == set(STRATA)
    assert len(data["worst_cases"]) == 4


def test_gate_fails_a_lossy_treatment_and_says_what_diverged(
    tmp_path: Path, base: Outputs, envelope: dict[str, Path]
) -> None:
    rng = random.Random(1)
    lossy = {pid: [rng.randrange(2, 2048) for _ in range(40)] for pid in PROMPT_IDS}  # another model's text
    lossy_dir = write(tmp_path, "lossy", lossy, deployment_id="d.lossy", variant="lossy", port=8003)
    verdict = gate((envelope["plain"], lossy_dir), controls(envelope))
    assert not verdict.passed and verdict.outcome == "diverged"
    assert verdict.claim.startswith("diverged beyond the control envelope")
    assert "exact_match 0.000 against 0.917" in verdict.claim  # 0/36 matched vs 33/36 for the control
    assert "worse on 33 prompts" in verdict.claim
    assert all(not c.passed for c in verdict.checks if c.name != "requests_ok")


def test_gate_fails_early_divergence_the_controls_never_show(
    tmp_path: Path, base: Outputs, envelope: dict[str, Path]
) -> None:
    # Nine prompts diverging at the second token, against the cross-deployment control's three late ones.
    # Counting mismatches alone cannot tell (9 vs 3 discordant prompts is within chance at this alpha);
    # where the divergence starts can: the position-aware checks fail it.
    early = with_changes(base, {pid: diverge(base[pid], 1) for pid in PROMPT_IDS[::4]})
    early_dir = write(tmp_path, "early", early, deployment_id="d.early", variant="ngram-k3", port=8004)
    verdict = gate((envelope["plain"], early_dir), controls(envelope))
    assert not verdict.passed and verdict.outcome == "diverged"
    by_name = {c.name: c for c in verdict.checks}
    assert by_name["exact_match"].passed
    assert not by_name["prefix_fraction"].passed and not by_name["edit_distance"].passed
    assert by_name["prefix_fraction"].value < by_name["prefix_fraction"].threshold
    assert by_name["edit_distance"].value > by_name["edit_distance"].threshold
    assert "prefix_fraction" in verdict.claim and "exact_match" not in verdict.claim


def test_gate_refuses_without_a_cross_deployment_control(
    tmp_path: Path, base: Outputs, envelope: dict[str, Path]
) -> None:
    spec_dir = write(tmp_path, "spec", base, deployment_id="d.ngram.r1", variant="ngram-k3", port=8002)
    with pytest.raises(GateRefusal, match="no cross-deployment control"):
        gate((envelope["plain"], spec_dir), [(envelope["plain"], envelope["plain_again"])])
    with pytest.raises(GateRefusal, match="no control pair"):
        gate((envelope["plain"], spec_dir), [])


def test_gate_refuses_a_control_of_two_configurations(
    tmp_path: Path, base: Outputs, envelope: dict[str, Path]
) -> None:
    spec_dir = write(tmp_path, "spec", base, deployment_id="d.ngram.r1", variant="ngram-k3", port=8002)
    with pytest.raises(GateRefusal, match="not one configuration"):
        gate((envelope["plain"], spec_dir), [(envelope["plain"], spec_dir)])


def test_gate_refuses_too_few_prompts_unless_forced(tmp_path: Path, base: Outputs) -> None:
    few = {pid: base[pid] for pid in PROMPT_IDS[:6]}
    a = write(tmp_path, "a", few, deployment_id="d1")
    a2 = write(tmp_path, "a2", few, deployment_id="d1")
    ctl = write(tmp_path, "ctl", few, deployment_id="d1.ctl1", port=8001)
    spec = write(tmp_path, "spec", few, deployment_id="d.ngram", variant="ngram-k3", port=8002)
    with pytest.raises(GateRefusal, match=f"only 6 prompts: the gate needs at least {MIN_PROMPTS}"):
        gate((a, spec), [(a, a2), (a, ctl)])
    verdict = gate((a, spec), [(a, a2), (a, ctl)], force=True)
    assert verdict.passed and verdict.forced
    assert any("forced with 6 prompts" in note for note in verdict.notes)


def test_gate_refuses_controls_on_other_prompts(
    tmp_path: Path, base: Outputs, envelope: dict[str, Path]
) -> None:
    fewer = {pid: base[pid] for pid in PROMPT_IDS[:34]}
    a = write(tmp_path, "few.a", fewer, deployment_id="x1")
    b = write(tmp_path, "few.b", fewer, deployment_id="x2", port=8009)
    spec_dir = write(tmp_path, "spec", base, deployment_id="d.ngram.r1", variant="ngram-k3", port=8002)
    with pytest.raises(GateRefusal, match="does not match the treatment's prompts"):
        gate((envelope["plain"], spec_dir), [(a, b)])


def test_failed_requests_make_the_verdict_incomplete(
    tmp_path: Path, base: Outputs, envelope: dict[str, Path]
) -> None:
    spec = with_changes(base, {"code-03": FAIL})
    spec_dir = write(tmp_path, "spec", spec, deployment_id="d.ngram.r1", variant="ngram-k3", port=8002)
    verdict = gate((envelope["plain"], spec_dir), controls(envelope))
    assert not verdict.passed and verdict.outcome == "incomplete"
    assert verdict.claim.startswith("not judged: 1 capture request(s) failed (1 in spec)")


def test_verdict_artifact_is_written_once(tmp_path: Path, base: Outputs, envelope: dict[str, Path]) -> None:
    spec_dir = write(tmp_path, "spec", base, deployment_id="d.ngram.r1", variant="ngram-k3", port=8002)
    verdict = gate((envelope["plain"], spec_dir), controls(envelope))
    path = write_verdict(verdict, tmp_path / "raw" / "synthetic-00000000")
    assert path == tmp_path / "raw" / "synthetic-00000000" / "gates" / f"{verdict.verdict_id}.json"
    stored = json.loads(path.read_text())
    assert stored["passed"] is True and stored["treatment_variant"] == "ngram-k3"
    again = gate((envelope["plain"], spec_dir), controls(envelope))
    assert again.verdict_id == verdict.verdict_id  # same inputs, same id
    with pytest.raises(ArtifactError, match="never overwritten"):
        write_verdict(again, tmp_path / "raw" / "synthetic-00000000")


# --- CLI --------------------------------------------------------------------------------------------------


def _cli(*args: str | Path) -> Any:
    from cli.app import app  # the real CLI: its error boundary turns a refusal into exit 2

    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_gate_exit_codes_and_output(tmp_path: Path, base: Outputs, envelope: dict[str, Path]) -> None:
    spec_dir = write(tmp_path, "spec", base, deployment_id="d.ngram.r1", variant="ngram-k3", port=8002)
    lossy = {pid: diverge(ids, 0) for pid, ids in base.items()}
    lossy_dir = write(tmp_path, "lossy", lossy, deployment_id="d.lossy", variant="lossy", port=8003)
    ctl = [
        "--control",
        envelope["plain"],
        envelope["plain_again"],
        "--control",
        envelope["plain"],
        envelope["plain_ctl"],
    ]
    out = tmp_path / "verdict.json"

    passed = _cli("gate", envelope["plain"], spec_dir, *ctl, "--output", out)
    assert passed.exit_code == 0, passed.output
    assert "consistent with lossless speculation" in passed.output
    assert json.loads(out.read_text())["passed"] is True

    failed = _cli("gate", envelope["plain"], lossy_dir, *ctl)
    assert failed.exit_code == 1, failed.output
    assert "diverged beyond the control envelope" in failed.output

    refused = _cli(
        "gate", envelope["plain"], spec_dir, "--control", envelope["plain"], envelope["plain_again"]
    )
    assert refused.exit_code == 2
    assert "no cross-deployment control" in refused.output

    odd = _cli("gate", envelope["plain"], spec_dir, "--control", envelope["plain"])
    assert odd.exit_code == 2 and "--control needs two capture directories" in odd.output


def test_cli_capture_compare(tmp_path: Path, base: Outputs) -> None:
    a = write(tmp_path, "a", base, deployment_id="d1")
    b = write(
        tmp_path, "b", with_changes(base, {"code-00": diverge(base["code-00"], 10)}), deployment_id="d2"
    )
    out = tmp_path / "cmp.json"
    result = _cli("capture", "compare", a, b, "--output", out)
    assert result.exit_code == 0, result.output
    assert "35/36" in result.output and "code-00" in result.output
    data = json.loads(out.read_text())
    assert data["overall"]["exact"] == 35 and len(data["prompts"]) == 36
    c = write(tmp_path, "c", base, deployment_id="d3", sampling={**GREEDY, "seed": 1})
    refused = _cli("capture", "compare", a, c)
    assert refused.exit_code == 2 and "sampling.seed differs" in refused.output


# --- warehouse --------------------------------------------------------------------------------------------


def test_verdicts_land_in_v_gate_once(tmp_path: Path, base: Outputs, envelope: dict[str, Path]) -> None:
    from warehouse.db import writer
    from warehouse.ingest import ingest_found, ingest_raw
    from warehouse.kinds import gates

    raw_campaign = tmp_path / "raw" / "synthetic-00000000"
    spec_dir = write(tmp_path, "spec", base, deployment_id="d.ngram.r1", variant="ngram-k3", port=8002)
    lossy = {pid: diverge(ids, 0) for pid, ids in base.items()}
    lossy_dir = write(tmp_path, "lossy", lossy, deployment_id="d.lossy", variant="lossy", port=8003)
    write_verdict(gate((envelope["plain"], spec_dir), controls(envelope)), raw_campaign)
    write_verdict(gate((envelope["plain"], lossy_dir), controls(envelope)), raw_campaign)
    db = tmp_path / "warehouse.duckdb"
    walked = ingest_raw(tmp_path / "raw", db)  # the warehouse's own walk finds gates/*.json
    assert [o.action for o in walked.outcomes if o.kind == "gate"] == ["inserted", "inserted"]
    with writer(db) as con:
        again = ingest_found(con, gates.KIND, raw_campaign)
        rows = con.execute(
            "SELECT treatment_variant, passed, verdict, control_pairs, failed_checks FROM v_gate "
            "ORDER BY treatment_variant"
        ).fetchall()
    assert [o.action for o in again] == ["skipped", "skipped"]  # idempotent
    (lossy_row, spec_row) = rows
    assert lossy_row[:2] == ("lossy", False) and lossy_row[2].startswith(
        "diverged beyond the control envelope"
    )
    assert set(lossy_row[4]) == {"exact_match", "prefix_fraction", "edit_distance"}
    assert spec_row[:2] == ("ngram-k3", True) and spec_row[2].startswith(
        "consistent with lossless speculation"
    )
    assert spec_row[3] == ["plain vs plain.again (same_deployment)", "plain vs plain.ctl1 (cross_deployment)"]


def test_a_tampered_verdict_is_quarantined(tmp_path: Path, base: Outputs, envelope: dict[str, Path]) -> None:
    from warehouse.db import writer
    from warehouse.ingest import ingest_found
    from warehouse.kinds import gates

    raw_campaign = tmp_path / "raw" / "synthetic-00000000"
    lossy = {pid: diverge(ids, 0) for pid, ids in base.items()}
    lossy_dir = write(tmp_path, "lossy", lossy, deployment_id="d.lossy", variant="lossy", port=8003)
    path = write_verdict(gate((envelope["plain"], lossy_dir), controls(envelope)), raw_campaign)
    data = json.loads(path.read_text())
    data["passed"] = True  # says passed while its outcome says diverged
    path.chmod(0o644)
    path.write_text(json.dumps(data))
    with writer(tmp_path / "warehouse.duckdb") as con:
        (outcome,) = ingest_found(con, gates.KIND, raw_campaign)
        stored = con.execute("SELECT count(*) FROM gate_verdicts").fetchone()
    assert outcome.action == "quarantined" and "passed" in outcome.message
    assert stored == (0,)


def test_cli_gate_store_writes_the_verdict_beside_the_captures(tmp_path: Path, base: Outputs) -> None:
    captures = tmp_path / "raw" / "synthetic-00000000" / "captures"
    plain = write(captures, "plain.r1", base, deployment_id="d.plain.r1")
    again = write(captures, "plain.r1.again", base, deployment_id="d.plain.r1")
    ctl = write(captures, "plain.ctl1", base, deployment_id="d.plain.ctl1", port=8001)
    spec = write(captures, "ngram-k3.r1", base, deployment_id="d.ngram-k3.r1", variant="ngram-k3", port=8002)
    args = ["gate", plain, spec, "--control", plain, again, "--control", plain, ctl, "--store"]
    first = _cli(*args)
    assert first.exit_code == 0, first.output
    (stored,) = (captures.parent / "gates").glob("ngram-k3.*.json")
    assert json.loads(stored.read_text())["treatment"]["b"]["capture_id"] == "ngram-k3.r1"
    second = _cli(*args)  # the same verdict again: the artifact is kept, not rewritten
    assert second.exit_code == 0 and "not stored" in second.output
