"""EAGLE-3 heads derived from models/tiny-eagle3 for the hot-swap tests and benchmarks/hot_swap.py: other
weights (written by the engine's own torch and safetensors: the app's venv has no torch), other configs, and
corrupt files; and the greedy completions both use to see which head drafts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx

from tasks.launch.base import Deployment
from tasks.metrics.prometheus import scrape, spec_decode_delta

REPO = Path(__file__).resolve().parent.parent
BASE_HEAD = REPO / "models" / "tiny-eagle3"
# What a head directory needs besides its weights (its card is not copied: a derived head has none).
_COPIED = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

_TRANSFORM = r"""
import sys, torch
from safetensors.torch import load_file, save_file
src, dst, how, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tensors = load_file(src)
g = torch.Generator().manual_seed(seed)
if how == "perturb":  # another head of the same shape: every weight moved by 20% of its spread
    for name, t in tensors.items():
        if t.is_floating_point() and t.ndim == 2:
            noise = torch.randn(t.shape, generator=g) * t.float().std() * 0.2
            tensors[name] = (t.float() + noise).to(t.dtype)
elif how == "permute_lm_head":  # drafts land on the wrong tokens: acceptance collapses
    lm = tensors["lm_head.weight"]
    tensors["lm_head.weight"] = lm[torch.randperm(lm.shape[0], generator=g)].contiguous()
elif how == "nan":  # a well-formed file whose fc weight is not finite
    fc = tensors["fc.weight"].clone()
    fc[0, 0] = float("nan")
    tensors["fc.weight"] = fc
else:
    raise SystemExit(f"unknown transform {how}")
save_file(tensors, dst, metadata={"format": "pt"})
"""


def copy_head(dst: Path, src: Path = BASE_HEAD) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in _COPIED:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return dst


def derive_head(engine_python: Path, dst: Path, how: str, *, seed: int = 0, src: Path = BASE_HEAD) -> Path:
    """A copy of `src` whose weights are transformed (`perturb`, `permute_lm_head`, `nan`)."""
    copy_head(dst, src)
    subprocess.run(
        [str(engine_python), "-c", _TRANSFORM, str(src / "model.safetensors"), str(dst / "model.safetensors"), how,
         str(seed)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    return dst


def truncated_head(dst: Path, src: Path = BASE_HEAD, cut: int = 4096) -> Path:
    """A copy whose safetensors file lost its last `cut` bytes: the header (all the contract reads) is
    intact, the weights are not."""
    copy_head(dst, src)
    data = (src / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[:-cut])
    return dst


def reconfigured_head(dst: Path, changes: dict[str, object], src: Path = BASE_HEAD) -> Path:
    """A copy with the same weights and `changes` applied to its config.json."""
    copy_head(dst, src)
    shutil.copy2(src / "model.safetensors", dst / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


# Code prompts whose greedy answers the heads draft: a head that lands on wrong tokens shows in acceptance.
PROMPTS = ["def fibonacci(n):", "import os\n\ndef list_files(path):", "class Stack:\n    def __init__(self):"]


def greedy(
    deployment: Deployment, prompts: list[str], max_tokens: int = 32
) -> tuple[list[list[int]], int, int]:
    """Token ids of each greedy completion, and the accepted / drafted tokens they took."""
    before = scrape(deployment.metrics_url)
    outputs = []
    for prompt in prompts:
        response = httpx.post(
            f"{deployment.base_url}/v1/completions",
            json={
                "model": deployment.served_model_name,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "return_token_ids": True,
            },
            timeout=120,
        )
        response.raise_for_status()
        outputs.append(response.json()["choices"][0]["token_ids"])
    delta = spec_decode_delta(before, scrape(deployment.metrics_url), deployment.served_model_name)
    return outputs, int(delta.accepted_tokens), int(delta.draft_tokens)
