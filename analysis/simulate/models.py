"""Running the model side (model_worker.py) from the application, which has no torch.

The worker runs under the first Python that has torch and transformers: this one, else the engine's
(`SPECGAUGE_ENGINE_PYTHON`, `.engine-venv/bin/python`). One process per call, JSON in and out (or one process for every call of a `worker_session()` block); the
answers of a call are cached on disk under SPECGAUGE_HOME/cache/simulate/, keyed by the request and the
model files' sizes and times, so a second replay of the same campaign does not run the models again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specgauge.errors import InputError
from specgauge.settings import get_settings
from specgauge.worker_python import python_with, run_script, worker_env

WORKER = Path(__file__).resolve().with_name("model_worker.py")
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja")


class ModelWorkerError(InputError):
    """The model worker could not run or failed; the message carries its stderr's end."""


def model_python() -> Path:
    """An interpreter with torch and transformers, or ModelWorkerError saying where it looked."""
    return python_with(("torch", "transformers"), ModelWorkerError)


def _fingerprint(paths: list[str]) -> list[list[Any]]:
    """Size and mtime of each model folder's files: a changed model is a different cache entry."""
    prints = []
    for folder in paths:
        for name in MODEL_FILES:
            file = Path(folder) / name
            if file.exists():
                stat = file.stat()
                prints.append([str(file), stat.st_size, stat.st_mtime_ns])
    return prints


def _run_once(payload: str, op: str) -> dict[str, Any]:
    """One op in a process of its own."""
    python = model_python()
    done = run_script(python, WORKER, payload)
    if done.returncode != 0:
        raise ModelWorkerError(
            f"model worker ({python} {WORKER}, op {op}) failed with exit {done.returncode}: "
            f"{done.stderr.strip()[-1500:]}"
        )
    return json.loads(done.stdout)


class _Session:
    """One worker process (`model_worker.py --serve`) answering every op of a `worker_session()` block,
    started at the first op the cache cannot answer: torch and transformers are imported once (1-3 min
    on 2 busy cores) instead of once per op."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None
        # a file, not a pipe: a full pipe would block the worker; closed in close()
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115

    def ask(self, payload: str, op: str) -> dict[str, Any]:
        if self.process is None:
            self.process = subprocess.Popen(
                [str(model_python()), str(WORKER), "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                text=True,
                env=worker_env(),
            )
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(payload + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:
            line = ""
        answer = json.loads(line) if line.strip() else None
        if answer is None or "error" in answer:
            self.stderr.seek(0)
            why = answer["error"] if answer else f"exit {self.process.poll()}: " + self.stderr.read()[-1500:]
            raise ModelWorkerError(f"model worker ({WORKER} --serve, op {op}) failed: {why}")
        return answer

    def close(self) -> None:
        if self.process is not None:
            if self.process.stdin:
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()


_session: _Session | None = None


@contextmanager
def worker_session() -> Iterator[None]:
    """Within the block, every uncached model op goes to one worker process (started on first use)."""
    global _session
    if _session is not None:  # nested: the outer session serves
        yield
        return
    _session = _Session()
    try:
        yield
    finally:
        session, _session = _session, None
        session.close()


def run_worker(request: dict[str, Any], *, model_dirs: list[str], cache: bool = True) -> dict[str, Any]:
    """Run one worker op; `model_dirs` are the folders it reads (for the cache key)."""
    payload = json.dumps(request, sort_keys=True)
    key = hashlib.sha256((payload + json.dumps(_fingerprint(model_dirs))).encode()).hexdigest()[:32]
    cache_file = get_settings().home / "cache" / "simulate" / f"{request['op']}-{key}.json"
    if cache and cache_file.is_file():
        return json.loads(cache_file.read_text())
    answer = (
        _session.ask(payload, request["op"]) if _session is not None else _run_once(payload, request["op"])
    )
    if cache:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(answer))
        tmp.replace(cache_file)
    return answer


def tokenize(tokenizer_dir: Path, conversations: list[list[dict[str, str]]]) -> list[list[int]]:
    """Prompt ids as vLLM's chat endpoint makes them (chat template, generation prompt)."""
    answer = run_worker(
        {"op": "tokenize", "tokenizer": str(tokenizer_dir), "conversations": conversations},
        model_dirs=[str(tokenizer_dir)],
    )
    return answer["prompts"]


def _sequences(prompts: list[list[int]], outputs: list[list[int]]) -> list[dict[str, list[int]]]:
    return [{"prompt": p, "output": o} for p, o in zip(prompts, outputs, strict=True)]


def _one_model_op(
    op: str, model_dir: Path, prompts: list[list[int]], outputs: list[list[int]], dtype: str, **params: int
) -> dict[str, Any]:
    """A worker op of one model over (prompt, output) sequences."""
    request = {"op": op, "model": str(model_dir), "sequences": _sequences(prompts, outputs), "dtype": dtype}
    return run_worker(request | params, model_dirs=[str(model_dir)])


def greedy_tails(
    target_dir: Path, prompts: list[list[int]], outputs: list[list[int]], tokens: int, dtype: str
) -> list[list[int]]:
    """The target's greedy continuation of each output by `tokens` tokens."""
    return _one_model_op("continue", target_dir, prompts, outputs, dtype, tokens=tokens)["tails"]


def draft_ranks(
    draft_dir: Path, prompts: list[list[int]], outputs: list[list[int]], top: int, dtype: str
) -> list[list[list[int]]]:
    """Per sequence: ranks[i] = the draft model's top-`top` ids for output token i."""
    return _one_model_op("draft_ranks", draft_dir, prompts, outputs, dtype, top=top)["ranks"]


def eagle_ranks(
    target_dir: Path,
    head_dir: Path,
    prompts: list[list[int]],
    outputs: list[list[int]],
    top: int,
    steps: int,
    dtype: str,
) -> list[list[list[list[int]]]]:
    """Per sequence: ranks[j][i] = the EAGLE-3 head's top-`top` ids of step j for output token i."""
    answer = run_worker(
        {
            "op": "eagle_ranks",
            "target": str(target_dir),
            "head": str(head_dir),
            "sequences": _sequences(prompts, outputs),
            "top": top,
            "steps": steps,
            "dtype": dtype,
        },
        model_dirs=[str(target_dir), str(head_dir)],
    )
    return answer["ranks"]
