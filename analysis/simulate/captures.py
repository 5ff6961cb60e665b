"""A campaign's greedy captures as replay input: prompt ids (chat template applied) and output ids.

Captures are read through tasks.capture.load_capture (the artifact contract); the prompts come from the
corpus the capture names (`meta.corpus.file`, checked against its sha256; if the file moved, the corpus of
that name under workloads/), tokenized by the served tokenizer's chat template exactly as vLLM's chat
endpoint does. The prompt token count is checked against what the server reported for each request
(`prompt_tokens` from usage): a difference means the template differs, and is reported as a warning.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.simulate import models
from analysis.simulate.replay import Request
from artifacts import layout
from artifacts.documents.captures import Capture, Output, load_capture
from specgauge.errors import ArtifactError
from specgauge.settings import REPO_ROOT
from workloads.schema import Prompt, load_corpus


@dataclass(frozen=True)
class CaptureInput:
    """One capture ready to replay: its requests and the facts of the deployment that served it."""

    capture: Capture
    requests: tuple[Request, ...]
    target_dir: Path
    warnings: tuple[str, ...] = field(default=())

    @property
    def variant(self) -> dict[str, Any]:
        variant = self.capture.meta.get("variant")
        return variant if isinstance(variant, dict) else {"name": str(variant)}

    @property
    def method(self) -> str:
        return str(self.variant.get("method") or "none")

    @property
    def speculation(self) -> dict[str, Any] | None:
        """vLLM's counters over exactly this capture's requests (None for plain; may hold an error)."""
        return self.capture.meta.get("speculation")

    @property
    def max_model_len(self) -> int:
        deployment = self.capture.meta.get("deployment") or {}
        return int(deployment.get("max_model_len") or 2048)


def capture_dirs(raw_campaign_dir: Path) -> list[Path]:
    """The complete capture folders of a raw campaign folder; ArtifactError when there are none."""
    root = layout.captures_dir(raw_campaign_dir)
    if not Path(raw_campaign_dir).is_dir():
        raise ArtifactError(f"{raw_campaign_dir}: no such campaign folder")
    found = (
        sorted(p for p in root.iterdir() if p.is_dir() and layout.capture_complete(p))
        if root.is_dir()
        else []
    )
    if not found:
        raise ArtifactError(f"{root}: no complete captures (meta.json + outputs.parquet) to replay")
    return found


def resolve_model_dir(path: str | None, fallback: str) -> Path:
    """A model folder as a deployment named it: as given if it exists, else under this repo's models/."""
    for candidate in (path, fallback):
        if not candidate:
            continue
        p = Path(candidate)
        for option in (p, REPO_ROOT / p, REPO_ROOT / "models" / p.name):
            if (option / "config.json").is_file():
                return option.resolve()
    raise ArtifactError(
        f"model folder {path or fallback!r} not found (as given, nor under {REPO_ROOT}/models)"
    )


def _command_option(command: list[str], option: str) -> str | None:
    for i, arg in enumerate(command[:-1]):
        if arg == option:
            return command[i + 1]
    return None


def target_dir_of(capture: Capture) -> Path:
    command = (capture.meta.get("deployment") or {}).get("command") or []
    return resolve_model_dir(_command_option(command, "--model"), "models/tiny-target")


def _corpus_path(capture: Capture) -> Path:
    corpus = capture.meta.get("corpus") or {}
    named = corpus.get("file") or capture.meta.get("corpus_file")
    sha = corpus.get("sha256") or capture.meta.get("corpus_sha256")
    if not named:
        raise ArtifactError(f"{capture.path}/meta.json: names no corpus (corpus.file)")
    for candidate in (Path(named), REPO_ROOT / "workloads" / Path(named).name):
        if candidate.is_file() and (sha is None or hashlib.sha256(candidate.read_bytes()).hexdigest() == sha):
            return candidate
    raise ArtifactError(
        f"{capture.path}/meta.json: corpus {named} (sha256 {sha}) not found, nor under {REPO_ROOT}/workloads"
    )


@dataclass(frozen=True)
class _ReadCapture:
    """A capture as read from disk, before any model ran: what is replayable and its prompts."""

    capture: Capture
    target: Path
    usable: list[Output]
    prompts: dict[str, Prompt]
    notes: list[str]


def _read(path: Path) -> _ReadCapture:
    capture = load_capture(path)
    corpus = load_corpus(_corpus_path(capture))
    prompts = {p.id: p for p in corpus.prompts}
    usable = [o for o in capture.outputs if o.ok and o.token_ids is not None and o.prompt_id in prompts]
    if not usable:
        raise ArtifactError(f"{path}: no successful output with token ids to replay")
    skipped = len(capture.outputs) - len(usable)
    notes = [f"{skipped} output(s) failed or without token ids: not replayed"] if skipped else []
    return _ReadCapture(capture, target_dir_of(capture), usable, prompts, notes)


def _prompt_ids(target: Path, reads: list[_ReadCapture]) -> dict[str, tuple[int, ...]]:
    """Every prompt of these captures tokenized once, in one worker call."""
    messages = {pid: read.prompts[pid].chat_messages() for read in reads for pid in read.prompts}
    wanted = sorted({o.prompt_id for read in reads for o in read.usable})
    ids = models.tokenize(target, [messages[pid] for pid in wanted])
    return {pid: tuple(p) for pid, p in zip(wanted, ids, strict=True)}


def _tails(
    target: Path, sequences: set[tuple[tuple[int, ...], tuple[int, ...]]], tokens: int, dtype: str
) -> dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...]]:
    """The target's continuation of each distinct (prompt, output), in one worker call."""
    ordered = sorted(sequences)
    got = models.greedy_tails(
        target, [list(p) for p, _ in ordered], [list(o) for _, o in ordered], tokens, dtype
    )
    return {seq: tuple(tail) for seq, tail in zip(ordered, got, strict=True)}


def load_capture_inputs(
    paths: Sequence[Path], *, tail_tokens: int = 0, dtype: str = "bfloat16"
) -> list[CaptureInput]:
    """Read captures and build their requests, with one model-worker call per target for all of them
    (tokenizing, and the tails). `tail_tokens` > 0 asks the target (offline) for that many tokens after
    each output: what the last step verifies past max_tokens (replay.Request.tail)."""
    reads = [_read(path) for path in paths]
    inputs: dict[int, CaptureInput] = {}
    for target in sorted({read.target for read in reads}):
        mine = [(i, read) for i, read in enumerate(reads) if read.target == target]
        prompt_ids = _prompt_ids(target, [read for _, read in mine])
        sequences = {
            (prompt_ids[o.prompt_id], tuple(o.token_ids or ())) for _, read in mine for o in read.usable
        }
        tails = _tails(target, sequences, tail_tokens, dtype) if tail_tokens else {}
        for i, read in mine:
            requests, warnings = [], list(read.notes)
            for o in read.usable:
                prompt, output = prompt_ids[o.prompt_id], tuple(o.token_ids or ())
                if o.prompt_tokens is not None and o.prompt_tokens != len(prompt):
                    warnings.append(
                        f"{o.prompt_id}: the chat template gives {len(prompt)} prompt tokens, the server "
                        f"counted {o.prompt_tokens}"
                    )
                stratum = o.workload or read.prompts[o.prompt_id].workload
                tail = tails.get((prompt, output), ())
                requests.append(Request(o.prompt_id, stratum, prompt, output, tail))
            inputs[i] = CaptureInput(read.capture, tuple(requests), target, tuple(warnings))
    return [inputs[i] for i in range(len(reads))]
