"""Running the model side (model_worker.py) from the application, which has no torch.

The worker runs under the first Python that has torch and transformers: this one, else the engine's
(`SPECGAUGE_ENGINE_PYTHON`, `.engine-venv/bin/python`). One process per call, JSON in and out; the
answers of a call are cached on disk under SPECGAUGE_HOME/cache/simulate/, keyed by the request and the
model files' sizes and times, so a second replay of the same campaign does not run the models again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from specgauge.errors import InputError
from specgauge.settings import get_settings

WORKER = Path(__file__).resolve().with_name("model_worker.py")
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja")


class ModelWorkerError(InputError):
    """The model worker could not run or failed; the message carries its stderr's end."""


def model_python() -> Path:
    """An interpreter with torch and transformers, or ModelWorkerError saying where it looked."""
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        return Path(sys.executable)
    engine = get_settings().engine_python
    if Path(engine).exists():
        return Path(engine)
    raise ModelWorkerError(
        f"no Python with torch and transformers: this one ({sys.executable}) lacks them and the engine's "
        f"({engine}) does not exist; run `make engine` or set SPECGAUGE_ENGINE_PYTHON"
    )


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


def run_worker(request: dict[str, Any], *, model_dirs: list[str], cache: bool = True) -> dict[str, Any]:
    """Run one worker op; `model_dirs` are the folders it reads (for the cache key)."""
    payload = json.dumps(request, sort_keys=True)
    key = hashlib.sha256((payload + json.dumps(_fingerprint(model_dirs))).encode()).hexdigest()[:32]
    cache_file = get_settings().home / "cache" / "simulate" / f"{request['op']}-{key}.json"
    if cache and cache_file.is_file():
        return json.loads(cache_file.read_text())
    python = model_python()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run(
        [str(python), str(WORKER)], input=payload, capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise ModelWorkerError(
            f"model worker ({python} {WORKER}, op {request['op']}) failed with exit {done.returncode}: "
            f"{done.stderr.strip()[-1500:]}"
        )
    answer = json.loads(done.stdout)
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


def greedy_tails(
    target_dir: Path, prompts: list[list[int]], outputs: list[list[int]], tokens: int, dtype: str
) -> list[list[int]]:
    """The target's greedy continuation of each output by `tokens` tokens."""
    answer = run_worker(
        {
            "op": "continue",
            "model": str(target_dir),
            "sequences": _sequences(prompts, outputs),
            "tokens": tokens,
            "dtype": dtype,
        },
        model_dirs=[str(target_dir)],
    )
    return answer["tails"]


def draft_ranks(
    draft_dir: Path, prompts: list[list[int]], outputs: list[list[int]], top: int, dtype: str
) -> list[list[list[int]]]:
    """Per sequence: ranks[i] = the draft model's top-`top` ids for output token i."""
    answer = run_worker(
        {
            "op": "draft_ranks",
            "model": str(draft_dir),
            "sequences": _sequences(prompts, outputs),
            "top": top,
            "dtype": dtype,
        },
        model_dirs=[str(draft_dir)],
    )
    return answer["ranks"]


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
