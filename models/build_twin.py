"""Build the cost twin of tiny-target (and of its EAGLE-3 heads): the same function, the cost of a wider model.

The tiny target's decode step is so cheap on a CPU that drafting never pays: the step does not grow with the
batch, so speculation only adds work. A served 70B model on a GPU is the opposite: at small batches its step is
bound by reading the weights, so verifying k+1 tokens costs about what one does, and speculation pays until the
batch makes the step compute-bound. The twin gives the embedded engine that shape without new training:

- every weight matrix of tiny-target is zero-padded to `hidden` x `intermediate` (the new rows and columns are
  zero; attention keeps head_dim 64 and gains all-zero heads), so the residual stream carries the original
  values in its first 320 dimensions and zeros elsewhere;
- each RMSNorm weight is scaled by sqrt(320 / hidden) and its eps by 320 / hidden: the mean of squares over the
  wider, zero-padded vector is 320 / hidden of the original, so the normalised values are the original ones;
- served in float32, the step reads `hidden`-sized weights for every token batch, as a large model does.

An EAGLE-3 head reads the target's residual stream at its aux layers and shares its embeddings, so it is
widened the same way (its fused input `fc` and the [embedding; state] concatenation of its q/k/v padded block
by block) and keeps its function on the twin. The draft model is a separate model with the same vocabulary
and is served as it is.

Deterministic: the same inputs give the same bytes; `EXPECTED_SHA256` pins them and `build()` checks it.

    .engine-venv/bin/python models/build_twin.py            # build (a no-op when already built and intact)
    .engine-venv/bin/python models/build_twin.py --check    # greedy and logits against tiny-target
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MODELS = Path(__file__).resolve().parent
HIDDEN = 1536  # chosen by measurement: docs/decision.md "Choosing the twin's width"
INTERMEDIATE = 4096
HEAD_DIM = 64
DTYPE = "float32"  # bfloat16 on a CPU is compute-bound from C=1, which no GPU-served large model is

# (source folder, twin folder); the twin folder is built, never committed (.gitignore).
PAIRS = {
    "target": ("tiny-target", "twin-target"),
    "eagle3": ("tiny-eagle3", "twin-eagle3"),
}
EXPECTED_SHA256 = {
    "twin-target": "bca8ace43f4e6f04d2ad19d1219d75718c66f1ddc24a53cb6c793178b363bf45",
    "twin-eagle3": "be91e42fb7cb3a8b5e9eda82e97a4531128cd8871f35593bb0562e86a72cb760",
}
COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pad(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`tensor` in the top-left corner of a zero tensor of `shape` (float32)."""
    out = torch.zeros(shape, dtype=torch.float32)
    out[tuple(slice(0, n) for n in tensor.shape)] = tensor.float()
    return out


def pad_blocks(tensor: torch.Tensor, rows: int, old_block: int, new_block: int) -> torch.Tensor:
    """A [rows_old, n * old_block] matrix whose columns are n concatenated inputs, each input padded from
    old_block to new_block columns: [rows, n * new_block]."""
    blocks = tensor.shape[1] // old_block
    out = torch.zeros((rows, blocks * new_block), dtype=torch.float32)
    for i in range(blocks):
        part = tensor[:, i * old_block : (i + 1) * old_block].float()
        out[: tensor.shape[0], i * new_block : i * new_block + old_block] = part
    return out


def widen(name: str, tensor: torch.Tensor, old_hidden: int, hidden: int, intermediate: int) -> torch.Tensor:
    """One tensor of tiny-target or its EAGLE-3 head, widened (see the module docstring)."""
    norm_scale = math.sqrt(old_hidden / hidden)
    heads_width = hidden // HEAD_DIM * HEAD_DIM
    if name.endswith("norm.weight"):  # every RMSNorm: input, post-attention, hidden_norm, final norm
        return pad(tensor.float() * norm_scale, (hidden,))  # in float32: bf16 would round it
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        if tensor.shape[1] == 2 * old_hidden:  # EAGLE-3 midlayer: input is [embedding; fused state]
            return pad_blocks(tensor, heads_width, old_hidden, hidden)
        return pad(tensor, (heads_width, hidden))
    if name.endswith("o_proj.weight"):
        return pad(tensor, (hidden, heads_width))
    if name.endswith(("gate_proj.weight", "up_proj.weight")):
        return pad(tensor, (intermediate, hidden))
    if name.endswith("down_proj.weight"):
        return pad(tensor, (hidden, intermediate))
    if name == "fc.weight":  # EAGLE-3: three aux states concatenated
        return pad_blocks(tensor, hidden, old_hidden, hidden)
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return pad(tensor, (tensor.shape[0], hidden))
    raise ValueError(f"no widening rule for tensor {name} {tuple(tensor.shape)}")


def widened_config(config: dict, hidden: int, intermediate: int) -> dict:
    out = dict(config)
    old_hidden = int(config["hidden_size"])
    out.update(
        # mean(x^2) over the padded vector is old/new of the original's: eps scaled alike keeps the norm exact
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)) * old_hidden / hidden,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=hidden // HEAD_DIM,
        num_key_value_heads=hidden // HEAD_DIM,
        head_dim=HEAD_DIM,
        dtype=DTYPE,
    )
    if "target_hidden_size" in out:
        out["target_hidden_size"] = hidden
    return out


def build_one(source: Path, out: Path, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE) -> Path:
    """Widen the model in `source` into `out` (written whole, then renamed); returns the safetensors path."""
    config = json.loads((source / "config.json").read_text())
    old_hidden = int(config["hidden_size"])
    tensors = load_file(source / "model.safetensors")
    widened = {
        name: widen(name, tensors[name], old_hidden, hidden, intermediate).contiguous()
        for name in sorted(tensors)
    }
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file(widened, partial / "model.safetensors", metadata={"format": "pt"})
    (partial / "config.json").write_text(
        json.dumps(widened_config(config, hidden, intermediate), indent=2) + "\n"
    )
    for name in COPIED:
        if (source / name).exists():
            shutil.copyfile(source / name, partial / name)
    (partial / "README.md").write_text(model_card(source.name, out.name, old_hidden, hidden, intermediate))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out / "model.safetensors"


def model_card(source: str, name: str, old_hidden: int, hidden: int, intermediate: int) -> str:
    return (
        f"# {name}: the cost twin of {source} (built by ../build_twin.py, not committed)\n\n"
        f"The same function as `{source}` up to float rounding, with the cost of a model about "
        f"{(hidden / old_hidden) ** 2:.0f} times larger per token: every matrix zero-padded from width "
        f"{old_hidden} to {hidden} (MLP to {intermediate}), each RMSNorm weight scaled by "
        f"sqrt({old_hidden}/{hidden}) so the normalised stream is unchanged, weights in {DTYPE}. "
        "Speculation measured on it says what a model whose decode step is bound by reading its weights "
        f'would gain; the tokens it produces are `{source}`\'s. See ../README.md, "The cost twin".\n'
    )


def build(models: Path = MODELS, *, verify: bool = True) -> dict[str, str]:
    """Build every twin that is missing or whose bytes differ from EXPECTED_SHA256; return name -> sha256."""
    sums = {}
    for source_name, twin_name in PAIRS.values():
        twin = models / twin_name / "model.safetensors"
        expected = EXPECTED_SHA256.get(twin_name)
        if not (twin.exists() and expected and sha256_of(twin) == expected):
            build_one(models / source_name, models / twin_name)
        sums[twin_name] = sha256_of(twin)
        if verify and expected and sums[twin_name] != expected:
            raise SystemExit(
                f"error: {twin}: sha256 {sums[twin_name]} is not the recorded {expected} "
                "(torch or safetensors wrote other bytes: check the versions in .engine-venv)"
            )
    return sums


def check(models: Path = MODELS, prompts: int = 8, new_tokens: int = 8) -> dict[str, float]:
    """Run tiny-target and the twin on the same token ids (transformers, float32): the share of positions with
    the same greedy next token, and the largest absolute logit difference."""
    from transformers import AutoModelForCausalLM

    small = AutoModelForCausalLM.from_pretrained(models / "tiny-target", dtype=torch.float32).eval()
    twin = AutoModelForCausalLM.from_pretrained(models / "twin-target", dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, small.config.vocab_size, (prompts, new_tokens + 8), generator=generator)
    with torch.no_grad():
        a = small(ids).logits
        b = twin(ids).logits
    same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return {
        "positions": float(a.shape[0] * a.shape[1]),
        "argmax_equal": same,
        "max_abs_logit_diff": (a - b).abs().max().item(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare the built twin with tiny-target")
    parser.add_argument("--no-verify", action="store_true", help="do not compare with EXPECTED_SHA256")
    args = parser.parse_args(argv)
    if args.check:
        print(json.dumps(check(), indent=2))
        return 0
    for name, digest in build(verify=not args.no_verify).items():
        print(f"{name}: sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
