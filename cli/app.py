"""The `specgauge` command line. Each command is a thin shell over plain functions elsewhere.

One error boundary for every command: the project's errors (specgauge.errors.SpecgaugeError and its
subclasses, the warehouse's included) become one line `error: <message>` on stderr and exit code
EXIT_ERROR, never a traceback. So does everything else a command can raise (boundary_message): an OSError
names its file, a ValueError is bad input, RecursionError and MemoryError say the input was too deep or too
large, Ctrl-C is `error: interrupted` and exit 130, and anything else is `error: internal error: TYPE: ...`
(SPECGAUGE_DEBUG=1 prints the traceback too). Commands do not catch them themselves; they only choose exit 1
for a negative answer (a gate that failed, artifacts quarantined, problems found in a file)."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from specgauge.errors import SpecgaugeError
from specgauge.prefect_env import configure as _configure_prefect

_configure_prefect()  # before anything imports prefect: the repo's profiles, PREFECT_HOME under var/

EXIT_ERROR = 2  # the command could not do its job: bad input, a missing artifact, a failed launch, ...
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report it
DEBUG_ENV = "SPECGAUGE_DEBUG"  # 1: print the traceback under the error line
MESSAGE_CHARS = 600  # an error line never echoes a whole input (a message may quote the value it refused)


def report_error(exc: SpecgaugeError) -> None:
    """The one way a command reports the project's errors: `error: ` and the message (it names the file,
    field or artifact concerned), unwrapped and without markup so that tools can parse it."""
    from specgauge.redact import redact_text

    sys.stderr.write(f"error: {redact_text(str(exc))}\n")
    sys.stderr.flush()


def _one_line(text: str) -> str:
    """A message from outside the project on one line, bounded (it may quote a long input)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= MESSAGE_CHARS else flat[:MESSAGE_CHARS] + " ..."


def boundary_message(exc: BaseException) -> str:
    """The one line (after `error: `) for an exception that is not one of the project's own."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, RecursionError):  # before ValueError/RuntimeError: json/yaml nesting thousands deep
        return "input nested too deeply to read (a file or value thousands of levels deep)"
    if isinstance(exc, MemoryError):
        return "out of memory: an input is too large to read"
    if isinstance(exc, OSError):  # names the file: "PATH: No such file or directory"
        where = ": ".join(repr(str(f)) for f in (exc.filename, exc.filename2) if f is not None)
        why = exc.strerror or str(exc) or type(exc).__name__
        return _one_line(f"{where}: {why}" if where else why)
    if isinstance(exc, ValueError):  # int("x"), json, unicode, an embedded NUL: the input was bad
        return _one_line(f"invalid input: {exc}")
    return _one_line(f"internal error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback)")


def report_unexpected(exc: BaseException) -> int:
    """Report an exception that escaped a command as one line (traceback too with SPECGAUGE_DEBUG=1);
    return the exit code."""
    from specgauge.redact import redact_text

    if isinstance(exc, BrokenPipeError):  # `specgauge ... | head`: the reader left, nothing to say
        try:
            with open(os.devnull, "w") as devnull:
                os.dup2(
                    devnull.fileno(), sys.stdout.fileno()
                )  # no second error when stdout is flushed at exit
        except (OSError, ValueError):  # stdout is not a file (in-process runners)
            pass
        return 1
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.write(f"error: {redact_text(boundary_message(exc))}\n")
    sys.stderr.flush()
    return EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_ERROR


def _installed_click_exit(exc: BaseException) -> int | None:
    """The exit code of the installed click's Exit (raised by code that uses click itself, not typer's
    vendored copy); None for anything else."""
    try:
        from click.exceptions import Exit as ClickExit
    except ImportError:
        return None
    return exc.exit_code if isinstance(exc, ClickExit) else None


class ErrorBoundary(TyperGroup):
    """The root command group: every subcommand runs inside its invoke, so one except clause covers all."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except SpecgaugeError as exc:
            report_error(exc)
            raise typer.Exit(code=EXIT_ERROR) from None
        except (typer.exceptions.TyperException, typer.Exit, typer.Abort):  # typer's own (vendored) click
            raise  # usage errors print usage and exit 2; typer.Exit carries the command's own code
        except Exception as exc:
            code = _installed_click_exit(exc)  # Prefect's click (not typer's copy) exits with its own code
            if code is None:
                raise typer.Exit(code=report_unexpected(exc)) from None
            raise typer.Exit(code=code) from None
        except KeyboardInterrupt as exc:
            raise typer.Exit(code=report_unexpected(exc)) from None


app = typer.Typer(
    cls=ErrorBoundary,
    name="specgauge",
    help="Measure whether speculative decoding pays for a served model: launch, load, gate, warehouse, report.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
workloads_app = typer.Typer(help="Workload corpora (JSONL): validate them.", no_args_is_help=True)
app.add_typer(workloads_app, name="workloads")

console = Console()
err_console = Console(stderr=True)


@workloads_app.command("validate")
def workloads_validate(
    files: Annotated[list[Path], typer.Argument(help="Workload JSONL files to check.")],
) -> None:
    """Check workload files. Exit 0 when all are valid; otherwise print every problem as FILE:LINE: field: message."""
    from workloads.schema import check_file

    bad = 0
    for path in files:
        prompts, problems = check_file(path)
        for problem in problems:
            typer.echo(str(problem), err=True)  # one problem a line, never wrapped: tools parse this
        if problems:
            bad += 1
        else:
            strata = sorted({p.workload for p in prompts})
            console.print(f"{path}: ok, {len(prompts)} prompts, strata: {', '.join(strata)}", markup=False)
    if bad:
        raise typer.Exit(code=1)


@workloads_app.command("length-buckets")
def workloads_length_buckets(
    out: Annotated[Path, typer.Argument(help="The JSONL to write (seed format, one stratum per bucket).")],
    edges: Annotated[
        str | None,
        typer.Option(
            help="Bucket edges in prompt tokens, comma-separated; default doubling from 128 to the limit."
        ),
    ] = None,
    per_bucket: Annotated[int, typer.Option(help="Prompts per bucket.")] = 8,
    model: Annotated[
        str, typer.Option(help="The target whose tokenizer counts tokens.")
    ] = "models/tiny-target",
    max_model_len: Annotated[int, typer.Option(help="The served context (tokens).")] = 2048,
    max_tokens: Annotated[int, typer.Option(help="Each prompt's max_tokens.")] = 64,
    stratum: Annotated[
        str, typer.Option(help="Base of the strata names (<stratum>-len-NNNN).")
    ] = "summarization",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Cut the long-context summarization material into prompt-length buckets (workloads/length_buckets.py)."""
    from workloads import length_buckets as lb

    try:
        parsed = [int(e) for e in edges.split(",")] if edges else None
    except ValueError:
        raise SpecgaugeError(f"--edges: whole numbers of tokens separated by commas, got {edges!r}") from None
    spec = lb.parse_bucket_spec(
        {
            "edges": parsed or lb.default_edges(max_model_len, max_tokens),
            "per_bucket": per_bucket,
            "model": model,
            "max_model_len": max_model_len,
            "max_tokens": max_tokens,
            "stratum": stratum,
            "seed": seed,
        }
    )
    rows = lb.build(spec, out)
    counts = ", ".join(
        f"[{lo}, {hi}): {sum(r['length_bucket'][0] == lo for r in rows)}" for lo, hi in spec.buckets
    )
    typer.echo(f"{out}: {len(rows)} prompts, checked; buckets {counts}")


@app.command("reap")
def reap() -> None:
    """Stop deployments that a crashed or killed run left behind (from the deployment ledger)."""
    from blocks import SavedBlocks
    from tasks.launch import reap_leftovers

    done = reap_leftovers(saved=SavedBlocks())
    for entry in done:
        console.print(f"{entry['id']} ({entry['launcher']}): {entry['outcome']}", markup=False)
    if not done:
        console.print("nothing left behind")


# Each area registers its own commands (cli/commands/<area>.py exposes register(app)).
COMMAND_MODULES: list[str] = [
    "analysis",
    "blocks",
    "campaign",
    "decide",
    "drafters",
    "emulator",
    "gate",
    "imports",
    "metrics",
    "patches",
    "profile",
    "simulate",
    "warehouse",
]


def _register_command_modules() -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"cli.commands.{name}").register(app)


_register_command_modules()


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
