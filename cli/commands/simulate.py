"""`specgauge simulate RAW_CAMPAIGN_DIR`: replay a campaign's greedy captures offline (analysis/simulate).

A thin shell: it reads the captures, validates the simulator against the served counters and projects the
shapes asked for; its errors (no captures, an unknown shape, no Python with torch for the model
drafters) go to the CLI's one error boundary (exit 2). No Prefect on this path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.tables import titled_table

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
        "engine's venv, one process for the whole run); their answers are cached under "
        "SPECGAUGE_HOME/cache/simulate.",
        "Cost: when the warehouse holds the campaign's measured cells, a step-time model is fitted on them "
        "(plain's TPOT per load, each served chain's TPOT x tokens per step at its verified width) and each "
        "shape gets a projected TPOT, throughput and speedup at every closed-loop load of the campaign. The "
        "served chains of the campaign are always simulated too (the fit needs them).",
        "--store (default: when the warehouse holds the campaign's cells): write the tree_sim, tree_sim_runs "
        "and tree_sim_validation tables (re-running the same settings replaces that simulation's rows), then "
        "re-render the campaign's report (--no-report to skip; `specgauge analyze CAMPAIGN` also refreshes "
        'it) so that it shows the section "Trees and drafter combinations (offline)". --no-store: print only.',
        "Exit 0: done; 1: a validated configuration missed the 5% target; 2: an error.",
    ]
)


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, list):
        return " / ".join(f"{v:.2f}" for v in value)
    return str(value)


def validation_table(frame: pl.DataFrame) -> Table:
    table = titled_table(
        "simulated vs served (chain of the served k, the capture's own requests)",
        ("capture", "k", "drafts s/v", "accepted s/v", "MAL served", "MAL simulated", "rel. error"),
        left=("capture",),
    )
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
    table = titled_table(
        f"projections on the outputs of {capture_id}",
        ("shape", "stratum", "drafts", "MAL", "tokens/step", "verified/step"),
        left=("shape", "stratum"),
    )
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


def cost_table(frame: pl.DataFrame) -> Table:
    columns = (
        "shape",
        "stratum",
        "load",
        "verified/step",
        "step ms",
        "TPOT ms",
        "tok/s",
        "speedup",
        "measured",
    )
    # fold, not cut: a shape's name is what the row is about
    table = titled_table(
        "projected at the campaign's loads (cost model)",
        columns,
        left=("shape", "stratum", "load"),
        overflow="fold",
    )
    for row in frame.iter_rows(named=True):
        ms = [None if row[c] is None else row[c] * 1000 for c in ("projected_step_s", "projected_tpot_s")]
        table.add_row(
            row["shape"],
            row["stratum"],
            row["load_label"],
            _fmt(row["verified_tokens_per_step"], 1),
            _fmt(ms[0], 2),
            _fmt(ms[1], 2),
            _fmt(row["projected_throughput_tok_s"], 1),
            _fmt(row["projected_speedup"]),
            _fmt(row["measured_speedup"]),
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
            max=4096,  # tokens generated offline per output: a bound on the run's time and memory
            help="Tokens of the target's own continuation past each output (offline), for the last step's "
            "drafts; 0: count them as rejected.",
        ),
    ] = 8,
    dtype: Annotated[
        str, typer.Option("--dtype", help="Model drafters' dtype: bfloat16 (as served) or float32.")
    ] = "bfloat16",
    store: Annotated[
        bool | None,
        typer.Option(
            "--store/--no-store",
            help="Write the tree_sim tables (default: when the warehouse holds the campaign's cells).",
        ),
    ] = None,
    report: Annotated[
        bool, typer.Option("--report/--no-report", help="After storing, re-render the campaign's report.")
    ] = True,
) -> None:
    from analysis.simulate.shapes import ShapeError
    from analysis.simulate.whole_campaign import simulate_campaign

    if not validate and not shapes:
        raise ShapeError("nothing to do: pass --shapes, or leave --validate on")
    chosen = [p.strip() for p in proposers.split(",") if p.strip()] if proposers else None
    result = simulate_campaign(
        campaign,
        shapes,
        proposers=chosen,
        outputs=outputs,
        tail=tail,
        dtype=dtype,
        validate=validate,
        store=store,
        on_warning=lambda m: err_console.print(f"warning: {m}", markup=False, highlight=False),
    )
    if validate:
        if result.validation.is_empty():
            err_console.print("no speculative capture with counters to validate against", markup=False)
        else:
            console.print(validation_table(result.validation))
    if shapes:
        console.print(projection_table(result.replays, result.outputs_capture))
    if not result.projections.is_empty():
        console.print(cost_table(result.projections))
    if result.cost:
        console.print(f"cost model: {result.cost.describe()}", markup=False)
    for note in result.notes:
        err_console.print(f"note: {note}", markup=False, highlight=False)
    if result.rows:
        console.print(
            f"stored simulation {result.simulation_id}: "
            + ", ".join(f"{table} {n}" for table, n in result.rows.items()),
            markup=False,
        )
        if report:
            from analysis.run import analyze_campaign

            analysis = analyze_campaign(result.campaign_id)
            console.print(f"report: {analysis.report}", markup=False)
    if result.missed_target:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command("simulate", help=SIMULATE_HELP)(simulate)
