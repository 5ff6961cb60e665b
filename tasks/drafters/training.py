"""Train a new EAGLE-3 head, or fine-tune one, on a training set from served traffic, into an immutable
drafter artifact RAW/drafters/<drafter_id>/ (artifacts.layout): head/ (what vLLM loads), card.json
(artifacts.documents.DrafterCard: parent and target hashes, data hashes/counts/strata, hyperparameters,
losses, the head's hash), curve.parquet (CURVE_SCHEMA) and data.parquet (the examples that went in).

The trainer is models/train_eagle3.py's (its head, its training-time-test objective, its held-out check),
run by tasks/drafters/head_worker.py under a Python with torch; the target's states come from the training
set (tasks.drafters.training_data), computed once and cached under SPECGAUGE_HOME/cache/drafters/.

The drafter id hashes the inputs (target, parent, data, hyperparameters): a second run with the same
inputs finds the finished artifact and reuses it; an interrupted run leaves only a temporary folder,
which the next run replaces.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from artifacts import ids, layout
from artifacts.documents import CURVE_SCHEMA, DrafterCard
from artifacts.store import atomic_dir, read_document, write_json
from specgauge.checkpoints import drafter_digest
from specgauge.errors import InputError
from tasks.drafters.cluster_job import Runner
from tasks.drafters.contract import check_eagle3_head
from tasks.drafters.training_data import (
    Example,
    assemble,
    compute_hidden_states,
    data_summary,
    examples_frame,
    run_worker,
)


@dataclass(frozen=True)
class Hyperparameters:
    """The trainer's settings (models/train_eagle3.py's names). Defaults: a short fine-tune."""

    steps: int = 200
    lr: float = 3e-4
    batch_tokens: int = 32_768  # padded tokens per batch
    ttt_steps: int = 3  # draft steps unrolled in training (training-time test)
    step_decay: float = 0.8  # loss weight of draft step j: decay**j
    prompt_weight: float = 0.1  # loss weight of predictions inside the prompt
    eval_every: int = 25  # held-out check every N steps; the best checked step is kept
    seed: int = 0
    held_out_share: float = 0.1  # examples held out of training (by id hash) for the check
    max_tokens: int = 2048  # prompt + output, cut to the target's context

    def __post_init__(self) -> None:
        for name in ("steps", "batch_tokens", "ttt_steps", "eval_every", "max_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"hyperparameter {name}: must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise InputError(f"hyperparameter lr: must be > 0, got {self.lr}")


@dataclass(frozen=True)
class TrainedDrafter:
    path: Path  # RAW/drafters/<drafter_id>
    card: DrafterCard
    reused: bool  # found finished, not trained again

    @property
    def head_dir(self) -> Path:
        return self.path / layout.HEAD


def aux_layers_of(head_dir: Path) -> list[int]:
    config = json.loads((Path(head_dir) / "config.json").read_text(encoding="utf-8"))
    layers = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not layers:
        raise InputError(f"{head_dir}/config.json: eagle_config.eagle_aux_hidden_state_layer_ids: missing")
    return sorted(int(i) for i in layers)


def inputs_digest(
    target_sha: str, parent_sha: str | None, data_sha: str, aux_layers: list[int], hp: Hyperparameters
) -> str:
    body = {"target": target_sha, "parent": parent_sha, "data": data_sha, "aux": aux_layers, "hp": asdict(hp)}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def curve_frame(curve: list[dict[str, Any]]) -> pl.DataFrame:
    rows = []
    for entry in curve:
        held = entry.get("held_out") or {}
        rows.append(
            {
                "step": entry["step"],
                "loss": entry.get("loss"),
                "lr": entry.get("lr"),
                "seconds": entry.get("seconds"),
                "held_out_mal": held.get("simulated_acceptance_length_all"),
                "held_out_top1": held.get("top1_per_step"),
                "held_out_soft_ce": held.get("answer_soft_ce"),
            }
        )
    return pl.DataFrame(rows, schema=CURVE_SCHEMA)


def load_drafter(path: Path) -> TrainedDrafter:
    card = read_document(Path(path) / layout.CARD, DrafterCard)
    assert isinstance(card, DrafterCard)
    return TrainedDrafter(Path(path), card, reused=True)


def _pad_id(target_dir: Path) -> int:
    config = json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8"))
    pad = config.get("pad_token_id")
    return int(pad if pad is not None else config.get("eos_token_id") or 0)


def train_drafter(
    examples: list[Example],
    *,
    target_dir: Path,
    parent_dir: Path | None,
    hp: Hyperparameters,
    raw_dir: Path,
    cache_dir: Path,
    aux_layers: list[int] | None = None,
    device: str = "cpu",
    files: dict[str, str] | None = None,
    command: str | None = None,
    runner: Runner | None = None,
    runner_name: str = "local",
) -> TrainedDrafter:
    """Train (parent_dir None: a new head with the target's vocabulary and `aux_layers`) or fine-tune
    `parent_dir` on `examples`; write the drafter artifact, or return the one these inputs already made.
    The worker's ops run locally, or through `runner` (`runner_name` on the card: e.g. a SLURM job,
    tasks.drafters.cluster_job)."""
    target_dir = Path(target_dir).resolve()
    if parent_dir is not None:
        parent_dir = Path(parent_dir).resolve()
        check_eagle3_head(target_dir, parent_dir)
        aux_layers = aux_layers_of(parent_dir)
    if not aux_layers:
        raise InputError("a new head needs its aux layers (e.g. 1,3,5); a fine-tune takes its parent's")
    chosen = assemble(examples, held_out_share=hp.held_out_share, max_tokens=hp.max_tokens)
    summary = data_summary(chosen)
    if summary["train"]["examples"] == 0:
        raise InputError(
            "no training examples left after holding some out: give more, or lower held_out_share"
        )
    target_sha = drafter_digest(target_dir)
    parent_sha = drafter_digest(parent_dir) if parent_dir else None
    digest = inputs_digest(target_sha, parent_sha, summary["sha256"], aux_layers, hp)
    drafter = ids.drafter_id(digest)
    final = layout.drafter_dir(raw_dir, drafter)
    if layout.drafter_complete(final):
        return load_drafter(final)
    states = (
        Path(cache_dir)
        / f"{summary['sha256'][:16]}-{target_sha[:12]}-{'_'.join(map(str, aux_layers))}.safetensors"
    )
    if not states.is_file():
        partial = states.with_name(f".{states.name}.partial")
        compute_hidden_states(chosen, target_dir, aux_layers, partial, device=device, runner=runner)
        partial.replace(states)
    started = time.time()
    with atomic_dir(final) as tmp:
        examples_frame(chosen).write_parquet(tmp / layout.DATA)
        request = {
            "op": "train",
            "target": str(target_dir),
            "parent": str(parent_dir) if parent_dir else None,
            "aux_layers": aux_layers,
            "states": str(states),
            "examples": [
                {
                    "ids": list(e.prompt_ids) + list(e.output_ids),
                    "prompt_len": len(e.prompt_ids),
                    "stratum": e.stratum,
                    "held_out": e.held_out,
                }
                for e in chosen
            ],
            "pad": _pad_id(target_dir),
            "hyperparameters": asdict(hp),
            "out": str(tmp / layout.HEAD),
            "device": device,
        }
        answer = runner(request) if runner else run_worker(request, log=tmp / layout.TRAIN_LOG)
        check_eagle3_head(target_dir, tmp / layout.HEAD)
        curve = answer["curve"]
        losses = [c["loss"] for c in curve if c.get("loss") is not None]
        initial, kept = answer.get("held_out_initial") or {}, answer.get("held_out_kept") or {}
        card = DrafterCard.model_validate(
            {
                "drafter_id": drafter,
                "created_utc": datetime.now(UTC).isoformat(),
                "method": "eagle3",
                "mode": "finetune" if parent_dir else "scratch",
                "target_path": str(target_dir),
                "target_sha256": target_sha,
                "parent_path": str(parent_dir) if parent_dir else None,
                "parent_sha256": parent_sha,
                "aux_layers": aux_layers,
                "data": {**summary, "files": files or {}},
                "hyperparameters": asdict(hp),
                "inputs_sha256": digest,
                "head_sha256": drafter_digest(tmp / layout.HEAD),
                "losses": {
                    "kept_step": answer["kept_step"],
                    "final_train_loss": losses[-1] if losses else None,
                    "initial_held_out_mal": initial.get("simulated_acceptance_length_all"),
                    "kept_held_out_mal": kept.get("simulated_acceptance_length_all"),
                    "initial_held_out": initial or None,
                    "kept_held_out": kept or None,
                },
                "runner": runner_name,
                "device": answer.get("device"),
                "torch_version": answer.get("torch"),
                "train_seconds": round(time.time() - started, 1),
                "command": command,
            }
        )
        curve_frame(curve).write_parquet(tmp / layout.CURVE)
        write_json(tmp / layout.CARD, card.as_written())
    return TrainedDrafter(final, card, reused=False)


def command_line(argv: list[str]) -> str:
    return shlex.join(argv)
