"""`specgauge gate` (judge a speculative capture against controls) and `specgauge capture compare`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from cli.tables import titled_table

if TYPE_CHECKING:
    from tasks.gate import Aggregate, Comparison, Verdict

console = Console()
err_console = Console(stderr=True)

EXIT_PASSED, EXIT_FAILED = 0, 1  # refused (bad input): 2, from the CLI's error boundary

GATE_HELP = "\n\n".join(
    [
        "Judge a speculative arm's greedy outputs against a calibrated control envelope.",
        "Form: specgauge gate TREATMENT_A TREATMENT_B --control A1 B1 [--control A2 B2 ...]",
        "TREATMENT_A is the plain capture, TREATMENT_B the speculative one (capture directories, "
        "RAW/<campaign>/captures/<id>). Each --control A B is a pair of captures of ONE configuration: one "
        "deployment captured twice (a repeat), or two separately launched deployments. At least one control "
        "must be cross-deployment.",
        "Exit 0: consistent with lossless speculation; 1: diverged beyond the envelope, or capture requests "
        "failed; 2: refused (bad or incomparable input). The decision rule is in docs/gate.md.",
    ]
)


def _parse_gate_args(tokens: list[str]) -> tuple[tuple[Path, Path], list[tuple[Path, Path]]]:
    """TREATMENT_A TREATMENT_B, then any number of `--control A B` (order kept, every problem named)."""
    from tasks.gate import GateRefusal

    treatment: list[Path] = []
    controls: list[tuple[Path, Path]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--control":
            pair = tokens[i + 1 : i + 3]
            if len(pair) < 2 or any(p.startswith("--") for p in pair):
                raise GateRefusal(f"--control needs two capture directories (A B), got {pair or 'nothing'}")
            controls.append((Path(pair[0]), Path(pair[1])))
            i += 3
            continue
        if token.startswith("-"):
            raise GateRefusal(f"unknown option {token!r} (see `specgauge gate --help`)")
        treatment.append(Path(token))
        i += 1
    if len(treatment) != 2:
        raise GateRefusal(
            f"expected two treatment captures (TREATMENT_A TREATMENT_B) before/around the --control pairs, "
            f"got {len(treatment)}: {[str(p) for p in treatment]}"
        )
    return (treatment[0], treatment[1]), controls


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _aggregate_row(label: str, agg: Aggregate) -> list[str]:
    return [
        label,
        f"{agg.exact}/{agg.n}",
        f"{agg.exact_match_rate:.1%}",
        _fmt(agg.mean_prefix_fraction),
        _fmt(agg.mean_edit_distance),
        _fmt(agg.median_first_divergence),
        _fmt(agg.median_divergence_relative),
        str(agg.failed),
    ]


def _aggregate_table(title: str) -> Table:
    columns = (
        "pair",
        "exact",
        "rate",
        "mean prefix",
        "mean edit dist",
        "med. 1st div.",
        "med. rel. div.",
        "failed",
    )
    return titled_table(title, columns, left=("pair",))


def _worst_table(comparison: Comparison) -> Table | None:
    worst = comparison.worst()
    if not worst:
        return None
    columns = ("prompt", "status", "1st div.", "prefix", "edit", "a (near divergence)", "b (near divergence)")
    table = titled_table("worst cases", columns, overflow="fold")
    for row in worst:
        table.add_row(
            row.prompt_id,
            row.status,
            _fmt(row.first_divergence),
            _fmt(row.prefix_fraction),
            _fmt(row.edit_distance),
            repr(row.excerpt_a) if row.excerpt_a is not None else (row.reason or ""),
            repr(row.excerpt_b) if row.excerpt_b is not None else "",
        )
    return table


def print_verdict(verdict: Verdict) -> None:
    t = verdict.treatment
    summary = _aggregate_table(f"{t.overall.n} prompts, sampling {t.a.sampling}")
    summary.add_row(*_aggregate_row(f"treatment: {t.a.variant_name} vs {t.b.variant_name}", t.overall))
    for label, _, c in verdict.controls:
        summary.add_row(*_aggregate_row(f"{label}: {c.a.capture_id} vs {c.b.capture_id}", c.overall))
    console.print(summary)

    strata = _aggregate_table("per stratum (treatment and controls)")
    for stratum, agg in t.per_stratum.items():
        strata.add_row(*_aggregate_row(f"{stratum}: treatment", agg))
        for label, _, c in verdict.controls:
            strata.add_row(*_aggregate_row(f"{stratum}: {label}", c.per_stratum[stratum]))
    console.print(strata)

    checks = Table(
        title="checks (paired one-sided tests, against the most divergent control)", title_justify="left"
    )
    for name in (
        "check",
        "treatment",
        "control",
        "threshold",
        "margin",
        "worse/better",
        "p",
        "alpha",
        "against",
        "passed",
    ):
        checks.add_column(name)
    for check in verdict.checks:
        checks.add_row(
            check.name,
            _fmt(check.value),
            _fmt(check.control_value),
            _fmt(check.threshold),
            _fmt(check.margin),
            "-" if check.worse is None else f"{check.worse}/{check.better}",
            _fmt(check.p_value),
            _fmt(check.alpha),
            check.against or "-",
            "[green]yes[/green]" if check.passed else "[red]no[/red]",
        )
    console.print(checks)
    if (worst := _worst_table(t)) is not None:
        console.print(worst)
    for note in verdict.notes:
        console.print(f"note: {note}", markup=False)
    style = "green" if verdict.passed else "red"
    console.print(
        Panel(verdict.claim, title=f"{verdict.treatment_variant}: {verdict.outcome}", border_style=style)
    )


def gate_command(
    captures: Annotated[
        list[str],
        typer.Argument(
            metavar="CAPTURES",
            help="The plain and the speculative capture directories, then one `--control A B` per control pair.",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the verdict JSON to this file.")
    ] = None,
    store: Annotated[
        bool,
        typer.Option(
            "--store",
            help="Also store the verdict as the immutable raw artifact RAW/<campaign>/gates/<verdict_id>.json, "
            "beside the treatment's captures (else under SPECGAUGE_HOME's raw folder).",
        ),
    ] = False,
    alpha: Annotated[
        float,
        typer.Option(
            help="Family-wise significance level, split over the checks (Bonferroni).",
            min=0.0,
            max=1.0,
        ),
    ] = 0.05,
    min_prompts: Annotated[
        int,
        typer.Option(help="Refuse captures with fewer prompts than this (the checks lack power).", min=1),
    ] = 32,
    force: Annotated[bool, typer.Option("--force", help="Judge even with fewer than --min-prompts.")] = False,
) -> None:
    from artifacts import layout
    from artifacts.store import write_json
    from specgauge.errors import ArtifactError
    from specgauge.settings import get_settings
    from tasks.gate import gate, write_verdict

    # A refusal (bad or incomparable input, a missing capture) goes to the CLI's error boundary: exit 2.
    treatment, controls = _parse_gate_args(captures)
    verdict = gate(treatment, controls, alpha=alpha, min_prompts=min_prompts, force=force)
    print_verdict(verdict)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_json(output, verdict.to_json())
        console.print(f"verdict written to {output}", markup=False)
    if store:
        captures_dir = verdict.treatment.b.path.resolve().parent
        campaign_dir = (
            captures_dir.parent  # beside the captures it judges: RAW/<campaign>/captures/<id>
            if captures_dir == layout.captures_dir(captures_dir.parent)
            and captures_dir.parent.name == verdict.campaign_id
            else get_settings().raw_dir / verdict.campaign_id
        )
        try:
            path = write_verdict(verdict, campaign_dir)
        except ArtifactError as exc:
            err_console.print(f"not stored: {exc}", markup=False)
        else:
            console.print(f"verdict stored as {path}", markup=False)
    raise typer.Exit(code=EXIT_PASSED if verdict.passed else EXIT_FAILED)


def compare_command(
    a: Annotated[Path, typer.Argument(help="Reference capture directory (e.g. plain).", show_default=False)],
    b: Annotated[Path, typer.Argument(help="Capture directory compared with A.", show_default=False)],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the comparison (every prompt) as JSON.")
    ] = None,
    prompts: Annotated[
        bool, typer.Option("--prompts", help="List every prompt, not only the worst.")
    ] = False,
) -> None:
    """Compare two greedy captures prompt by prompt: exact match, first diverging token, shared prefix,
    normalised edit distance (tokens, or characters without token ids). Exit 0 when compared (whatever the
    match rate), 2 when the captures cannot be compared (different prompts or sampling)."""
    from artifacts.store import write_json
    from tasks.gate import compare

    comparison = compare(a, b)  # captures that cannot be compared: the CLI's error boundary, exit 2
    table = _aggregate_table(f"{comparison.a.capture_id} vs {comparison.b.capture_id}")
    table.add_row(*_aggregate_row("all", comparison.overall))
    for stratum, agg in comparison.per_stratum.items():
        table.add_row(*_aggregate_row(stratum, agg))
    console.print(table)
    if prompts:
        every = Table(title="prompts", title_justify="left")
        for name in ("prompt", "status", "unit", "len a", "len b", "1st div.", "prefix", "edit", "tok diff"):
            every.add_column(name)
        for row in comparison.rows:
            every.add_row(
                row.prompt_id,
                row.status,
                row.unit or "-",
                _fmt(row.len_a),
                _fmt(row.len_b),
                _fmt(row.first_divergence),
                _fmt(row.prefix_fraction),
                _fmt(row.edit_distance),
                _fmt(row.completion_token_diff),
            )
        console.print(every)
    elif (worst := _worst_table(comparison)) is not None:
        console.print(worst)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_json(output, comparison.to_json())
        console.print(f"comparison written to {output}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("gate", help=GATE_HELP, context_settings={"ignore_unknown_options": True})(gate_command)
    capture_app = typer.Typer(
        help="Greedy captures for the correctness gate: compare them.", no_args_is_help=True
    )
    capture_app.command("compare")(compare_command)
    app.add_typer(capture_app, name="capture")
