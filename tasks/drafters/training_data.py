"""Training data for a drafter head from served traffic: prompts, the target's outputs, and the target's
hidden states at the head's aux layers.

Two sources of (prompt, output) pairs, both token ids, so the head learns exactly what the target served:
- captures (`RAW/<campaign>/captures/<id>/`, written by tasks.capture): the target's greedy token ids per
  prompt; the prompts come from the corpus the capture names (checked against its sha256) and are
  tokenized with the served tokenizer's chat template, as vLLM's chat endpoint does;
- a JSONL the user brings, one object a line: `id` (string), `workload` (stratum), `messages` (chat, as in
  workloads/) or `prompt_ids` (token ids, template applied), and `output_ids` (the target's output token
  ids) or `output` (its text, tokenized without special tokens). A bad line is an InputError naming
  FILE:LINE: field.

The hidden states come offline from the target's weights (transformers' `output_hidden_states`, in the
torch worker tasks/drafters/head_worker.py run by the engine's Python): vLLM's aux id i is the residual
stream after i decoder layers; the final normed state is stored too, so the trainer gets the target's
next-token distribution without running the target. The live source through vLLM's
`extract_hidden_states` method is not wired: see models/README.md "Training data and train-drafter".

What went in is recorded: every example's source (capture id or FILE:LINE), stratum and token counts, a
sha256 per example and over the set, and whether it is held out (by a hash of its id: the same example is
always on the same side, whatever else the set holds).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from specgauge.errors import ArtifactError, InputError, WorkloadError
from specgauge.settings import REPO_ROOT, get_settings
from specgauge.worker_python import python_with, run_script

WORKER = Path(__file__).resolve().with_name("head_worker.py")

EXAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "example_id": pl.String(),
    "stratum": pl.String(),
    "source": pl.String(),
    "prompt_ids": pl.List(pl.Int64()),
    "output_ids": pl.List(pl.Int64()),
    "held_out": pl.Boolean(),
    "sha256": pl.String(),
}


class HeadWorkerError(InputError):
    """The torch worker could not run or failed; the message carries the end of its stderr."""


@dataclass(frozen=True)
class Example:
    """One served request as training data: the prompt as the engine saw it and what the target answered."""

    example_id: str
    stratum: str
    source: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    held_out: bool = False

    @property
    def sha256(self) -> str:
        body = json.dumps([self.stratum, list(self.prompt_ids), list(self.output_ids)])
        return hashlib.sha256(body.encode()).hexdigest()


# ------------------------------------------------------------------------------------------- the worker


def worker_python() -> Path:
    """An interpreter with torch and transformers: this one, else the engine's (SPECGAUGE_ENGINE_PYTHON)."""
    return python_with(("torch", "transformers"), HeadWorkerError)


def run_worker(request: dict[str, Any], *, log: Path | None = None) -> dict[str, Any]:
    """One op of head_worker.py in a process of its own; its stderr goes to `log` when given."""
    python = worker_python()
    done = run_script(python, WORKER, json.dumps(request))
    if log is not None:
        with open(log, "a", encoding="utf-8") as err_sink:
            err_sink.write(done.stderr)
    if done.returncode != 0:
        raise HeadWorkerError(
            f"head worker ({python} {WORKER}, op {request['op']}) failed with exit {done.returncode}: "
            f"{done.stderr.strip()[-1500:]}"
        )
    return json.loads(done.stdout)


def tokenize(target_dir: Path, conversations: list[list[dict[str, Any]]], texts: list[str]):
    """(prompt ids of each conversation, ids of each text) with the target's tokenizer and chat template."""
    if not conversations and not texts:
        return [], []
    answer = run_worker(
        {"op": "tokenize", "tokenizer": str(target_dir), "conversations": conversations, "texts": texts}
    )
    return answer["prompts"], answer["texts"]


# ------------------------------------------------------------------------------------------- the sources


def _ids(value: Any, path: Path, line: int, field: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and t >= 0 for t in value):
        raise WorkloadError(path, line, field, "must be a non-empty list of token ids (integers >= 0)")
    return tuple(value)


def parse_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of a user's JSONL of prompts and the target's outputs (module docstring),
    every line checked, nothing tokenized yet: the first bad line is a WorkloadError (FILE:LINE: field)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such training-data file")
    rows: list[tuple[int, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(path, number, "<line>", f"not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise WorkloadError(path, number, "<line>", "must be a JSON object")
        for field in ("id", "workload"):
            if not isinstance(row.get(field), str) or not row[field]:
                raise WorkloadError(path, number, field, "required, a non-empty string")
        if row["id"] in seen:
            raise WorkloadError(path, number, "id", f"{row['id']!r} repeats line {seen[row['id']]}")
        seen[row["id"]] = number
        if ("messages" in row) == ("prompt_ids" in row):
            raise WorkloadError(path, number, "messages", "give exactly one of messages or prompt_ids")
        if "messages" in row:
            messages = row["messages"]
            if (
                not isinstance(messages, list)
                or not messages
                or not all(
                    isinstance(m, dict)
                    and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)
                    for m in messages
                )
            ):
                raise WorkloadError(path, number, "messages", "a non-empty list of {role, content} strings")
        else:
            _ids(row["prompt_ids"], path, number, "prompt_ids")
        if ("output_ids" in row) == ("output" in row):
            raise WorkloadError(path, number, "output_ids", "give exactly one of output_ids or output")
        if "output_ids" in row:
            _ids(row["output_ids"], path, number, "output_ids")
        elif not isinstance(row["output"], str) or not row["output"]:
            raise WorkloadError(path, number, "output", "required, the target's output text")
        rows.append((number, row))
    if not rows:
        raise InputError(f"{path}: no examples")
    return rows


def read_jsonl(path: Path, target_dir: Path) -> list[Example]:
    """A user's JSONL as examples: checked (parse_jsonl), then its messages and texts tokenized by the
    target's tokenizer."""
    path = Path(path)
    rows = parse_jsonl(path)
    chats = [row["messages"] for _, row in rows if "messages" in row]
    texts = [row["output"] for _, row in rows if "output" in row]
    prompt_ids, text_ids = tokenize(target_dir, chats, texts)
    prompts, outputs = iter(prompt_ids), iter(text_ids)
    examples = []
    for number, row in rows:
        prompt = tuple(next(prompts)) if "messages" in row else tuple(row["prompt_ids"])
        output = tuple(row["output_ids"]) if "output_ids" in row else tuple(next(outputs))
        examples.append(Example(row["id"], row["workload"], f"{path.name}:{number}", prompt, output))
    return examples


def _corpus_of(capture_dir: Path, meta: dict[str, Any]) -> Path:
    corpus = meta.get("corpus") or {}
    named = corpus.get("file") or meta.get("corpus_file")
    sha = corpus.get("sha256") or meta.get("corpus_sha256")
    if not named:
        raise ArtifactError(f"{capture_dir}/meta.json: names no corpus (corpus.file)")
    for candidate in (Path(named), REPO_ROOT / named, REPO_ROOT / "workloads" / Path(named).name):
        if candidate.is_file() and (sha is None or hashlib.sha256(candidate.read_bytes()).hexdigest() == sha):
            return candidate
    raise ArtifactError(f"{capture_dir}/meta.json: corpus {named} (sha256 {sha}) not found")


def read_captures(capture_dirs: list[Path], target_dir: Path) -> list[Example]:
    """The ok outputs with token ids of greedy captures, their prompts tokenized as the engine did."""
    from artifacts.documents.captures import load_capture
    from workloads.schema import load_corpus

    pending: list[tuple[str, Any, str]] = []  # (capture id, output, prompt id)
    conversations: dict[str, list[dict[str, Any]]] = {}
    for directory in capture_dirs:
        capture = load_capture(directory)
        prompts = {p.id: p for p in load_corpus(_corpus_of(Path(directory), capture.meta)).prompts}
        for output in capture.outputs:
            if output.ok and output.token_ids and output.prompt_id in prompts:
                conversations[output.prompt_id] = prompts[output.prompt_id].chat_messages()
                pending.append((Path(directory).name, output, output.prompt_id))
    if not pending:
        raise ArtifactError(f"{[str(d) for d in capture_dirs]}: no ok output with token ids")
    order = sorted(conversations)
    ids, _ = tokenize(target_dir, [conversations[p] for p in order], [])
    prompt_ids = dict(zip(order, ids, strict=True))
    examples, seen = [], set()
    for capture_id, output, prompt_id in pending:
        key = (prompt_id, tuple(output.token_ids))
        if key in seen:  # the same prompt answered alike in two captures teaches nothing new
            continue
        seen.add(key)
        examples.append(
            Example(
                f"{capture_id}/{prompt_id}",
                output.workload or "unknown",
                f"capture:{capture_id}",
                tuple(prompt_ids[prompt_id]),
                tuple(output.token_ids),
            )
        )
    return examples


# ------------------------------------------------------------------------------------------- the set


def held_out_by_id(example_id: str, share: float) -> bool:
    """Whether an example is held out: by the hash of its id, stable whatever else the set holds."""
    return hashlib.sha256(example_id.encode()).digest()[0] < 256 * share


def assemble(examples: list[Example], *, held_out_share: float, max_tokens: int) -> list[Example]:
    """The set in a stable order, each example marked held out or not, sequences cut to `max_tokens`."""
    if not 0 <= held_out_share < 1:
        raise InputError(f"held_out_share {held_out_share}: must be in [0, 1)")
    out = []
    for e in sorted(examples, key=lambda e: e.example_id):
        room = max_tokens - len(e.prompt_ids)
        if room < 2:  # nothing left to draft: skipped, and counted as such
            continue
        out.append(
            Example(
                e.example_id,
                e.stratum,
                e.source,
                e.prompt_ids,
                e.output_ids[:room],
                held_out_by_id(e.example_id, held_out_share),
            )
        )
    if not out:
        raise InputError("no example fits: every prompt is longer than max_tokens")
    return out


def examples_frame(examples: list[Example]) -> pl.DataFrame:
    rows = [{**asdict(e), "sha256": e.sha256} for e in examples]
    for row in rows:
        row["prompt_ids"], row["output_ids"] = list(row["prompt_ids"]), list(row["output_ids"])
    return pl.DataFrame(rows, schema=EXAMPLE_SCHEMA)


def examples_from_frame(frame: pl.DataFrame) -> list[Example]:
    return [
        Example(
            r["example_id"],
            r["stratum"],
            r["source"],
            tuple(r["prompt_ids"]),
            tuple(r["output_ids"]),
            r["held_out"],
        )
        for r in frame.iter_rows(named=True)
    ]


def data_summary(examples: list[Example]) -> dict[str, Any]:
    """What went in: counts, tokens and strata per side, sources, and one sha256 over the examples."""
    digest = hashlib.sha256("\n".join(f"{e.example_id}\t{e.sha256}\t{e.held_out}" for e in examples).encode())

    def side(chosen: list[Example]) -> dict[str, Any]:
        return {
            "examples": len(chosen),
            "prompt_tokens": sum(len(e.prompt_ids) for e in chosen),
            "output_tokens": sum(len(e.output_ids) for e in chosen),
            "strata": dict(sorted(Counter(e.stratum for e in chosen).items())),
        }

    return {
        "sha256": digest.hexdigest(),
        "train": side([e for e in examples if not e.held_out]),
        "held_out": side([e for e in examples if e.held_out]),
        "sources": dict(sorted(Counter(e.source.split(":")[0] for e in examples).items())),
    }


def compute_hidden_states(
    examples: list[Example],
    target_dir: Path,
    aux_layers: list[int],
    out: Path,
    *,
    device: str = "cpu",
    runner: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The target's states at `aux_layers` (and its final normed state) for every example, into `out`
    (safetensors, `aux.<n>` / `final.<n>` in the examples' order), computed offline with its weights, by
    the local worker or `runner` (a cluster job: tasks.drafters.cluster_job)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return (runner or run_worker)(
        {
            "op": "hidden_states",
            "target": str(target_dir),
            "aux_layers": aux_layers,
            "sequences": [list(e.prompt_ids) + list(e.output_ids) for e in examples],
            "out": str(out),
            "device": device,
        }
    )


def capture_dirs_of(source: str) -> list[Path]:
    """A capture folder, or a campaign (its folder, or its id under RAW): every complete capture in it."""
    from artifacts import layout

    path = Path(source)
    if not path.exists():
        path = get_settings().raw_dir / source
    if layout.capture_complete(path):
        return [path]
    captures = layout.captures_dir(path)
    found = [d for d in layout.subdirs(captures) if layout.capture_complete(d)]
    if not found:
        raise InputError(f"{source}: neither a capture folder nor a campaign with complete captures")
    return found


def read_sources(*, captures: list[str], jsonl: list[str], target_dir: Path) -> list[Example]:
    """Every example of the given captures (or campaigns) and JSONL files; ids must not repeat."""
    if not captures and not jsonl:
        raise InputError("no training data: give captures (or campaigns) and/or JSONL files")
    examples: list[Example] = []
    dirs = [d for source in captures for d in capture_dirs_of(source)]
    if dirs:
        examples += read_captures(dirs, target_dir)
    for path in jsonl:
        examples += read_jsonl(Path(path), target_dir)
    seen: dict[str, str] = {}
    for e in examples:
        if e.example_id in seen:
            raise InputError(f"example id {e.example_id!r} given twice ({seen[e.example_id]} and {e.source})")
        seen[e.example_id] = e.source
    return examples


def source_files(*, captures: list[str], jsonl: list[str]) -> dict[str, str]:
    """Each input file -> its sha256 (a capture: its outputs.parquet), for the card."""
    from artifacts import layout

    out = {}
    for source in captures:
        for d in capture_dirs_of(source):
            out[str(d)] = hashlib.sha256((d / layout.OUTPUTS).read_bytes()).hexdigest()
    for path in jsonl:
        if Path(path).is_file():
            out[str(path)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out
