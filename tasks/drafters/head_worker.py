"""The torch side of drafter training, run by a Python that has torch, transformers and safetensors (the
engine's venv on the embedded setup; the cluster's Python in a batch job). It imports nothing from
specgauge, so any such interpreter runs it as a script: `python head_worker.py < request.json > answer.json`.

Ops (one JSON object on stdin, `op` says which):
- `tokenize`: the prompt ids of each conversation, the chat template applied as vLLM's chat endpoint does.
- `hidden_states`: per sequence (prompt ids + the target's output ids), the target's residual stream at
  the head's aux layers (transformers' `output_hidden_states`: id i = the stream after i decoder layers,
  as vLLM numbers them) and its final normed state (the target's next-token distribution is
  `lm_head(final)`), written to one safetensors file (`aux.<n>` [T, len(aux) x hidden], `final.<n>`
  [T, hidden], bfloat16).
- `train`: train a new head or fine-tune a parent with models/train_eagle3.py's head and objective (the
  training-time test over k draft steps, soft cross-entropy to the target), reading the stored states
  instead of running the target; keeps the step with the best held-out simulated acceptance length;
  writes the head folder vLLM loads (model.safetensors, config.json, the target's tokenizer files) and
  the curve as JSON lines.

The training sets and curves it reads and writes are described in tasks/drafters/training_data.py and
tasks/drafters/training.py, which run it.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

# What both torch workers share, beside this file (on sys.path already when run as a script; not when this
# file is imported as a module): see torch_worker's docstring.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_worker

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tokenize(request: dict[str, Any]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(request["tokenizer"])
    prompts = torch_worker.chat_prompt_ids(tokenizer, request["conversations"])
    encoded = (
        [
            [int(t) for t in ids]
            for ids in tokenizer(request.get("texts", []), add_special_tokens=False)["input_ids"]
        ]
        if request.get("texts")
        else []
    )
    return {"prompts": prompts, "texts": encoded}


def hidden_states(request: dict[str, Any]) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file

    te = torch_worker.train_eagle3()
    device = torch.device(request.get("device", "cpu"))
    target = _compute_dtype(te.load_target(Path(request["target"]), device), device)
    aux_layers = sorted(int(i) for i in request["aux_layers"])
    layers = target.config.num_hidden_layers
    if any(i < 0 or i >= layers for i in aux_layers):
        raise SystemExit(f"aux layers {aux_layers}: the target has ids 0..{layers - 1} (0 = embeddings)")
    tensors: dict[str, Any] = {}
    started = time.time()
    with torch.no_grad():
        for n, seq in enumerate(request["sequences"]):
            ids = torch.tensor([seq], device=device)
            states = target(input_ids=ids, output_hidden_states=True).hidden_states
            tensors[f"aux.{n}"] = (
                torch.cat([states[i][0] for i in aux_layers], dim=-1).to(torch.bfloat16).cpu()
            )
            tensors[f"final.{n}"] = states[-1][0].to(torch.bfloat16).cpu().contiguous()
    save_file(tensors, request["out"], metadata={"aux_layers": json.dumps(aux_layers)})
    return {"sequences": len(request["sequences"]), "seconds": round(time.time() - started, 2)}


def _compute_dtype(module, device):
    """float32 on a CPU: its bfloat16 matrix products ran 14x slower than float32 on this project's
    machines (2026-12-02, torch 2.13 CPU); bfloat16 (as loaded) elsewhere."""
    return module.float() if device.type == "cpu" else module


def _autocast(device):
    import contextlib

    import torch

    return (
        contextlib.nullcontext()
        if device.type == "cpu"
        else torch.autocast(device.type, dtype=torch.bfloat16)
    )


class StoredFeatures:
    """A batch's aux states and the target's logits from a training set's stored states."""

    def __init__(self, path: str, target, device) -> None:
        from safetensors import safe_open

        self.file = safe_open(path, framework="pt", device="cpu")
        self.norm_free_head = target.lm_head  # the final state is already normed
        self.device = device

    def batch(self, rows: list[int], width: int):
        import torch

        aux = [self.file.get_tensor(f"aux.{i}") for i in rows]
        final = [self.file.get_tensor(f"final.{i}") for i in rows]
        aux_out = torch.zeros(len(rows), width, aux[0].shape[1], dtype=torch.bfloat16)
        final_out = torch.zeros(len(rows), width, final[0].shape[1], dtype=torch.bfloat16)
        for r, (a, f) in enumerate(zip(aux, final, strict=True)):
            aux_out[r, : a.shape[0]] = a
            final_out[r, : f.shape[0]] = f
        dtype = self.norm_free_head.weight.dtype
        aux_out, final_out = aux_out.to(self.device, dtype), final_out.to(self.device, dtype)
        with torch.no_grad():
            logits = self.norm_free_head(final_out.to(self.norm_free_head.weight.dtype))
        return aux_out, logits


def _head_to_train(request: dict[str, Any], target, device) -> tuple[dict[str, Any], Any]:
    """(config.json, the head on `device`): a new head, or the parent's weights to fine-tune."""
    aux_layers = sorted(int(i) for i in request["aux_layers"])
    config, head = torch_worker.new_head(target, Path(request["target"]), aux_layers)
    parent = request.get("parent")
    if parent:
        torch_worker.load_head_weights(head, parent)
    return config, head.to(device)


def _optimizer(head, hp: dict[str, Any]):
    """(trainable parameters, AdamW, its scheduler): the learning rate warms up linearly over the first 5% of
    the steps, then follows a half cosine down to 5% of its peak."""
    import torch

    total_steps = int(hp["steps"])
    trainable = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=float(hp["lr"]), betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(total_steps // 20, 1)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        span = max(total_steps - warmup, 1)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / span))

    return trainable, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def _batch_loss(te, head, batch, decay: list[float], prompt_weight: float):
    """(train_eagle3's training-time-test loss over len(decay) draft steps, each step's own loss rounded)."""
    ids, lengths, prompt_lengths, aux, teacher = batch
    logits = head(aux, ids, len(decay))
    total, parts, _ = te.ttt_loss(logits, teacher, ids, lengths, prompt_lengths, decay, prompt_weight)
    return total, parts


def _write_head(out: Path, state: dict[str, Any], config: dict[str, Any], target_dir: Path) -> None:
    """The head folder vLLM loads: weights, config.json and the target's tokenizer files."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:  # the target's files, byte for byte: the tokenizer hash must match
        if (target_dir / name).exists():
            shutil.copyfile(target_dir / name, out / name)


def train(request: dict[str, Any]) -> dict[str, Any]:
    import torch

    te = torch_worker.train_eagle3()
    hp = request["hyperparameters"]
    seed = int(hp.get("seed", 0))
    torch.manual_seed(seed)  # before the new head's weights are drawn
    device = torch.device(request.get("device", "cpu"))
    target_dir = Path(request["target"])
    target = _compute_dtype(te.load_target(target_dir, device), device)
    config, head = _head_to_train(request, target, device)
    features = StoredFeatures(request["states"], target, device)
    examples = [(e["ids"], e["prompt_len"], e["stratum"]) for e in request["examples"]]
    train_rows = [i for i, e in enumerate(request["examples"]) if not e["held_out"]]
    held_rows = [i for i, e in enumerate(request["examples"]) if e["held_out"]]
    pad = int(request["pad"])
    steps_k = int(hp["ttt_steps"])
    decay = [float(hp["step_decay"]) ** j for j in range(steps_k)]
    prompt_weight = float(hp["prompt_weight"])
    total_steps = int(hp["steps"])
    trainable, optimizer, scheduler = _optimizer(head, hp)
    rng = random.Random(seed)
    batch_tokens = int(hp["batch_tokens"])
    train_examples = [examples[i] for i in train_rows]
    held_examples = [examples[i] for i in held_rows]
    held_batches = te.length_batches(held_examples, batch_tokens, random.Random(0))

    def held_out() -> dict[str, Any] | None:
        if not held_examples:
            return None
        remapped = [[held_rows[i] for i in rows] for rows in held_batches]
        return te.evaluate(
            head, None, None, examples, remapped, steps=steps_k, pad=pad, device=device,
            prompt_weight=prompt_weight, features=lambda rows, ids: features.batch(rows, ids.shape[1]),
        )  # fmt: skip

    curve: list[dict[str, Any]] = []
    started = time.time()
    first = held_out()
    best = {"score": first["simulated_acceptance_length_all"] if first else -1.0, "step": -1, "state": None}
    best["state"] = head.vllm_state_dict()
    curve.append(
        {"step": -1, "loss": None, "loss_per_step": [], "lr": 0.0, "seconds": 0.0, "held_out": first}
    )
    batches: list[list[int]] = []
    eval_every = max(int(hp["eval_every"]), 1)
    autocast = _autocast(device)
    for step in range(total_steps):
        if not batches:
            batches = te.length_batches(train_examples, batch_tokens, rng)
        rows = [train_rows[i] for i in batches.pop()]
        ids, lengths, prompt_lengths = te.collate(examples, rows, pad, device)
        aux, teacher = features.batch(rows, ids.shape[1])
        with autocast:
            total, parts = _batch_loss(
                te, head, (ids, lengths, prompt_lengths, aux, teacher), decay, prompt_weight
            )
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        entry: dict[str, Any] = {
            "step": step,
            "loss": round(float(total.item()), 4),
            "loss_per_step": parts,
            "lr": lr,
            "seconds": round(time.time() - started, 2),
            "held_out": None,
        }
        if (step + 1) % eval_every == 0 or step == total_steps - 1:
            entry["held_out"] = held_out()
            score = entry["held_out"]["simulated_acceptance_length_all"] if entry["held_out"] else 0.0
            if entry["held_out"] is None or score > best["score"]:
                best = {"score": score, "step": step, "state": head.vllm_state_dict()}
        curve.append(entry)
        print(f"[train] {json.dumps(entry)}", file=sys.stderr, flush=True)
    _write_head(Path(request["out"]), best["state"], config, target_dir)
    return {
        "curve": curve,
        "kept_step": best["step"],
        "held_out_initial": first,
        "held_out_kept": next((c["held_out"] for c in curve if c["step"] == best["step"]), first),
        "train_examples": len(train_rows),
        "held_out_examples": len(held_rows),
        "train_seconds": round(time.time() - started, 2),
        "device": str(device),
        "torch": torch.__version__,
    }


OPS = {"tokenize": tokenize, "hidden_states": hidden_states, "train": train}


if __name__ == "__main__":
    raise SystemExit(torch_worker.run_once(OPS))
