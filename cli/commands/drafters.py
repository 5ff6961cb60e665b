"""`specgauge drafters ...`: drafter heads over their lifecycle (docs/adaptation.md).

`drafters confirm`: the confirm-adaptation flow (flows/adapt.py) on one hot-swap deployment: the old head
against a new one in a randomised schedule of swaps, the gate after the swap, the benefit rule per stratum.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.tables import titled_table

console = Console(soft_wrap=True)

CONFIRM_HELP = "\n\n".join(
    [
        "Confirm that a new EAGLE-3 head pays, on a running server: launch the spec's eagle3 variant once "
        "(with hot_swap), then per repeat measure every stratum with the old head and with the new one, in a "
        "seeded random order of blocks, swapping heads without a restart; capture the capture corpus with "
        "the new head serving and gate it against plain; swap the old head back in (always, on failure too); "
        "tear down. Per stratum: mean acceptance length, throughput and TPOT new / old with t intervals over "
        "repeats, and the benefit rule: adopt the new head for a stratum only when its gain's interval lies "
        "above 1 + --min-effect, no other stratum is worse by more than --max-harm, its requests succeeded "
        "and the gate passed.",
        "--new: a head directory or a drafter artifact id (SPECGAUGE_HOME/raw/drafters/<id>). --old: default "
        "the variant's eagle_head. --plain-from CAMPAIGN: reuse that campaign's plain captures for the gate "
        "(same target, capture corpus, sampling and max_tokens; checked); without it the flow launches plain "
        "twice for them.",
        "Prints the verdict per stratum and the report's path (SPECGAUGE_HOME/reports/<campaign>/index.html); "
        'the verdict is in the warehouse (`specgauge sql "SELECT * FROM v_adaptation"`). Exit 0: done '
        "(whatever the verdict); 2: refused input.",
    ]
)


def confirm(
    new: Annotated[str, typer.Option("--new", help="The new head: a directory or a drafter artifact id.")],
    target: Annotated[str, typer.Option("--target", help="The stratum the head was adapted for.")],
    spec: Annotated[
        str, typer.Option("--spec", help="Experiment spec (target, eagle3 variant, workloads).")
    ] = ("experiments/adapt.yaml"),
    old: Annotated[str | None, typer.Option("--old", help="The old head (default: the variant's).")] = None,
    variant: Annotated[str | None, typer.Option("--variant", help="The spec's eagle3 variant.")] = None,
    strata: Annotated[
        str | None, typer.Option("--strata", help="Comma-separated strata (default: all).")
    ] = None,
    concurrencies: Annotated[
        str | None, typer.Option("--concurrencies", help="Comma-separated closed-loop concurrencies.")
    ] = None,
    requests: Annotated[
        int | None, typer.Option("--requests", help="Measured requests per cell.", min=1, max=1_000_000)
    ] = None,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Passes over every (head, stratum) block.", min=1, max=1000)
    ] = 3,
    min_effect: Annotated[
        float, typer.Option("--min-effect", help="Minimum gain on a stratum.", min=0.0, max=100.0)
    ] = 0.10,
    max_harm: Annotated[
        float,
        typer.Option("--max-harm", help="Largest loss another stratum may take.", min=0.0, max=1.0),
    ] = 0.05,
    gain_metric: Annotated[
        str, typer.Option("--gain-metric", help="throughput, mean_acceptance_length or tpot_p50.")
    ] = "throughput",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the block order.", min=0, max=2**32 - 1)] = 0,
    plain_from: Annotated[
        str | None, typer.Option("--plain-from", help="Campaign whose plain captures the gate reuses.")
    ] = None,
    gate: Annotated[bool, typer.Option("--gate/--no-gate", help="Gate the new head's capture.")] = True,
    label: Annotated[
        str | None, typer.Option("--label", help="A new confirmation instead of resuming.")
    ] = None,
) -> None:
    from cli.commands.campaign import _listed
    from flows.adapt import AdaptationRequest, Inputs
    from specgauge.errors import InputError

    request = AdaptationRequest(
        spec_path=spec,
        new_head=new,
        target_stratum=target,
        old_head=old,
        variant=variant,
        strata=_listed(strata, "--strata"),
        concurrencies=_listed(concurrencies, "--concurrencies", int),
        requests=requests,
        repeats=repeats,
        min_effect=min_effect,
        max_harm=max_harm,
        gain_metric=gain_metric,
        seed=seed,
        plain_from=plain_from,
        gate=gate,
        label=label,
    )
    try:  # the rule checks its own parameters (ValueError): name the options
        request.rule()
    except ValueError as exc:
        raise InputError(f"--gain-metric/--min-effect/--max-harm: {exc}") from None
    # bad input is refused here, before Prefect starts (one line, exit 2, from the CLI's error boundary)
    Inputs(request)
    from flows.adapt import confirm_adaptation

    document = confirm_adaptation(request)
    console.print(verdict_table(document))
    gate_facts = document.get("gate") or {}
    console.print(
        f"gate after the swap: {gate_facts.get('outcome') or gate_facts.get('error') or 'not run'}",
        markup=False,
    )
    for v in document["verdicts"]:
        console.print(f"{v['stratum']} at {v['load_label']}: {v['reason']}", markup=False)
    console.print(f"verdict: {document['summary']}", markup=False)
    if document.get("status") != "ok":
        console.print(f"the confirmation FAILED: {document.get('error')}", markup=False)
    if document.get("report"):
        console.print(f"report: {document['report']}", markup=False)


def _ratio(c: dict | None) -> str:
    if not c or c.get("estimate") is None:
        return "-"
    if c.get("ci_low") is None:
        return f"{c['estimate']:.3f} ({c.get('interval')})"
    return f"{c['estimate']:.3f} [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"


def verdict_table(document: dict) -> Table:
    columns = (
        "stratum",
        "load",
        "MAL old -> new",
        "MAL new/old",
        "throughput new/old",
        "TPOT old/new",
        "verdict",
    )
    table = titled_table(f"adaptation {document['adaptation_id']}", columns)
    comparisons = {(c["stratum"], c["load_label"], c["metric"]): c for c in document["comparisons"]}
    for v in document["verdicts"]:
        key = (v["stratum"], v["load_label"])
        mal = comparisons.get((*key, "mean_acceptance_length"))
        table.add_row(
            v["stratum"] + (" (target)" if v["target"] else ""),
            v["load_label"],
            "-"
            if not mal or mal.get("old_mean") is None
            else f"{mal['old_mean']:.3f} -> {mal['new_mean']:.3f}",
            _ratio(mal),
            _ratio(comparisons.get((*key, "throughput"))),
            _ratio(comparisons.get((*key, "tpot_p50"))),
            "adopt" if v["adopt"] else "keep old",
        )
    return table


def register(app: typer.Typer) -> None:
    drafters_app = typer.Typer(
        help="Drafter heads: train or fine-tune one, confirm an adapted head.", no_args_is_help=True
    )
    drafters_app.command("confirm", help=CONFIRM_HELP)(confirm)
    from cli.commands.drafters_train import TRAIN_HELP, train

    drafters_app.command("train", help=TRAIN_HELP)(train)
    app.add_typer(drafters_app, name="drafters")
