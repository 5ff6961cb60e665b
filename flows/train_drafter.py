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


@flow(name="train-drafter", log_prints=True)
def train_drafter_flow(
    target: str = "models/tiny-target",
    parent: str | None = "models/tiny-eagle3",
    captures: list[str] | None = None,
    jsonl: list[str] | None = None,
    aux_layers: list[int] | None = None,
    steps: int = 200,
    lr: float = 3e-4,
    batch_tokens: int = 32_768,
    eval_every: int = 25,
    held_out_share: float = 0.1,
    seed: int = 0,
    device: str = "cpu",
    cluster: str | None = None,
    cluster_python: str = "python3",
    ingest: bool = True,
    db: str | None = None,
) -> dict[str, Any]:
    """Train or fine-tune an EAGLE-3 head on served traffic; write it as a drafter artifact and its row.

    Args:
        target: The target model folder (its weights give the hidden states offline).
        parent: The head to fine-tune. Empty: train a new head (then give aux_layers).
        captures: Greedy captures to learn from: capture folders (RAW/<campaign>/captures/<id>) or
            campaigns (their folder or id: every capture in them).
        jsonl: JSONL files of prompts and the target's outputs (models/README.md "Training data").
        aux_layers: The new head's aux layer ids (vLLM numbering). Empty: the parent's.
        steps: Training steps.
        lr: Peak learning rate (warm-up, then cosine).
        batch_tokens: Padded tokens per batch.
        eval_every: Held-out check every N steps; the best checked step is kept.
        held_out_share: Share of examples held out of training for that check (by id hash).
        seed: Seed of batch order and initialisation.
        device: Where the torch worker trains: cpu, or cuda where the worker's machine has a GPU.
        cluster: A saved SlurmClusterBlock: run the worker's ops (hidden states, training) as batch jobs
            there instead of locally (paths on a filesystem the nodes see). Empty: locally.
        cluster_python: The Python with torch, transformers and safetensors on the cluster's nodes.
        ingest: Write the drafter's row into the warehouse afterwards.
        db: Another warehouse file. Empty: the default.
    """
    from specgauge.flow_paths import flow_path, flow_paths, input_roots
    from tasks.drafters.training_data import source_files

    # From a deployment: inputs only under the repo, SPECGAUGE_HOME or SPECGAUGE_SPEC_DIRS; the warehouse
    # only under SPECGAUGE_HOME (specgauge.flow_paths).
    for name, value in (("target", target), ("parent", parent)):
        flow_path(value, name, input_roots())
    flow_paths(captures, "captures", input_roots())
    flow_paths(jsonl, "jsonl", input_roots())
    flow_path(db, "db")
    hp = Hyperparameters(
        steps=steps,
        lr=lr,
        batch_tokens=batch_tokens,
        eval_every=eval_every,
        held_out_share=held_out_share,
        seed=seed,
    )
    captures, jsonl = list(captures or []), list(jsonl or [])
    files = source_files(captures=captures, jsonl=jsonl)
    examples = training_data_task(captures, jsonl, target)
    command = _command(target, parent, captures, jsonl, aux_layers, hp, device)
    trained = train_task(
        examples, target, parent, aux_layers, hp, device, files, command, cluster, cluster_python
    )
    result: dict[str, Any] = {
        "drafter_id": trained.card.drafter_id,
        "path": str(trained.path),
        "head": str(trained.head_dir),
        "reused": trained.reused,
        "card": trained.card.as_written(),
    }
    if ingest:
        result["ingest"] = ingest_task(str(trained.path), db)
    return result


def _command(
    target: str,
    parent: str | None,
    captures: list[str],
    jsonl: list[str],
    aux_layers: list[int] | None,
    hp: Hyperparameters,
    device: str,
) -> str:
    """The CLI line that re-runs this training (recorded on the card)."""
    import shlex

    argv = ["specgauge", "drafters", "train", "--target", target]
    argv += ["--parent", parent] if parent else ["--scratch"]
    for c in captures:
        argv += ["--captures", c]
    for j in jsonl:
        argv += ["--jsonl", j]
    if aux_layers:
        argv += ["--aux-layers", ",".join(map(str, aux_layers))]
    argv += ["--steps", str(hp.steps), "--lr", str(hp.lr), "--batch-tokens", str(hp.batch_tokens)]
    argv += ["--eval-every", str(hp.eval_every), "--held-out-share", str(hp.held_out_share)]
    argv += ["--seed", str(hp.seed), "--device", device]
    return shlex.join(argv)
