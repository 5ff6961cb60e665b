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
from specgauge.errors import ArtifactError
from specgauge.settings import REPO_ROOT
from tasks.capture import Capture, Output, load_capture
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


def _usable_outputs(capture: Capture, path: Path) -> tuple[list[Output], dict[str, Prompt], list[str]]:
    corpus = load_corpus(_corpus_path(capture))
    by_id = {p.id: p for p in corpus.prompts}
    usable = [o for o in capture.outputs if o.ok and o.token_ids is not None and o.prompt_id in by_id]
    if not usable:
        raise ArtifactError(f"{path}: no successful output with token ids to replay")
    skipped = len(capture.outputs) - len(usable)
    notes = [f"{skipped} output(s) failed or without token ids: not replayed"] if skipped else []
    return usable, by_id, notes


def load_capture_inputs(
    paths: Sequence[Path], *, tail_tokens: int = 0, dtype: str = "bfloat16"
) -> list[CaptureInput]:
    """Read captures and build their requests, with one model-worker call per target for all of them
    (tokenizing, and the tails). `tail_tokens` > 0 asks the target (offline) for that many tokens after
    each output: what the last step verifies past max_tokens (replay.Request.tail)."""
    read = []
    for path in paths:
        capture = load_capture(path)
        read.append((path, capture, target_dir_of(capture), *_usable_outputs(capture, path)))
    prompt_ids: dict[tuple[Path, str], tuple[int, ...]] = {}
    tails: dict[tuple[Path, tuple[int, ...], tuple[int, ...]], tuple[int, ...]] = {}
    for target in {entry[2] for entry in read}:
        mine = [entry for entry in read if entry[2] == target]
        wanted = sorted({o.prompt_id for entry in mine for o in entry[3]})
        conversations = [next(e[4][pid] for e in mine if pid in e[4]).chat_messages() for pid in wanted]
        for pid, ids in zip(wanted, models.tokenize(target, conversations), strict=True):
            prompt_ids[(target, pid)] = tuple(ids)
        if tail_tokens:
            sequences = sorted(
                {(prompt_ids[(target, o.prompt_id)], tuple(o.token_ids or ())) for e in mine for o in e[3]}
            )
            got = models.greedy_tails(
                target, [list(p) for p, _ in sequences], [list(o) for _, o in sequences], tail_tokens, dtype
            )
            for (p, o), tail in zip(sequences, got, strict=True):
                tails[(target, p, o)] = tuple(tail)
    inputs = []
    for _path, capture, target, usable, by_id, notes in read:
        requests = []
        warnings = list(notes)
        for o in usable:
            prompt, output = prompt_ids[(target, o.prompt_id)], tuple(o.token_ids or ())
            if o.prompt_tokens is not None and o.prompt_tokens != len(prompt):
                warnings.append(
                    f"{o.prompt_id}: the chat template gives {len(prompt)} prompt tokens, the server counted "
                    f"{o.prompt_tokens}"
                )
            requests.append(
                Request(
                    request_id=o.prompt_id,
                    stratum=o.workload or by_id[o.prompt_id].workload,
                    prompt=prompt,
                    output=output,
                    tail=tails.get((target, prompt, output), ()),
                )
            )
        inputs.append(CaptureInput(capture, tuple(requests), target, tuple(warnings)))
    return inputs
