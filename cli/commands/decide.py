"""The decision from the command line: `specgauge decide` runs the decide flow (sweep, recommend, verify by a
launch, verdict per load), `specgauge promote` signs a verified decision off; `specgauge demo` is the decide
flow on the embedded engine's cost twin (experiments/decision.yaml)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 160)
DECISION_SPEC = "experiments/decision.yaml"
EXIT_NEGATIVE = 1  # promote: the decision may not be promoted (refuted, inconclusive, invalid, ...)


def _span(estimate: float | None, low: float | None, high: float | None) -> str:
    if estimate is None:
        return "–"
    return f"{estimate:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None else " (no interval)")


def decision_table(decision: dict[str, Any]) -> Table:
    """The answer, one row per batch-size range: what to run there, what the sweep and the launch measured."""
    validity = decision.get("validity") or "not judged"
    title = f"decision {decision['decision_id']}: {decision['outcome'].upper()} (verification campaign {validity})"
    caption = (
        f"{decision['method']} on {decision['workload']}; speedup = output throughput over plain; launched: "
        f"{decision['loads'][0]['n_repeats'] if decision['loads'] else 0} launches of each arm, "
        f"{decision['confidence']:.0%} interval over launches"
    )
    table = Table(title=title, caption=caption, caption_justify="left")
    for name in ("batch", "run", "claim", "sweep", "launched", "vs fixed k", "verdict"):
        table.add_column(name, overflow="fold")
    for load in decision["loads"]:
        table.add_row(
            f"{load['batch_from']}-{load['batch_to']} (C={load['concurrency']})",
            f"{decision['method']} k={load['k']}" if load["k"] else "off",
            load["claim"],
            _span(load["sweep_speedup"], None, None),
            _span(load["over_plain"], load["over_plain_low"], load["over_plain_high"]),
            _span(load["over_fixed"], load["over_fixed_low"], load["over_fixed_high"]),
            f"{load['outcome']}: {load['reason']}",
        )
    return table


def options_table(decision: dict[str, Any]) -> Table:
    """The whole deployment options weighed by traffic, one row each, and the choice in the title."""
    table = Table(
        title=f"deploy: {decision['choice']}",
        caption=f"{decision.get('choice_reason', '')}\ntraffic: {decision.get('traffic', '')}",
        caption_justify="left",
    )
    for name in ("option", "config", "expected gain over plain", "worst load", "may be chosen"):
        table.add_column(name, overflow="fold")
    for option in decision["options"]:
        worst = option.get("worst_concurrency")
        table.add_row(
            option["name"],
            option["description"],
            _span(option["gain"], option["gain_low"], option["gain_high"]),
            f"C={worst}: {_span(option['worst'], option['worst_low'], option['worst_high'])}"
            if worst is not None
            else "–",
            f"{'yes' if option['eligible'] else 'no'}: {option['reason']}",
        )
    return table


def print_decision(result: dict[str, Any]) -> None:
    """The flow's answer, last: the table, the config to deploy, the gate, the caveats, the report, and the
    sign-off command only for a decision that may be promoted."""
    from artifacts.documents import DecisionDocument

    decision = result["decision"]
    console.print(decision_table(decision))
    if decision.get("options"):
        console.print(options_table(decision))
    config = decision.get("speculative_config")
    if config:
        console.print("speculative config to deploy (vLLM --speculative-config):", markup=False)
        console.print(json.dumps(config), markup=False, soft_wrap=True)
    else:
        console.print("speculation off at every measured load: deploy plain", markup=False)
    for note in decision.get("caveats") or []:
        console.print(f"- {note}", markup=False)
    console.print(decision["summary"], markup=False)
    if decision.get("validity"):  # the decision's own: the verification campaign it was judged on
        console.print(
            f"validity of the verification campaign: {decision['validity']} ({decision.get('validity_reasons')})",
            markup=False,
        )
    console.print(f"report: {result['report']}", markup=False)
    promotion = result.get("promotion") or {}
    refusal = DecisionDocument.model_validate(decision).refusal()
    if promotion.get("promoted"):
        console.print(f"promoted: {', '.join(promotion.get('files', []))}", markup=False)
    elif not decision.get("speculative_config"):
        pass  # "deploy plain" was printed above
    elif refusal is not None:  # never offer to sign off what was not confirmed by a valid campaign
        console.print(f"not promotable: {refusal}", markup=False)
    else:
        console.print(
            f"not promoted: sign it off with `specgauge promote {decision['decision_id']} --approver NAME` "
            "(or run the `decide` deployment in the UI, which pauses for the approval)",
            markup=False,
        )


def run_decide(
    spec: str | None,
    sweep_campaign_id: str | None,
    label: str | None,
    workload: str | None,
    traffic: str | None = None,
) -> dict[str, Any]:
    """The decide flow without the UI's sign-off pause (a terminal has nobody to resume it)."""
    from pathlib import Path

    from analysis.options import read_traffic, resolve_traffic_path
    from experiments.overrides import SpecOverrides, load_spec_with
    from experiments.plan import plan_campaign, resolve_repo_path
    from tasks.drafters.prelaunch import check_launchable

    path = None
    if traffic is not None:  # the user's file, as typed from here; read now, not after the launches
        traffic = str(Path(traffic).resolve())
        read_traffic(traffic)
    if sweep_campaign_id is None:  # bad input refused before Prefect starts
        path = resolve_repo_path(spec or DECISION_SPEC)
        experiment = load_spec_with(path, SpecOverrides())
        plan_campaign(experiment, label)
        check_launchable(experiment, source=str(path))
        if traffic is None and experiment.decision.traffic is not None:
            read_traffic(resolve_traffic_path(experiment.decision.traffic) or "")
    from flows.decide import DecisionRequest, decide
    from specgauge.progress import RichReporter, reporting

    request = DecisionRequest.model_validate(
        {
            "spec_path": str(path) if path else None,
            "sweep_campaign_id": sweep_campaign_id,
            "label": label,
            "workload": workload,
            "traffic": traffic,
            "sign_off": False,
        }
    )
    with reporting(RichReporter()):
        result = decide(request)
    print_decision(result)
    return result


def register(app: typer.Typer) -> None:
    @app.command("decide")
    def decide_cmd(
        spec: Annotated[
            str, typer.Argument(help="The sweep's experiment spec (YAML): variants at depths and loads.")
        ] = DECISION_SPEC,
        campaign: Annotated[
            str | None,
            typer.Option(help="Verify the recommendation of this finished campaign instead of sweeping."),
        ] = None,
        label: Annotated[
            str | None, typer.Option(help="Run label: fresh campaigns instead of resuming.")
        ] = None,
        workload: Annotated[
            str | None, typer.Option(help="The workload (stratum) to decide for, when the sweep has several.")
        ] = None,
        traffic: Annotated[
            str | None,
            typer.Option(
                help="A traffic profile (YAML/JSON): a list of {concurrency, share}, or a Prometheus range "
                "export of vllm:num_requests_running. Weighs the loads when whole deployment options are "
                "compared; default: the spec's decision.traffic, else equal over the measured loads."
            ),
        ] = None,
    ) -> None:
        """Decide whether and how to turn speculation on: run the sweep, recommend per batch-size range a
        method and depth (or off), launch that schedule beside plain and the best fixed depth, and give per
        load whether the launch confirmed or refuted it, with intervals. The decision goes to the warehouse
        (`v_decision`) and the report; `specgauge promote` signs it off. Re-running resumes."""
        run_decide(spec, campaign, label, workload, traffic)

    @app.command("promote")
    def promote_cmd(
        decision_id: Annotated[str, typer.Argument(help='The decision (`specgauge sql "FROM v_decision"`).')],
        approver: Annotated[str, typer.Option(help="Who signs off.")],
        note: Annotated[str, typer.Option(help="Why, or what to watch.")] = "",
        reject: Annotated[bool, typer.Option("--reject", help="Record a refusal instead.")] = False,
        override: Annotated[
            str,
            typer.Option(
                help="Promote a decision that is not confirmed by a valid verification campaign anyway, for this "
                "reason (recorded with the approver). Refuted ranges are still never deployed."
            ),
        ] = "",
    ) -> None:
        """Sign a verified decision off: write the config files a team deploys (vLLM arguments, the
        --speculative-config JSON, the spec variant, the SLURM and sml forms) under SPECGAUGE_HOME/promoted/
        and record the promotion; the nightly regression runs the promoted config from then on. Only a
        confirmed decision of a valid verification campaign: anything else exits 1 saying why, unless
        --override."""
        from flows.ingest import run_ingest
        from tasks.promote import promote_decision

        result = promote_decision(decision_id, not reject, approver, note, "cli", override=override)
        if result.get("refused"):  # nothing was written: a negative answer, not an error
            console.print(f"{decision_id}: {result['why']}", markup=False)
            raise typer.Exit(code=EXIT_NEGATIVE)
        run_ingest()  # the answer is a raw artifact: v_decision shows who signed off
        if result.get("promoted"):
            for line in result.get("notes") or []:
                console.print(f"- {line}", markup=False)
            console.print(f"promoted {decision_id}: {', '.join(result['files'])}", markup=False)
        else:
            console.print(f"{decision_id}: {result.get('why', 'not promoted')}", markup=False)

    @app.command("demo")
    def demo_cmd() -> None:
        """The main job on the embedded engine: the decision loop on the cost twin of the tiny target
        (experiments/decision.yaml): sweep plain, n-gram, the draft model and EAGLE-3 at a few depths and
        loads, recommend a schedule, verify it by a launch, and print the config to deploy with its verdict
        per load, last."""
        run_decide(DECISION_SPEC, None, None, None)
