"""The train-drafter flow: served traffic -> training set (with the target's hidden states) -> a new or
fine-tuned EAGLE-3 head as an immutable drafter artifact (RAW/drafters/<drafter_id>/) -> the warehouse's
`drafters` table.

Thin: tasks.drafters.training_data reads the sources, tasks.drafters.training trains through the torch
worker and writes the artifact. Resume: the drafter id hashes every input, so a re-run with the same
inputs finds the finished artifact and reuses it (the campaign flow's rule); an interrupted run left only a
temporary folder. Retries: only transient failures (flows.retry), never bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from flows.retry import is_transient
from tasks.drafters.training import Hyperparameters, TrainedDrafter
from tasks.drafters.training_data import Example


@task(name="training-data", cache_policy=NO_CACHE, retries=1, retry_condition_fn=is_transient)
def training_data_task(captures: list[str], jsonl: list[str], target: str) -> list[Example]:
    from tasks.drafters.training_data import read_sources

    examples = read_sources(captures=captures, jsonl=jsonl, target_dir=Path(target))
    get_run_logger().info(
        "%d examples from %d capture source(s), %d JSONL file(s)", len(examples), len(captures), len(jsonl)
    )
    return examples


@task(name="train-head", cache_policy=NO_CACHE, retries=1, retry_condition_fn=is_transient)
def train_task(
    examples: list[Example],
    target: str,
    parent: str | None,
    aux_layers: list[int] | None,
    hp: Hyperparameters,
    device: str,
    files: dict[str, str],
    command: str | None,
    cluster: str | None,
    cluster_python: str,
) -> TrainedDrafter:
    from specgauge.settings import get_settings
    from tasks.drafters.training import train_drafter

    settings = get_settings()
    runner = _cluster_runner(cluster, cluster_python) if cluster else None
    trained = train_drafter(
        examples,
        target_dir=Path(target),
        parent_dir=Path(parent) if parent else None,
        hp=hp,
        raw_dir=settings.raw_dir,
        cache_dir=settings.home / "cache" / "drafters",
        aux_layers=aux_layers,
        device=device,
        files=files,
        command=command,
        runner=runner,
        runner_name=f"slurm:{cluster}" if cluster else "local",
    )
    losses = trained.card.losses
    get_run_logger().info(
        "%s %s: held-out simulated acceptance length %s -> %s (kept step %d)",
        trained.card.drafter_id,
        "reused" if trained.reused else "trained",
        losses.initial_held_out_mal,
        losses.kept_held_out_mal,
        losses.kept_step,
    )
    return trained


def _cluster_runner(cluster: str, python: str):
    """Each worker op as a SLURM job on the cluster a saved SlurmClusterBlock names (over its SSH block,
    or on the login node)."""
    from blocks import SavedBlocks
    from tasks.drafters.cluster_job import slurm_runner
    from tasks.drafters.training_data import WORKER
    from tasks.launch.cluster import open_shell

    saved = SavedBlocks()
    config = saved.cluster(cluster)
    shell = open_shell(saved.ssh(config.ssh_block) if config.ssh_block else None)
    return slurm_runner(shell, config, python=python, worker=str(WORKER))


@task(name="ingest-drafter", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[5, 20])
def ingest_task(path: str, db: str | None) -> str:
    from flows.ingest import ingest_drafter

    return ingest_drafter(Path(path), db)


HYPERPARAMETERS = ("steps", "lr", "batch_tokens", "eval_every", "held_out_share", "seed")
"""The request's fields that are the trainer's settings (Hyperparameters' names)."""


class TrainRequest(BaseModel):
    """What to train: the run form of the `train-drafter` deployment (each field's description is its help).
    The ranges are `specgauge drafters train`'s; the trainer refuses the rest (Hyperparameters)."""

    target: str = Field(
        default="models/tiny-target",
        description="The target model folder (its weights give the hidden states offline).",
    )
    parent: str | None = Field(
        default="models/tiny-eagle3",
        description="The head to fine-tune. Empty: train a new head (then give aux_layers).",
    )
    captures: list[str] | None = Field(
        default=None,
        description="Greedy captures to learn from: capture folders (RAW/<campaign>/captures/<id>) or "
        "campaigns (their folder or id: every capture in them).",
    )
    jsonl: list[str] | None = Field(
        default=None,
        description='JSONL files of prompts and the target\'s outputs (models/README.md "Training data").',
    )
    aux_layers: list[int] | None = Field(
        default=None, description="The new head's aux layer ids (vLLM numbering). Empty: the parent's."
    )
    steps: int = Field(default=200, ge=1, le=10_000_000, description="Training steps.")
    lr: float = Field(default=3e-4, ge=0.0, le=1.0, description="Peak learning rate (warm-up, then cosine).")
    batch_tokens: int = Field(default=32_768, ge=1, le=1 << 24, description="Padded tokens per batch.")
    eval_every: int = Field(
        default=25, ge=1, description="Held-out check every N steps; the best checked step is kept."
    )
    held_out_share: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Share of examples held out of training for that check (by id hash).",
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Seed of batch order and initialisation.")
    device: str = Field(
        default="cpu",
        description="Where the torch worker trains: cpu, or cuda where the worker's machine has a GPU.",
    )
    cluster: str | None = Field(
        default=None,
        description="A saved SlurmClusterBlock: run the worker's ops (hidden states, training) as batch jobs "
        "there instead of locally (paths on a filesystem the nodes see). Empty: locally.",
    )
    cluster_python: str = Field(
        default="python3",
        description="The Python with torch, transformers and safetensors on the cluster's nodes.",
    )
    ingest: bool = Field(default=True, description="Write the drafter's row into the warehouse afterwards.")
    db: str | None = Field(default=None, description="Another warehouse file. Empty: the default.")

    def hyperparameters(self) -> Hyperparameters:
        """The trainer's settings; refuses what it cannot train with (InputError)."""
        return Hyperparameters(**self.model_dump(include=set(HYPERPARAMETERS)))


@flow(name="train-drafter", log_prints=True)
def train_drafter_flow(request: TrainRequest | None = None) -> dict[str, Any]:
    """Train or fine-tune an EAGLE-3 head on served traffic; write it as a drafter artifact and its row."""
    from specgauge.flow_paths import flow_path, flow_paths, input_roots
    from tasks.drafters.training_data import source_files

    request = request or TrainRequest()
    # From a deployment: inputs only under the repo, SPECGAUGE_HOME or SPECGAUGE_SPEC_DIRS; the warehouse
    # only under SPECGAUGE_HOME (specgauge.flow_paths).
    for name, value in (("target", request.target), ("parent", request.parent)):
        flow_path(value, name, input_roots())
    flow_paths(request.captures, "captures", input_roots())
    flow_paths(request.jsonl, "jsonl", input_roots())
    flow_path(request.db, "db")
    hp = request.hyperparameters()
    captures, jsonl = list(request.captures or []), list(request.jsonl or [])
    files = source_files(captures=captures, jsonl=jsonl)
    examples = training_data_task(captures, jsonl, request.target)
    trained = train_task(
        examples,
        request.target,
        request.parent,
        request.aux_layers,
        hp,
        request.device,
        files,
        _command(request, hp),
        request.cluster,
        request.cluster_python,
    )
    result: dict[str, Any] = {
        "drafter_id": trained.card.drafter_id,
        "path": str(trained.path),
        "head": str(trained.head_dir),
        "reused": trained.reused,
        "card": trained.card.as_written(),
    }
    if request.ingest:
        result["ingest"] = ingest_task(str(trained.path), request.db)
    return result


def _command(request: TrainRequest, hp: Hyperparameters) -> str:
    """The CLI line that re-runs this training (recorded on the card)."""
    import shlex

    argv = ["specgauge", "drafters", "train", "--target", request.target]
    argv += ["--parent", request.parent] if request.parent else ["--scratch"]
    for c in request.captures or []:
        argv += ["--captures", c]
    for j in request.jsonl or []:
        argv += ["--jsonl", j]
    if request.aux_layers:
        argv += ["--aux-layers", ",".join(map(str, request.aux_layers))]
    argv += ["--steps", str(hp.steps), "--lr", str(hp.lr), "--batch-tokens", str(hp.batch_tokens)]
    argv += ["--eval-every", str(hp.eval_every), "--held-out-share", str(hp.held_out_share)]
    argv += ["--seed", str(hp.seed), "--device", request.device]
    return shlex.join(argv)
