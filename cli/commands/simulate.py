"""`specgauge simulate RAW_CAMPAIGN_DIR`: replay a campaign's greedy captures offline (analysis/simulate).

A thin shell: it reads the captures, validates the simulator against the served counters and projects the
shapes asked for; its errors (no captures, an unknown shape, no Python with torch for the model
drafters) go to the CLI's one error boundary (exit 2). No Prefect on this path.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    import polars as pl

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

SIMULATE_HELP = "\n\n".join(
    [
        "Replay a campaign's greedy captures through speculative drafting, offline: how many tokens a "
        "chain, a tree, a graft or two drafters would have accepted on that traffic, per stratum, without "
        "launching anything. docs/simulate.md explains the replay and its limits.",
        "RAW_CAMPAIGN_DIR: a raw campaign folder (SPECGAUGE_HOME/raw/<campaign>) or a campaign id under "
        "SPECGAUGE_HOME/raw. Its captures/ give prompts and outputs; a speculative capture also gives "
        "vLLM's counters over exactly those requests.",
        "--validate (default on): for each speculative capture, the replay of its own method and k next "
        "to the served counters (mean acceptance length, per-position rates, relative error; target 5%).",
        "--shapes: projections on the outputs of the plain capture (or --outputs CAPTURE_ID). "
        "Syntax: KIND:key=value...[@PROPOSER[+PROPOSER]], comma separated. chain:k=3 (a chain of k); "
        "tree:b=2:budget=8[:depth=4] (top-b children per node filled breadth first up to budget draft "
        "tokens); graft:b=2:budget=8:k=3@eagle3+ngram (the first proposer's tree united with the second's "
        "chain of k); union:k=3@draft+eagle3 (two chains as two branches). Proposers: ngram (vLLM's "
        "prompt lookup with the campaign's min/max), suffix (approximate SuffixDecoding), draft (the "
        "campaign's draft model), eagle3 (its EAGLE-3 head). Without @, chain and tree apply to each of "
        "--proposers (default: the methods the campaign served).",
        "The draft model and EAGLE-3 run on the CPU through a Python with torch and transformers (the "
        "engine's venv); their answers are cached under SPECGAUGE_HOME/cache/simulate.",
        "Exit 0: done; 1: a validated configuration missed the 5% target; 2: an error.",
    ]
)


def _campaign_dir(text: str) -> Path:
    from specgauge.errors import InputError
    from specgauge.settings import get_settings

    path = Path(text)
    if path.is_dir():
        return path
    under_raw = get_settings().raw_dir / text
    if under_raw.is_dir():
        return under_raw
    raise InputError(f"{text}: not a raw campaign folder, nor a campaign id under {get_settings().raw_dir}")


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, list):
        return " / ".join(f"{v:.2f}" for v in value)
    return str(value)


def validation_table(frame: pl.DataFrame) -> Table:
    table = Table(
        title="simulated vs served (chain of the served k, the capture's own requests)", title_justify="left"
    )
    for name in ("capture", "k", "drafts s/v", "accepted s/v", "MAL served", "MAL simulated", "rel. error"):
        table.add_column(name, justify="left" if name == "capture" else "right")
    table.add_column("per position, served", overflow="fold")
    table.add_column("simulated", overflow="fold")
    for row in frame.iter_rows(named=True):
        error = row["relative_error"]
        mark = "" if row["within_target"] is None else (" ok" if row["within_target"] else " MISS")
        table.add_row(
            row["capture_id"] + ("" if row["exact_mirror"] else " (approx.)"),
            str(row["k"]),
            f"{row['simulated_drafts']}/{row['served_drafts']}",
            f"{row['simulated_accepted_tokens']}/{row['served_accepted_tokens']}",
            _fmt(row["served_mean_acceptance_length"]),
            _fmt(row["simulated_mean_acceptance_length"]),
            ("-" if error is None else f"{error:+.1%}") + mark,
            _fmt(row["served_per_position"]),
            _fmt(row["simulated_per_position"]),
        )
    return table


def projection_table(frame: pl.DataFrame, capture_id: str) -> Table:
    table = Table(title=f"projections on the outputs of {capture_id}", title_justify="left")
    for name in ("shape", "stratum", "drafts", "MAL", "tokens/step", "verified/step"):
        table.add_column(name, justify="left" if name in ("shape", "stratum") else "right")
    table.add_column("per position", overflow="fold")
    for row in frame.iter_rows(named=True):
        table.add_row(
            row["config"],
            row["stratum"],
            str(row["drafts"]),
            _fmt(row["mean_acceptance_length"]),
            _fmt(row["tokens_per_step"]),
            _fmt(row["verified_tokens_per_step"], 1),
            _fmt(row["acceptance_rate_per_position"]),
        )
    return table


def simulate(
    campaign: Annotated[
        str,
        typer.Argument(
            metavar="RAW_CAMPAIGN_DIR", help="Raw campaign folder, or a campaign id under SPECGAUGE_HOME/raw."
        ),
    ],
    shapes: Annotated[
        str | None, typer.Option("--shapes", help="Shapes to project, e.g. 'chain:k=3,tree:b=2:budget=8'.")
    ] = None,
    validate: Annotated[
        bool, typer.Option("--validate/--no-validate", help="Compare with the served counters.")
    ] = True,
    proposers: Annotated[
        str | None,
        typer.Option("--proposers", help="Proposers for shapes without @ (default: the campaign's methods)."),
    ] = None,
    outputs: Annotated[
        str | None,
        typer.Option("--outputs", help="Capture id whose outputs projections replay (default: plain)."),
    ] = None,
    tail: Annotated[
        int,
        typer.Option(
            "--tail",
            min=0,
            help="Tokens of the target's own continuation past each output (offline), for the last step's "
            "drafts; 0: count them as rejected.",
        ),
    ] = 8,
    dtype: Annotated[
        str, typer.Option("--dtype", help="Model drafters' dtype: bfloat16 (as served) or float32.")
    ] = "bfloat16",
) -> None:
    from analysis.simulate.captures import capture_dirs, load_capture_inputs
    from analysis.simulate.run import DrafterSettings, outputs_capture, projection_frame, simulate_shapes
    from analysis.simulate.shapes import PROPOSER_NAMES, ShapeError, parse_shapes
    from analysis.simulate.validate import PROPOSER_OF_METHOD, validate_campaign, validation_frame

    if dtype not in ("bfloat16", "float32"):
        raise ShapeError(f"--dtype {dtype!r}: bfloat16 or float32")
    if not validate and not shapes:
        raise ShapeError("nothing to do: pass --shapes, or leave --validate on")
    chosen = [p.strip() for p in proposers.split(",") if p.strip()] if proposers else None
    unknown = [p for p in chosen or () if p not in PROPOSER_NAMES]
    if unknown:
        raise ShapeError(f"--proposers: unknown {', '.join(unknown)} (known: {', '.join(PROPOSER_NAMES)})")
    if shapes:
        parse_shapes(shapes, PROPOSER_NAMES)  # a bad shape fails here, before any model runs
    inputs = load_capture_inputs(capture_dirs(_campaign_dir(campaign)), tail_tokens=tail, dtype=dtype)
    for item in inputs:
        for warning in item.warnings:
            err_console.print(f"warning: {item.capture.capture_id}: {warning}", markup=False, highlight=False)
    settings = DrafterSettings.from_campaign(inputs, dtype=dtype)
    missed = False
    if validate:
        frame = validation_frame(validate_campaign(inputs, settings))
        if frame.is_empty():
            err_console.print("no speculative capture with counters to validate against", markup=False)
        else:
            console.print(validation_table(frame))
            missed = not all(v for v in frame["within_target"].to_list() if v is not None)
    if shapes:
        served = sorted({PROPOSER_OF_METHOD[i.method] for i in inputs if i.method in PROPOSER_OF_METHOD})
        parsed = parse_shapes(shapes, chosen or served or ["ngram"])
        try:
            item = outputs_capture(inputs, outputs)
        except KeyError:
            known = ", ".join(i.capture.capture_id for i in inputs)
            raise ShapeError(f"--outputs {outputs}: no such capture (captures: {known})") from None
        frame = projection_frame(item, simulate_shapes(item, parsed, settings))
        console.print(projection_table(frame, item.capture.capture_id))
    if missed:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command("simulate", help=SIMULATE_HELP)(simulate)
