"""The train-drafter flow (flows/train_drafter.py) end to end on the embedded target: training data from a
capture and a JSONL, the target's hidden states from its weights (the torch worker in the engine's venv),
a short fine-tune of models/tiny-eagle3, the drafter artifact (head, card, curve, data), its warehouse row,
resume, and bad input named by file, line and field. Kept cheap: a handful of examples and 3 steps."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import duckdb
import polars as pl
import pytest

from artifacts import layout
from artifacts.documents import OUTPUT_SCHEMA
from specgauge.checkpoints import drafter_digest
from specgauge.errors import InputError, WorkloadError
from specgauge.settings import REPO_ROOT
from tasks.capture import write_capture_artifact
from tasks.drafters.contract import check_eagle3_head
from tasks.drafters.training import Hyperparameters, inputs_digest
from tasks.drafters.training_data import held_out_by_id, read_jsonl

TARGET = REPO_ROOT / "models" / "tiny-target"
PARENT = REPO_ROOT / "models" / "tiny-eagle3"
SMOKE = REPO_ROOT / "workloads" / "smoke.jsonl"


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _capture(raw: Path) -> Path:
    """A greedy capture artifact of three smoke prompts (as tasks.capture writes it)."""
    prompts = [json.loads(line) for line in SMOKE.read_text().splitlines() if line.startswith("{")][:3]
    ids = [p["id"] for p in prompts]
    meta = {
        "capture_id": "plain.r1",
        "campaign_id": "demo-0000",
        "deployment_id": "demo-0000.plain.r1.l1",
        "variant": "plain",
        "corpus_file": str(SMOKE),
        "corpus_sha256": hashlib.sha256(SMOKE.read_bytes()).hexdigest(),
        "prompt_ids": ids,
        "sampling": {"temperature": 0.0},
    }
    rows = [
        {
            "prompt_id": pid,
            "workload": p["workload"],
            "ok": True,
            "error": None,
            "text": "x",
            "token_ids": list(range(40 + n, 80 + n)),
            "finish_reason": "length",
            "prompt_tokens": None,
            "completion_tokens": 40,
        }
        for n, (pid, p) in enumerate(zip(ids, prompts, strict=True))
    ]
    assert set(rows[0]) == set(OUTPUT_SCHEMA)
    return write_capture_artifact(raw / "demo-0000" / "captures" / "plain.r1", meta, rows)


TRAINING_ROWS = [
    {
        "id": f"t{i}",
        "workload": "shifted",
        "messages": [
            {
                "role": "user",
                "content": f"Summarize the following Python code.\n\ndef f{i}(x):\n    return x + {i}",
            }
        ],
        "output": f"Return x plus {i}.",
    }
    for i in range(6)
] + [
    {
        "id": "ids",
        "workload": "chat",
        "prompt_ids": [2, 10, 11, 12, 4, 3],
        "output_ids": [20, 21, 22, 23, 24, 4],
    }
]


def test_a_bad_training_line_is_named_by_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(
        json.dumps(TRAINING_ROWS[0]) + "\n# a comment\n"
        + json.dumps({"id": "b", "workload": "chat", "prompt_ids": [1, 2], "output_ids": [3, "x"]}) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    with pytest.raises(WorkloadError) as error:
        read_jsonl(path, TARGET)
    assert (error.value.path, error.value.line, error.value.field) == (str(path), 3, "output_ids")
    assert str(error.value).startswith(f"{path}:3: output_ids:")
    path.write_text(json.dumps({"id": "c", "workload": "chat", "output_ids": [3]}) + "\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=r":1: messages: give exactly one of messages or prompt_ids"):
        read_jsonl(path, TARGET)


def test_held_out_examples_are_chosen_by_id_alone() -> None:
    chosen = {f"e{i}": held_out_by_id(f"e{i}", 0.2) for i in range(400)}
    share = sum(chosen.values()) / len(chosen)
    assert 0.1 < share < 0.3  # about the share asked for
    assert chosen == {f"e{i}": held_out_by_id(f"e{i}", 0.2) for i in reversed(range(400))}  # order-free


@pytest.mark.timeout(600)
def test_the_train_drafter_flow_writes_the_head_card_curve_and_row_and_resumes(
    prefect_harness: None, home: Path, tmp_path: Path
) -> None:
    from flows.train_drafter import TrainRequest, train_drafter_flow
    from specgauge.settings import get_settings

    raw = get_settings().raw_dir
    capture = _capture(raw)
    data = _jsonl(tmp_path / "traces.jsonl", TRAINING_ROWS)
    kwargs = {
        "target": str(TARGET),
        "parent": str(PARENT),
        "captures": [str(capture)],
        "jsonl": [str(data)],
        "steps": 3,
        "batch_tokens": 2048,
        "eval_every": 2,
        "held_out_share": 0.3,
    }
    first = train_drafter_flow(TrainRequest(**kwargs))
    path = Path(first["path"])
    assert not first["reused"] and path.parent == layout.drafters_dir(raw)
    assert {p.name for p in path.iterdir()} >= {
        "card.json",
        "curve.parquet",
        "data.parquet",
        "head",
        "train.log",
    }

    # the head: loadable by vLLM's EAGLE-3 rules for this target, hashed as deployments hash it
    head = path / "head"
    check_eagle3_head(TARGET, head)
    card = json.loads((path / "card.json").read_text())
    assert card["head_sha256"] == drafter_digest(head)
    assert card["parent_sha256"] == drafter_digest(PARENT) and card["mode"] == "finetune"
    assert card["target_sha256"] == drafter_digest(TARGET)
    assert (
        card["aux_layers"]
        == json.loads((PARENT / "config.json").read_text())["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"
        ]
    )
    # what went in: 3 captured + 7 JSONL examples, split by id hash, counted per side and stratum
    examples = pl.read_parquet(path / "data.parquet")
    assert examples.height == 10
    assert examples["held_out"].to_list() == [held_out_by_id(i, 0.3) for i in examples["example_id"]]
    side = card["data"]["train"]
    assert side["examples"] == int((~examples["held_out"]).sum())
    assert sum(side["strata"].values()) == side["examples"]
    assert side["output_tokens"] == sum(
        len(o) for o, h in zip(examples["output_ids"], examples["held_out"], strict=True) if not h
    )
    assert set(examples["source"]) >= {"capture:plain.r1", "traces.jsonl:7"}
    assert card["data"]["files"][str(data)] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert card["hyperparameters"]["steps"] == 3
    # the curve: the starting head, then each step's loss; the held-out check at steps 2 and 3
    curve = pl.read_parquet(path / "curve.parquet")
    assert curve["step"].to_list() == [-1, 0, 1, 2]
    assert curve["loss"].drop_nulls().len() == 3 and all(v > 0 for v in curve["loss"].drop_nulls())
    assert curve.filter(pl.col("held_out_mal").is_not_null())["step"].to_list() == [-1, 1, 2]
    assert card["losses"]["initial_held_out_mal"] == curve["held_out_mal"][0] >= 1.0
    # the warehouse row
    assert first["ingest"] == "inserted"
    con = duckdb.connect(str(get_settings().warehouse_path), read_only=True)
    try:
        row = con.execute(
            "SELECT drafter_id, parent_sha256, head_sha256, train_examples, curve_points, steps FROM drafters"
        ).fetchall()
    finally:
        con.close()
    assert row == [(path.name, card["parent_sha256"], card["head_sha256"], side["examples"], 4, 3)]

    # resume: the same inputs find the finished artifact; nothing is trained or written again
    mtime = (path / "card.json").stat().st_mtime_ns
    second = train_drafter_flow(TrainRequest(**kwargs))
    assert second["reused"] and second["drafter_id"] == first["drafter_id"]
    assert (path / "card.json").stat().st_mtime_ns == mtime
    assert second["ingest"] == "skipped"
    # another hyperparameter, parent or data set is another drafter
    card_hp = Hyperparameters(**card["hyperparameters"])
    same = inputs_digest(
        card["target_sha256"], card["parent_sha256"], card["data"]["sha256"], card["aux_layers"], card_hp
    )
    assert same == card["inputs_sha256"] and path.name == f"dr-{same[:12]}"
    for changed in (
        inputs_digest(
            card["target_sha256"],
            card["parent_sha256"],
            card["data"]["sha256"],
            card["aux_layers"],
            replace(card_hp, steps=2),
        ),
        inputs_digest(card["target_sha256"], None, card["data"]["sha256"], card["aux_layers"], card_hp),
        inputs_digest(card["target_sha256"], card["parent_sha256"], "0" * 64, card["aux_layers"], card_hp),
    ):
        assert changed != same


def test_the_cli_refuses_bad_training_input_before_training(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.app import app

    bad = _jsonl(tmp_path / "bad.jsonl", [{"id": "a", "workload": "chat", "prompt_ids": [1], "output": ""}])
    result = CliRunner().invoke(app, ["drafters", "train", "--jsonl", str(bad), "--no-ingest"])
    assert result.exit_code == 2, result.output
    assert f"{bad}:1: output: required" in result.output
    result = CliRunner().invoke(app, ["drafters", "train"])
    assert result.exit_code == 2 and "no training data" in result.output
    with pytest.raises(InputError, match="steps"):
        Hyperparameters(steps=0)


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_a_worker_op_runs_as_a_slurm_job_like_the_local_run(tmp_path: Path) -> None:
    from stand_ins.cluster import ENGINE_PYTHON, ensure_services

    from specgauge.errors import LaunchError
    from tasks.drafters.cluster_job import run_job
    from tasks.drafters.training_data import WORKER, run_worker
    from tasks.launch.config import ClusterConfig
    from tasks.launch.ssh import LocalShell

    ensure_services("slurm")
    cluster = ClusterConfig(name="test", partition="debug", remote_dir=str(tmp_path / "cluster"), poll_s=0.5)
    request = {
        "op": "hidden_states",
        "target": str(TARGET),
        "aux_layers": [1, 3, 5],
        "sequences": [[2, 10, 11, 12, 4, 3, 20, 21], [2, 30, 31]],
        "out": str(tmp_path / "job.safetensors"),
    }
    answer = run_job(LocalShell(), cluster, request, python=str(ENGINE_PYTHON), worker=str(WORKER))
    assert answer["sequences"] == 2
    run_worker({**request, "out": str(tmp_path / "local.safetensors")})
    assert (tmp_path / "job.safetensors").read_bytes() == (tmp_path / "local.safetensors").read_bytes()
    with pytest.raises(LaunchError, match=r"gave no answer[\s\S]*aux layers \[1, 9\]"):
        run_job(
            LocalShell(),
            cluster,
            {**request, "aux_layers": [1, 9]},
            python=str(ENGINE_PYTHON),
            worker=str(WORKER),
        )
