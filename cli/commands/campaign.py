"""Campaigns from the command line: plan, run (with a progress display), the demo, and the Prefect
server/deployment/worker commands that make the same flows triggerable from the UI."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from analysis.serve import DEFAULT_PORT as REPORTS_PORT
from specgauge.settings import REPO_ROOT

if TYPE_CHECKING:
    from experiments.overrides import SpecOverrides
    from experiments.plan import CampaignPlan
    from experiments.spec import ExperimentSpec

console = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get whole tables
WORK_POOL = "specgauge"


# The closing table must fit a 120-column terminal: short headers (units and meanings in the caption),
# names that may fold, figures that never wrap.
HEADLINE_HEADERS = {
    "repeat": "rep",
    "TTFT p50 s": "TTFT p50",
    "TPOT p50 s": "TPOT p50",
    "acceptance": "accept",
    "mean acc. len": "acc. len",
}
HEADLINE_TEXT_COLUMNS = ("cell", "variant", "workload", "load", "status")
HEADLINE_CAPTION = (
    "TTFT, TPOT: seconds, median over requests; accept: draft tokens accepted / proposed; "
    "acc. len: mean tokens per step (1 + accepted per draft)"
)


def prefect_server_argv(port: int) -> list[str]:
    """The command line of the Prefect server and UI on 127.0.0.1:`port` (analytics off)."""
    return [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--analytics-off",
    ]


def headline_table(title: str, rows: list[dict]) -> Table:
    """The closing table of a campaign: one row per cell (tasks.campaign_state.headline_rows)."""
    table = Table(title=title, caption=HEADLINE_CAPTION, caption_justify="left")
    columns = list(dict.fromkeys(k for row in rows for k in row))
    for column in columns:
        text = column in HEADLINE_TEXT_COLUMNS
        table.add_column(
            HEADLINE_HEADERS.get(column, column),
            justify="left" if text else "right",
            overflow="fold" if text else "ellipsis",
            no_wrap=not text,
        )
    for row in rows:
        table.add_row(*[str(row.get(c, "")) for c in columns])
    return table


def plan_summary(plan: CampaignPlan, spec: ExperimentSpec) -> list[str]:
    """The plan's size and its time estimate, in lines for the terminal."""
    from experiments.estimate import estimate_seconds, history_from, plan_size
    from warehouse.db import reader
    from warehouse.errors import WarehouseMissing

    size = plan_size(plan, spec)
    variants = ", ".join(v.name for v in spec.variants)
    lines = [
        f"variants ({len(spec.variants)}): {variants}",
        f"launches: {size.launches} ({size.arm_launches} measured, {size.control_launches} plain controls, "
        f"{size.profiled_launches} profiled)",
        f"cells: {size.cells}, requests: {size.requests} measured + {size.warmup} warm-up; "
        f"captures: {size.captures} ({size.capture_prompts} prompts)",
    ]
    settings = {spec.setting_of(v) for v in spec.variants}
    if len(settings) > 1:
        samplings = len({sampling for sampling, _ in settings})
        layouts = len({layout for _, layout in settings})
        lines.insert(
            1, f"settings: {samplings} sampling(s) x {layouts} layout(s), each with its own plain baseline"
        )
    searches = plan.searches()
    if searches and spec.capacity is not None:
        from analysis.stats import percent
        from tasks.capacity import min_requests

        capacity = spec.capacity
        n = capacity.requests or min_requests(capacity.quantile, capacity.confidence)
        lines.append(
            f"capacity searches: {len(searches)} on {searches[0].workload}, up to {capacity.max_points} points of "
            f"{n} requests each (p{capacity.quantile * 100:g} at {percent(capacity.confidence)} confidence; not in "
            "the estimate below)"
        )
    kind = spec.launcher.kind
    try:
        with reader() as con:
            history = history_from(con, kind)
    except WarehouseMissing:
        lines.append(f"estimated time: unknown (no warehouse yet: run a campaign on launcher {kind!r} first)")
        return lines
    seconds = estimate_seconds(plan, spec, history)
    if seconds is None:
        lines.append(f"estimated time: unknown (the warehouse has no past run on launcher {kind!r})")
    else:
        lines.append(
            f"estimated time: about {seconds / 60:.0f} min (from the warehouse: {history.launches} past "
            f"launches on {kind!r}, median start {history.start_s:.0f} s; {history.cells} cells at "
            f"concurrency {', '.join(str(c) for c in sorted(history.request_s))})"
        )
    return lines


def run_campaign_cli(
    spec: str,
    label: str | None,
    ingest: bool,
    gate: bool,
    analyze: bool,
    overrides: SpecOverrides | None = None,
) -> dict:
    from experiments.overrides import SpecOverrides, load_spec_with
    from experiments.plan import plan_campaign, resolve_repo_path
    from tasks.drafters.prelaunch import check_launchable

    # Bad input (spec, overrides, corpus, label) fails here, before Prefect is even imported (7 of the 9 s a
    # refusal took on 2 cores), naming file and field; the CLI's error boundary makes it one line and exit 2.
    overrides = overrides or SpecOverrides()
    spec_path = resolve_repo_path(spec)
    experiment = load_spec_with(spec_path, overrides)
    plan = plan_campaign(experiment, label)
    check_launchable(experiment, source=str(spec_path))

    from tasks import campaign_state as state

    directory = state.campaign_dir(plan.campaign_id)
    # One writer per campaign: a second run of it is refused here, naming the first, before Prefect is even
    # imported; the flow takes the same lock again (re-entrant), as a run started from the UI does.
    with state.campaign_writer(directory):
        from flows.campaign import CampaignRequest, campaign
        from specgauge.progress import RichReporter, reporting

        request = CampaignRequest(
            spec_path=str(spec_path),
            label=label,
            variants=list(overrides.variants or []),
            strata=list(overrides.strata or []),
            concurrencies=list(overrides.concurrencies or []),
            repeats=overrides.repeats,
            ingest=ingest,
            gate=gate,
            analyze=analyze,
        )
        with reporting(RichReporter()):
            result = campaign(request)
    console.print(headline_table(f"campaign {plan.campaign_id}", state.headline_rows(directory, plan)))
    for verdict in result.get("gates", []) or []:
        console.print(
            f"gate {verdict.get('treatment')}: {'PASSED' if verdict.get('passed') else 'FAILED'} - "
            f"{verdict.get('claim')}",
            markup=False,
        )
    analysis = result.get("analysis")
    if isinstance(analysis, dict) and analysis.get("report"):
        console.print(f"report: {analysis['report']}", markup=False)
    console.print(f"raw artifacts: {directory}", markup=False)
    return result


EXIT_NEGATIVE = 1  # the campaign ran but measured nothing: every launch failed


def launch_failure_summary(result: dict) -> str | None:
    """One paragraph when every deployment slot that had work failed to launch (nothing was measured):
    which slots (campaign.variant.rN) and why, first line of each error; None when anything launched or was
    measured (a resumed campaign whose cells were done earlier is not a failure)."""
    slots = [s for s in result.get("deployments") or [] if isinstance(s, dict)]
    tried = [s for s in slots if s.get("launches") or s.get("error")]
    if not tried or any(s.get("launches") for s in slots):
        return None
    if any(str(status).startswith("ok") for s in slots for status in (s.get("cells") or {}).values()):
        return None
    reasons = "; ".join(
        f"{s.get('slot')}: {str(s.get('error') or 'no launch').splitlines()[0][:200]}" for s in tried
    )
    cells = sum(len(s.get("cells") or {}) for s in tried)
    return (
        f"every launch failed ({len(tried)} of {len(tried)} deployment slots), so none of the campaign's "
        f"{cells} cells was measured: {reasons}. Fix the cause and run the same command again to resume."
    )


def _listed(value: str | None, option: str, kind: type = str) -> list | None:
    """A comma-separated option's items read as `kind`; one it cannot read is refused, naming the option."""
    from specgauge.errors import InputError

    if value is None:
        return None
    items = []
    for item in (item.strip() for item in value.split(",")):
        if not item:
            continue
        try:
            items.append(kind(item))
        except ValueError:
            raise InputError(f"{option}: {item!r} is not a {kind.__name__}") from None
    return items


campaign_app = typer.Typer(help="Campaigns: plan and run experiment specs.", no_args_is_help=True)


@campaign_app.command("plan")
def plan_cmd(
    spec: Annotated[str, typer.Argument(help="Experiment spec (YAML).")],
    label: Annotated[str | None, typer.Option(help="Run label (a new campaign id).")] = None,
) -> None:
    """Show what a spec would launch and measure, and about how long it would take (from the
    warehouse's past runs on the same launcher), without running anything."""
    from experiments.plan import plan_campaign, resolve_repo_path
    from experiments.spec import load_spec

    experiment = load_spec(resolve_repo_path(spec))
    plan = plan_campaign(experiment, label)
    console.print(f"campaign id: {plan.campaign_id}", markup=False)
    for line in plan_summary(plan, experiment):
        console.print(line, markup=False)
    for repeat, order in enumerate(plan.orders):
        console.print(f"repeat {repeat}: variant order {', '.join(order)}", markup=False)
    for d in plan.deployments:
        console.print(
            f"- {d.deployment_id} ({d.role}): {len(d.cells)} cells, captures {list(d.captures)}",
            markup=False,
        )


@campaign_app.command("run")
def run_cmd(
    spec: Annotated[
        str, typer.Argument(help="Experiment spec (YAML), relative to the repo root or absolute.")
    ],
    label: Annotated[
        str | None, typer.Option(help="Run label: a new campaign id instead of resuming.")
    ] = None,
    ingest: Annotated[bool, typer.Option(help="Ingest into the warehouse afterwards.")] = True,
    gate: Annotated[bool, typer.Option(help="Run the greedy-correctness gate afterwards.")] = True,
    analyze: Annotated[bool, typer.Option(help="Analyse and write the report afterwards.")] = True,
    variants: Annotated[
        str | None,
        typer.Option(help="Only these variants, comma-separated (e.g. draft-k3,ngram-k3); plain is kept."),
    ] = None,
    strata: Annotated[
        str | None, typer.Option(help="Only these strata of the spec's workloads, comma-separated.")
    ] = None,
    concurrencies: Annotated[
        str | None, typer.Option(help="Closed-loop concurrencies instead of the spec's, e.g. 1,4.")
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(help="Deployments per variant instead of the spec's.", min=1, max=1000)
    ] = None,
) -> None:
    """Run a campaign: launch each variant, wait until it is ready, measure every cell, capture, tear down;
    then profile, gate, ingest and analyse. Re-running the same spec (and overrides) resumes: finished
    cells are skipped. Bad input (spec, override, corpus, label, a draft with another vocabulary) exits
    with code 2 before anything is written. The overrides are the run form's in the Prefect UI."""
    from experiments.overrides import SpecOverrides

    overrides = SpecOverrides.of(
        _listed(variants, "--variants"),
        _listed(strata, "--strata"),
        _listed(concurrencies, "--concurrencies", int),
        repeats,
    )
    result = run_campaign_cli(spec, label, ingest, gate, analyze, overrides)
    summary = launch_failure_summary(result)
    if summary:  # a negative answer, not a success: scripts must not take an empty campaign for a result
        from specgauge.redact import redact_text

        typer.echo(f"error: {redact_text(summary)}", err=True)
        raise typer.Exit(code=EXIT_NEGATIVE)


@campaign_app.command("verify-recommendation")
def verify_cmd(
    campaign_id: Annotated[
        str | None,
        typer.Argument(help="The campaign whose recommendation to verify. Default: the latest campaign."),
    ] = None,
    workload: Annotated[
        str | None, typer.Option(help="The recommendation's workload (needed when there are several).")
    ] = None,
) -> None:
    """Launch the recommended schedule (`specgauge recommend`) beside plain and the best fixed depth, as a
    campaign of its own (spec under SPECGAUGE_HOME/specs/), and say per load, with intervals, whether
    the launch confirmed it: `specgauge decide --campaign ID`, the same flow."""
    from cli.commands.decide import run_decide
    from warehouse.db import reader

    if campaign_id is None:
        from analysis.data import latest_campaign_id

        with reader() as con:
            campaign_id = latest_campaign_id(con)
    run_decide(None, campaign_id, None, workload)


server_app = typer.Typer(
    help="The Prefect server, deployments and worker behind the UI.", no_args_is_help=True
)


def prefect_cli(*args: str, profile: str = "server") -> subprocess.CompletedProcess:
    """`python -m prefect ARGS` from the repo root under a Prefect profile (its exit status is the caller's)."""
    env = {**os.environ, "PREFECT_PROFILE": profile}
    return subprocess.run([sys.executable, "-m", "prefect", *args], cwd=REPO_ROOT, env=env, check=False)


@server_app.command("server")
def server_cmd(
    port: int = typer.Option(4200, help="Port on 127.0.0.1.", min=1, max=65535),
    reports_port: int = typer.Option(
        REPORTS_PORT, help="Port of the report server started beside it (0: none).", min=0, max=65535
    ),
) -> None:
    """Start the Prefect server and UI on 127.0.0.1, and the report server the runs' report links open
    (`specgauge reports serve`), in the foreground; Ctrl-C stops both."""
    env = {**os.environ, "PREFECT_PROFILE": "server", "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    if reports_port:  # same process group: Ctrl-C reaches it too
        subprocess.Popen(
            [sys.executable, "-m", "cli", "reports", "serve", "--port", str(reports_port)], cwd=REPO_ROOT
        )
    os.execve(sys.executable, prefect_server_argv(port), env)


@server_app.command("deploy")
def deploy_cmd(
    alert_webhook: Annotated[
        str | None,
        typer.Option(
            envvar="SPECGAUGE_ALERT_WEBHOOK",
            help="Also send alerts (a regression, a failed regression run, an invalid campaign) to this "
            "webhook: see `specgauge prefect alerts`. The URL is a secret: prefer the environment "
            "variable to the option (a command line is visible to every user of the machine).",
        ),
    ] = None,
) -> None:
    """Create the process work pool and the deployments of prefect.yaml (campaign, regression, analyze)
    on the server, register the block types, and with --alert-webhook the alerts' automation."""
    prefect_cli("work-pool", "create", WORK_POOL, "--type", "process", "--overwrite")
    prefect_cli("gcl", "create", "specgauge-warehouse-writer", "--limit", "1")
    done = prefect_cli("--no-prompt", "deploy", "--all")
    if done.returncode != 0:
        raise typer.Exit(done.returncode)
    env = {**os.environ, "PREFECT_PROFILE": "server"}
    subprocess.run([sys.executable, "-m", "cli", "blocks", "register"], env=env, check=False)
    if alert_webhook:
        from flows.alerts import alerts_command

        alerts, alerts_env = alerts_command(alert_webhook, env)  # the URL in the environment, not argv
        if subprocess.run(alerts, env=alerts_env, check=False).returncode != 0:
            raise typer.Exit(2)
    else:
        console.print("no alerts: give --alert-webhook URL, or run `specgauge prefect alerts` later")


@server_app.command("alerts")
def alerts_cmd(
    webhook: Annotated[
        str | None,
        typer.Option(
            help="POST each alert as JSON {subject, text} to this URL (saved as a webhook block, the URL "
            "masked). Without this and --block: the URL in SPECGAUGE_ALERT_WEBHOOK."
        ),
    ] = None,
    block: Annotated[
        str | None,
        typer.Option(
            help="Send through this saved notification block instead, as TYPE/NAME (e.g. "
            "slack-webhook/team-alerts, email/oncall): any Prefect notification block."
        ),
    ] = None,
) -> None:
    """Create (or replace) the automation that tells someone when a nightly regression regressed or failed,
    or a campaign was found invalid: the message says what, by how much, and links the report."""
    from flows.alerts import webhook_from_environment
    from specgauge.errors import InputError

    if webhook is None and block is None:
        webhook = webhook_from_environment()
    if (webhook is None) == (block is None):
        raise InputError("give one of --webhook URL (or SPECGAUGE_ALERT_WEBHOOK) or --block TYPE/NAME")
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:  # the local profile's ephemeral API would forget it at exit
        raise InputError(
            "alerts live on the Prefect server: run with PREFECT_PROFILE=server (or PREFECT_API_URL set)"
        )
    from flows.alerts import AUTOMATION_NAME, ensure_automation, notification_block_id, save_webhook_block
    from specgauge.redact import redact_webhook

    block_id = save_webhook_block(webhook)._block_document_id if webhook else notification_block_id(block)
    automation = ensure_automation(block_id)
    where = redact_webhook(webhook) if webhook else block  # the host only: the rest of a hook is its key
    console.print(f"automation {AUTOMATION_NAME} ({automation.id}): alerts go to {where}", markup=False)


@server_app.command("worker")
def worker_cmd() -> None:
    """Start a process worker for the specgauge pool (foreground). Its runs link reports through the
    report server `specgauge prefect server` starts (SPECGAUGE_REPORTS_URL, unless set already)."""
    env = {
        "SPECGAUGE_REPORTS_URL": f"http://127.0.0.1:{REPORTS_PORT}",
        **os.environ,
        "PREFECT_PROFILE": "server",
    }
    os.execve(sys.executable, [sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL], env)


def register(app: typer.Typer) -> None:
    app.add_typer(campaign_app, name="campaign")
    app.add_typer(server_app, name="prefect")
