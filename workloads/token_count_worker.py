"""The tokenizer side of workloads/length_buckets.py, run as a script by a Python that has `transformers`
(the engine's venv: the application's venv does not carry it, and vLLM pins what it may import). It imports
nothing from specgauge, so the engine's Python runs it from its path.

    python workloads/token_count_worker.py TOKENIZER_DIR   # then one JSON request a line on stdin

Each request line gets one answer line on stdout:
- `{"op": "count", "conversations": [[message, ...], ...]}` -> `{"counts": [int, ...]}`: prompt tokens with the
  chat template applied as vLLM's chat endpoint applies it (`add_generation_prompt=True`, no extra special
  tokens), i.e. the `prompt_tokens` the server will report;
- `{"op": "encode", "texts": [...]}` -> `{"ids": [[int, ...], ...]}` (no special tokens);
- `{"op": "decode", "ids": [[int, ...], ...]}` -> `{"texts": [...]}`.
A request that fails answers `{"error": "..."}` and the worker goes on.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _count(tokenizer: Any, conversations: list[list[dict[str, str]]]) -> list[int]:
    counts = []
    for messages in conversations:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        counts.append(len(ids))
    return counts


def answer(tokenizer: Any, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "count":
        return {"counts": _count(tokenizer, request["conversations"])}
    if op == "encode":
        return {
            "ids": [list(ids) for ids in tokenizer(request["texts"], add_special_tokens=False)["input_ids"]]
        }
    if op == "decode":
        return {"texts": [tokenizer.decode(ids) for ids in request["ids"]]}
    return {"error": f"unknown op {op!r}"}


def main() -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = answer(tokenizer, json.loads(line))
        except Exception as exc:  # one bad request must not end the session: the caller reads the reason
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
