"""`specgauge metrics-delta`: speculation figures from two saved `/metrics` snapshots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

METRICS_DELTA_HELP = "\n\n".join(
    [
        "Print the speculative-decoding deltas between two saved vLLM /metrics snapshots as ONE JSON object.",
        "Only samples whose model_name label is --model count; they are summed over engine labels (data "
        "parallel). Works with any vLLM version that has the spec_decode counters.",
        "Keys: drafts, draft_tokens, accepted_tokens (counter deltas); acceptance_rate = accepted / "
        "draft_tokens (null without draft tokens); mean_acceptance_length = 1 + accepted / drafts, counting "
        "the bonus token (null without drafts); acceptance_rate_per_position = accepted at position i / "
        'drafts, keyed "0", "1", ... (empty when the server lacks the per-position counter).',
        "Exit 2, with the reason on stderr: a file that cannot be read or is not a Prometheus text, a model "
        "name not in the snapshots (the names present are listed), no spec_decode counters for the model, "
        "or a counter that went down (the server restarted between the snapshots).",
    ]
)


def _read(path: Path) -> str:
    from tasks.metrics.files import read_snapshot

    return read_snapshot(path)  # bounded: /dev/zero or a huge file is refused, never read whole


def metrics_delta(
    before: Annotated[
        Path, typer.Argument(help="/metrics text saved before the window (e.g. metrics_before.txt).")
    ],
    after: Annotated[
        Path, typer.Argument(help="/metrics text saved after the window (e.g. metrics_after.txt).")
    ],
    model: Annotated[
        str,
        typer.Option("--model", help="The served model name: only samples with this model_name label count."),
    ],
) -> None:
    """Print speculation deltas between two saved vLLM /metrics snapshots (see METRICS_DELTA_HELP)."""
    from tasks.metrics.prometheus import parse, spec_decode_delta

    first = parse(_read(before), source=str(before))
    second = parse(_read(after), source=str(after))
    delta = spec_decode_delta(
        first, second, model
    )  # MetricsError (CounterReset included): the CLI's boundary
    typer.echo(json.dumps(delta.to_json()))


def register(app: typer.Typer) -> None:
    app.command("metrics-delta", help=METRICS_DELTA_HELP)(metrics_delta)
