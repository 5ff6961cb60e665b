"""EAGLE-3 heads derived from models/tiny-eagle3 for the hot-swap tests and benchmarks/hot_swap.py: other
weights (written by the engine's own torch and safetensors: the app's venv has no torch), other configs, and
corrupt files."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

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
