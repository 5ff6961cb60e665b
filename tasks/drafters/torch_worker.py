"""What the two torch workers share: tasks/drafters/head_worker.py (drafter training) and
analysis/simulate/model_worker.py (the simulator's model side). Both run under a Python that has torch and
transformers but not specgauge (the engine's venv, a cluster's Python), as scripts; so this module imports
nothing from specgauge either, and they import it by its folder on sys.path (`import torch_worker`), not as
`tasks.drafters.torch_worker`.

- `run_once`: one JSON request on stdin (`op` says which of the worker's ops), its answer on stdout.
- `chat_prompt_ids`: prompt ids with the chat template applied as vLLM's chat endpoint does.
- `new_head` / `load_head_weights`: an EAGLE-3 head for a target (models/train_eagle3.py), and a trained
  head's weights loaded into it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"

Op = Callable[[dict[str, Any]], dict[str, Any]]


def train_eagle3():
    """models/train_eagle3.py: the head, its training objective and the target's loading."""
    sys.path.insert(0, str(MODELS_DIR))
    import train_eagle3

    return train_eagle3


def run_once(ops: dict[str, Op]) -> int:
    """Answer the one request on stdin, torch using the threads it asks for (1 by default)."""
    import torch

    request = json.load(sys.stdin)
    torch.set_num_threads(int(request.get("threads", 1)))
    answer = ops[request["op"]](request)
    json.dump(answer, sys.stdout)
    return 0


def chat_prompt_ids(tokenizer, conversations: list[list[dict[str, Any]]]) -> list[list[int]]:
    """The prompt ids of each conversation: `apply_chat_template(messages, add_generation_prompt=True)`, no
    extra special tokens, as vLLM's chat endpoint does."""
    prompts = []
    for messages in conversations:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        prompts.append([int(t) for t in ids])
    return prompts


def new_head(target, target_dir: Path, aux_layers: list[int]) -> tuple[dict[str, Any], Any]:
    """(the head's config.json, a new head) for `target`, reading `aux_layers` and sharing the target's
    embeddings and lm_head."""
    te = train_eagle3()
    config = te.head_config_for(json.loads((target_dir / "config.json").read_text()), aux_layers)
    head = te.build_head(config, target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach())
    return config, head


def load_head_weights(head, folder: str | Path) -> None:
    """Load `folder`/model.safetensors into `head`; SystemExit when the weights do not fit it (the
    embeddings may be missing: the head shares the target's)."""
    from safetensors.torch import load_file

    # load_state_dict casts each tensor to its parameter's dtype
    missing, unexpected = head.load_state_dict(
        load_file(str(Path(folder) / "model.safetensors")), strict=False
    )
    if unexpected or any(not name.startswith("embed_tokens") for name in missing):
        raise SystemExit(f"{folder}: weights do not fit the head: missing {missing}, unexpected {unexpected}")
