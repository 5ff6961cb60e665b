"""`specgauge drafters train`: the train-drafter flow (flows/train_drafter.py), registered in the
`drafters` group (cli/commands/drafters.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console(soft_wrap=True)

TRAIN_HELP = "\n\n".join(
    [
        "Train a new EAGLE-3 head, or fine-tune one, on served traffic: the target's greedy outputs from "
        "captures (--captures: a capture folder, or a campaign whose captures to use) and/or a JSONL of "
        "prompts and the target's outputs (--jsonl; one object a line: id, workload, messages or prompt_ids, "
        "output_ids or output). The target's hidden states at the head's aux layers are computed offline from "
        "its weights (a Python with torch: the engine's venv), then the head trains with "
        "models/train_eagle3.py's objective; the best held-out step is kept.",
        "Writes SPECGAUGE_HOME/raw/drafters/<drafter_id>/ (head/ for vLLM, card.json, curve.parquet, "
        "data.parquet) and its row in the warehouse's `drafters` table. The id hashes every input: the same "
        "inputs again reuse the finished artifact.",
        "Exit 0: done (prints the drafter id, the head's folder and the held-out check); 2: refused input "
        "(a bad JSONL line is named FILE:LINE: field).",
    ]
)


def train(
    target: Annotated[str, typer.Option("--target", help="The target model folder.")] = "models/tiny-target",
    parent: Annotated[str, typer.Option("--parent", help="The head to fine-tune.")] = "models/tiny-eagle3",
    scratch: Annotated[
        bool, typer.Option("--scratch", help="Train a new head instead (give --aux-layers).")
    ] = False,
    captures: Annotated[
        list[str] | None, typer.Option("--captures", help="A capture folder or a campaign (repeatable).")
    ] = None,
    jsonl: Annotated[
        list[str] | None, typer.Option("--jsonl", help="Prompts and the target's outputs (repeatable).")
    ] = None,
    aux_layers: Annotated[
        str | None, typer.Option("--aux-layers", help="A new head's aux layer ids, e.g. 1,3,5.")
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Training steps.", min=1, max=10_000_000)] = 200,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.", min=0.0, max=1.0)] = 3e-4,
    batch_tokens: Annotated[
        int, typer.Option("--batch-tokens", help="Padded tokens per batch.", min=1, max=1 << 24)
    ] = 32_768,
    eval_every: Annotated[
        int, typer.Option("--eval-every", help="Held-out check every N steps.", min=1)
    ] = 25,
    held_out_share: Annotated[
        float,
        typer.Option(
            "--held-out-share",
            help="Share of examples held out for the check.",
            min=0.0,
            max=1.0,
        ),
    ] = 0.1,
    seed: Annotated[int, typer.Option("--seed", help="Seed.", min=0, max=2**32 - 1)] = 0,
    device: Annotated[str, typer.Option("--device", help="cpu, or cuda where there is a GPU.")] = "cpu",
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="A saved SlurmClusterBlock: train there as batch jobs (sbatch)."),
    ] = None,
    cluster_python: Annotated[
        str, typer.Option("--cluster-python", help="The nodes' Python with torch and transformers.")
    ] = "python3",
    ingest: Annotated[bool, typer.Option("--ingest/--no-ingest", help="Write the warehouse row.")] = True,
) -> None:
    from cli.commands.campaign import _listed
    from specgauge.errors import InputError

    layers = _listed(aux_layers, "--aux-layers", int)
    if scratch and not layers:
        raise InputError("--scratch: a new head needs --aux-layers (e.g. 1,3,5)")
    from flows.train_drafter import TrainRequest, train_drafter_flow

    request = TrainRequest(
        target=target,
        parent=None if scratch else parent,
        captures=captures,
        jsonl=jsonl,
        aux_layers=layers,
        steps=steps,
        lr=lr,
        batch_tokens=batch_tokens,
        eval_every=eval_every,
        held_out_share=held_out_share,
        seed=seed,
        device=device,
        cluster=cluster,
        cluster_python=cluster_python,
        ingest=ingest,
    )
    request.hyperparameters()  # refused early
    if not captures and not jsonl:
        raise InputError("no training data: give --captures and/or --jsonl")
    from tasks.drafters.training_data import capture_dirs_of, parse_jsonl

    for path in jsonl or []:  # bad lines and missing sources are refused before Prefect starts
        parse_jsonl(Path(path))
    for source in captures or []:
        capture_dirs_of(source)
    result = train_drafter_flow(request)
    card = result["card"]
    losses = card["losses"]
    data = card["data"]
    console.print(
        f"drafter {result['drafter_id']} ({'reused' if result['reused'] else 'trained'})", markup=False
    )
    console.print(f"head: {result['head']}", markup=False)
    console.print(
        f"data: {data['train']['examples']} training examples ({data['train']['output_tokens']} output tokens), "
        f"{data['held_out']['examples']} held out; strata {data['train']['strata']}",
        markup=False,
    )
    console.print(
        f"held-out simulated acceptance length: {losses.get('initial_held_out_mal')} -> "
        f"{losses.get('kept_held_out_mal')} (kept step {losses['kept_step']})",
        markup=False,
    )
    if "ingest" in result:
        console.print(f"warehouse: {result['ingest']}", markup=False)
