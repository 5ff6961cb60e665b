"""`specgauge profile`: where speculation spends and wastes engine time (docs/profiling.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

profile_app = typer.Typer(
    help=(
        "Profile a deployment and break its engine time into drafting, verification, rejection sampling "
        "and other, with the share spent on draft tokens that were rejected (docs/profiling.md)."
    ),
    no_args_is_help=True,
)

ANALYZE_HELP = "\n\n".join(
    [
        "Break down one profiled window from its trace: a vLLM torch-profiler trace directory or worker "
        "trace file (rank0.*.pt.trace.json.gz; the CPU engine), or an `nsys export --type=sqlite` file "
        "(GPUs; needs the specgauge NVTX overlay or VLLM_NVTX_SCOPES_FOR_PROFILING=1, and vLLM's "
        '--profiler-config \'{"profiler":"cuda"}\' for the per-step ranges).',
        "With --counters BEFORE AFTER --model NAME (the /metrics texts scraped right before and after the "
        "window, and the served model name) the wasted shares are computed; without them only the time split "
        "is printed and the wasted figures are null.",
        "Prints a table, or with --json the whole breakdown (shares, seconds, counters, cross-checks, and with "
        "--steps every engine step). Exit 2 with the reason when the trace or the counters cannot be used.",
    ]
)

RUN_HELP = "\n\n".join(
    [
        "Launch one variant of a spec with vLLM's torch profiler on, wait until it is ready, run one profiled "
        "window (warm-up, then N requests at concurrency C between /start_profile and /stop_profile), write "
        "RAW/<campaign_id>/profiles/<profile_id>/ (meta.json, breakdown.json, the two /metrics scrapes, the "
        "worker trace), print the breakdown, and tear the deployment down, also on errors and Ctrl-C.",
        "Only the local launcher (the embedded engine) is supported; clusters use the Nsight path "
        "(docs/profiling.md). Takes about a minute to start the engine plus the window; /stop_profile takes "
        "tens of seconds while vLLM writes the trace. Exit 1 when the window failed (the artifact is still "
        "written, with status failed and the reason).",
    ]
)


def _fail(message: str) -> None:
    """A negative answer (the profiled window failed): exit 1. Errors go to the CLI's boundary (exit 2)."""
    err_console.print(f"error: {message}", markup=False, highlight=False)
    raise typer.Exit(code=1)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_breakdown(data: dict[str, Any], *, title: str = "profiled window") -> None:
    """A readable table of a breakdown.json document."""
    shares, seconds = data["shares"], data["seconds"]
    table = Table(title=title, show_edge=False)
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share of engine time", justify="right")
    rows = [
        ("engine time (measured)", seconds["engine"], 1.0),
        ("drafting", seconds["drafting"], shares["drafting_share"]),
        ("verification", seconds["verification"], shares["verification_share"]),
        ("rejection sampling", seconds["rejection"], shares["rejection_share"]),
        ("other", seconds["other"], shares["other_share"]),
        ("added by speculation", seconds["added"], shares["added_share"]),
        ("wasted on rejected drafts", seconds["wasted"], shares["wasted_share"]),
        ("  of it drafting", seconds["wasted_drafting"], shares["wasted_drafting_share"]),
        ("  of it verification", seconds["wasted_verification"], shares["wasted_verification_share"]),
        ("useful", seconds.get("useful"), shares["useful_share"]),
    ]
    for name, secs, share in rows:
        table.add_row(name, "-" if secs is None else f"{secs:.4f}", _pct(share))
    console.print(table)
    counters = data.get("counters")
    line = f"wasted share of added work: {_pct(shares['wasted_share_of_added'])}"
    if counters:
        line += (
            f"; acceptance rate {_pct(counters['acceptance_rate'])} ({counters['accepted_tokens']} of "
            f"{counters['draft_tokens']} draft tokens)"
        )
    line += f"; {data['trace_counts']['steps']} steps; drafting apportioned {data['apportioning']}"
    console.print(line, markup=False, highlight=False)
    for name, check in data.get("cross_checks", {}).items():
        if isinstance(check, dict) and "ok" in check and not check["ok"]:
            console.print(
                f"cross-check {name}: trace {check['trace']} vs counters {check['counters']}: FAILED"
            )
    for note in data.get("notes", []):
        console.print(f"note: {note}", markup=False, highlight=False)


def analyze(
    trace: Annotated[
        Path,
        typer.Argument(help="Torch-profiler trace directory or worker trace file, or an nsys SQLite export."),
    ],
    counters: Annotated[
        tuple[Path, Path] | None,
        typer.Option("--counters", help="Two /metrics texts: scraped before and after the window."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Served model name whose counters count (with --counters).")
    ] = None,
    k: Annotated[
        int | None,
        typer.Option(
            "--k", help="Draft positions per step; default: from the per-position counters.", min=1, max=64
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the breakdown as JSON.")] = False,
    steps: Annotated[bool, typer.Option("--steps", help="With --json: include every engine step.")] = False,
) -> None:
    from specgauge.errors import InputError
    from tasks.profile.breakdown import counters_from_metrics

    if counters is not None and not model:
        raise InputError("--counters needs --model (the served model name)")
    window = None
    if counters is not None:
        from specgauge.errors import MetricsError
        from tasks.metrics.files import read_snapshot

        try:  # bounded reads: /dev/zero is refused, not read into memory
            before, after = (read_snapshot(p) for p in counters)
        except MetricsError as exc:
            raise InputError(f"--counters: {exc}") from None
        window = counters_from_metrics(before, after, model or "")
    if trace.is_file() and trace.suffix in (".sqlite", ".db"):
        from tasks.profile.nsys import analyze_sqlite

        breakdown = analyze_sqlite(trace, window, k=k)
    else:
        from tasks.profile.torch_trace import analyze_trace

        breakdown = analyze_trace(trace, window, k=k)
    data = breakdown.to_json(with_steps=steps)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        print_breakdown(data, title=str(trace))


def run(
    spec: Annotated[Path, typer.Option("--spec", help="Experiment spec (YAML), e.g. experiments/demo.yaml.")],
    variant: Annotated[str, typer.Option("--variant", help="Name of the variant to profile, e.g. draft-k3.")],
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Closed-loop concurrency C.")] = 2,
    requests: Annotated[int, typer.Option("--requests", min=1, help="Profiled (measured) requests N.")] = 8,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Warm-up requests before the window.")] = 2,
    workload: Annotated[
        str | None, typer.Option("--workload", help="Workload file; default: the spec's first.")
    ] = None,
    stratum: Annotated[
        str | None, typer.Option("--stratum", help="Only prompts of this stratum (chat, code, ...).")
    ] = None,
    label: Annotated[
        str | None, typer.Option("--label", help="Campaign label (as for campaign runs).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the breakdown as JSON.")] = False,
) -> None:
    from tasks.profile.run import profile_variant
    from tasks.profile.window import WindowPlan

    plan = WindowPlan(concurrency=concurrency, requests=requests, warmup=warmup)
    result = profile_variant(spec, variant, plan=plan, workload_file=workload, stratum=stratum, label=label)
    console.print(f"artifact: {result.path}", markup=False, highlight=False)
    if result.status != "ok" or result.breakdown is None:
        _fail(f"the profiled window failed: {result.error}")
        return
    data = result.breakdown.to_json(with_steps=False)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        print_breakdown(data, title=result.path.name)


CHART_HELP = "\n\n".join(
    [
        "Draw the profiled windows in the warehouse (view v_profile_waste) as one stacked bar each: wasted and "
        "useful drafting, wasted and useful verification, rejection sampling, other, as shares of measured "
        "engine time. Writes OUT.html (self-contained: Vega inline, opens offline) and OUT.png.",
        "Run `specgauge ingest` (or the ingest flow) first so that the warehouse has the windows. Exit 2 when "
        "there is no warehouse or no window matches.",
    ]
)


def chart(
    out: Annotated[
        Path, typer.Option("--out", help="Output path without extension (.html and .png are written).")
    ],
    campaign: Annotated[
        str | None, typer.Option("--campaign", help="Only windows of this campaign id.")
    ] = None,
    latest: Annotated[
        bool, typer.Option("--latest/--all", help="Only the latest window per variant, load and workload.")
    ] = True,
) -> None:
    from specgauge.errors import InputError
    from tasks.profile.chart import save_chart, waste_chart
    from warehouse.db import reader

    where, params = ["TRUE"], []
    if campaign:
        where.append("campaign_id = ?")
        params.append(campaign)
    if latest:
        where.append("window_rank = 1")
    with reader() as con:
        cursor = con.execute(
            f"SELECT * FROM v_profile_waste WHERE {' AND '.join(where)} ORDER BY campaign_id, variant, "
            "load_label, started_utc",
            params,
        )
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    if not rows:
        raise InputError(
            "no profiled windows in the warehouse" + (f" for campaign {campaign}" if campaign else "")
        )
    for row in rows:  # one bar per window: with --all a variant and load can have several, named by id
        label = f"{row['variant']} {row['load_label']} {row['workload'] or ''}".strip()
        row["window"] = label if latest else row["profile_id"]
    html, png = save_chart(waste_chart(rows), out)
    console.print(f"{len(rows)} window(s): {html} and {png}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    profile_app.command("analyze", help=ANALYZE_HELP)(analyze)
    profile_app.command("run", help=RUN_HELP)(run)
    profile_app.command("chart", help=CHART_HELP)(chart)
    app.add_typer(profile_app, name="profile")
