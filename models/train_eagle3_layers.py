"""Train an EAGLE-3 head with more than one decoder layer (the shallow-drafters study, issue 33) with
`train_eagle3.py`'s trainer: its data (the target's greedy answers), its training-time-test objective, its
held-out check, its best-step rule and its saving, all run by `train_eagle3.main`. Only the head differs:

- N layers in vLLM 0.32's multi-layer shape (`vllm/model_executor/models/llama_eagle3.py`): layer 0 is
  train_eagle3's `midlayer` (reads [token embedding; fused state], 2 x hidden in); layers 1.. read the
  stream with the fused add-norm (`input_layernorm(h, residual)`), q/k/v from hidden in, and the final
  norm takes h + residual. Saved as `layers.<i>.*` (vLLM's loader names; `midlayer.` is its alias of
  `layers.0.`), each with a `hidden_norm.weight` of ones, which vLLM builds in every layer and expects.
- Warm start (`--parent`): layer 0, fc, norm and lm_head from a trained 1-layer head, the added layers
  with o_proj and down_proj at zero, so step 0 is the parent's function exactly and the trainer's
  best-step rule keeps the parent's quality at worst. Why: on a 2-core CPU the budget is minutes.
- On a CPU the target and the training run in float32 (train_eagle3.main autocasts to bfloat16, whose
  matrix products ran 14x slower than float32 on this project's CPUs: models/README.md); elsewhere as is.

```sh
# the head as training starts it (the parent's function, the added layer the identity): no target run
.engine-venv/bin/python models/train_eagle3_layers.py --layers 2 --parent models/tiny-eagle3 --init-only \
    --out models/tiny-eagle3-2layer
# trained (on a GPU as train_eagle3.py's README command; on a CPU with fewer prompts and steps)
.engine-venv/bin/python models/train_eagle3_layers.py --layers 2 --parent models/tiny-eagle3 \
    --out /tmp/tiny-eagle3-2layer --device cuda --steps 600 --lr 3e-4
```
Every option but `--layers`, `--parent` and `--init-only` is train_eagle3.py's (`--help` there).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import train_eagle3  # beside this file: a script's folder is first on sys.path


def deep_head_config(layers: int):
    """train_eagle3.head_config_for with `num_hidden_layers` = layers."""
    original = train_eagle3.head_config_for

    def head_config_for(target_config: dict, aux_layers: list[int]) -> dict:
        return {**original(target_config, aux_layers), "num_hidden_layers": layers}

    return head_config_for


def deep_head_builder(layers: int, parent: Path | None):
    """A build_head for train_eagle3.main: its 1-layer head plus layers 1..N-1, warm-started from
    `parent` when given."""
    original = train_eagle3.build_head

    def build_head(head_config: dict, embed_weight, lm_head_init):
        import torch
        from safetensors.torch import load_file
        from torch import nn

        head = original(head_config, embed_weight, lm_head_init)
        template = head.midlayer
        hidden = head_config["hidden_size"]
        added = nn.ModuleDict()
        for index in range(1, layers):
            layer = type(template)()
            attn = layer.self_attn
            for name in ("q_proj", "k_proj", "v_proj"):  # layers after the first read the stream only
                old = getattr(attn, name)
                setattr(attn, name, nn.Linear(hidden, old.out_features, bias=False))
            added[str(index)] = layer
        head.layers = added  # state_dict names `layers.<i>.*`, as vLLM loads them
        head.__class__ = _multi_layer_class(type(head))
        if parent is not None:
            missing, unexpected = head.load_state_dict(
                load_file(str(parent / "model.safetensors")), strict=False
            )
            if unexpected or any(not n.startswith(("embed_tokens", "layers.")) for n in missing):
                raise SystemExit(f"{parent}: not a 1-layer head of this shape: {missing} {unexpected}")
            with torch.no_grad():
                for layer in added.values():  # the added layers start as the identity on the stream
                    layer.self_attn.o_proj.weight.zero_()
                    layer.mlp.down_proj.weight.zero_()
        return head

    return build_head


def _multi_layer_class(base):
    import torch
    import torch.nn.functional as F

    class MultiLayerEagle3Head(base):
        def _attend(self, layer, x, positions, cache, mask):
            """q/k/v of `x` (rotated), attention over this layer's cache of earlier steps, o_proj."""
            config = self.midlayer.self_attn
            batch, length, _ = x.shape
            heads = config.o_proj.in_features // self.head_dim
            kv_heads = config.k_proj.out_features // self.head_dim
            attn = layer.self_attn
            q = attn.q_proj(x).view(batch, length, heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(batch, length, kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(batch, length, kv_heads, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, positions), self.rope(k, positions)
            cache[0].append(k)
            cache[1].append(v)
            if mask is None:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(
                    q, torch.cat(cache[0], dim=2), torch.cat(cache[1], dim=2), attn_mask=mask
                )
            return attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))

        def forward(self, aux, input_ids, steps: int):
            """train_eagle3's training-time test (see its Eagle3Head.forward) through every layer; each
            layer keeps its own keys and values of the earlier steps, as vLLM's KV cache does."""
            batch, length = input_ids.shape
            arange = torch.arange(length, device=input_ids.device)
            shifted = torch.cat([input_ids, input_ids.new_zeros(batch, steps)], dim=1)
            hidden_in = self.fc(aux)
            stack = [self.midlayer, *self.layers.values()]
            caches: list[tuple[list, list]] = [([], []) for _ in stack]
            causal = torch.ones(length, length, dtype=torch.bool, device=aux.device).tril()
            diagonal = torch.eye(length, dtype=torch.bool, device=aux.device)
            all_logits = []
            for step in range(steps):
                positions = (arange + step).expand(batch, length)
                mask = None if step == 0 else torch.cat([causal] + [diagonal] * step, dim=1)
                first = self.midlayer
                embeds = first.input_layernorm(self.embed_tokens(shifted[:, 1 + step : 1 + step + length]))
                x = torch.cat([embeds, first.hidden_norm(hidden_in)], dim=-1)
                residual = self._attend(first, x, positions, caches[0], mask) + hidden_in
                h = first.mlp(first.post_attention_layernorm(residual))
                for layer, cache in zip(stack[1:], caches[1:], strict=True):
                    residual = h + residual  # vLLM's fused add-norm
                    residual = (
                        self._attend(layer, layer.input_layernorm(residual), positions, cache, mask)
                        + residual
                    )
                    h = layer.mlp(layer.post_attention_layernorm(residual))
                hidden_in = h + residual  # the pre-norm state the next step is fed
                all_logits.append(self.lm_head(self.norm(hidden_in)))
            return all_logits

    return MultiLayerEagle3Head


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the head (>= 1)")
    parser.add_argument("--parent", type=Path, default=None, help="a 1-layer head to warm-start from")
    parser.add_argument(
        "--init-only",
        action="store_true",
        help="save the warm-started head (the trainer's step 0) to --out without training; needs --parent",
    )
    args, rest = parser.parse_known_args(argv)
    if args.layers < 1:
        parser.error(f"--layers: must be >= 1, got {args.layers}")
    if args.init_only:
        if args.parent is None:
            parser.error("--init-only needs --parent")
        return save_warm_start(args.layers, args.parent, rest)
    import torch

    device = next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--device"), "auto")
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if on_cpu:
        load_target = train_eagle3.load_target
        train_eagle3.load_target = lambda path, dev: load_target(path, dev).float()
        autocast = torch.autocast
        torch.autocast = lambda kind, **kw: (
            contextlib.nullcontext() if kind == "cpu" else autocast(kind, **kw)
        )
    head_dim = None  # set from the head's config once it is known

    config_for = deep_head_config(args.layers)

    def head_config_for(target_config: dict, aux_layers: list[int]) -> dict:
        nonlocal head_dim
        config = config_for(target_config, aux_layers)
        head_dim = config["head_dim"]
        return config

    builder = deep_head_builder(args.layers, args.parent)

    def build_head(head_config: dict, embed_weight, lm_head_init):
        head = builder(head_config, embed_weight, lm_head_init)
        head.head_dim = head_dim
        head.rope = _rope(head_config)
        return head

    train_eagle3.head_config_for = head_config_for
    train_eagle3.build_head = build_head
    return train_eagle3.main(rest)


def save_warm_start(layers: int, parent: Path, rest: list[str]) -> int:
    """The head as training would start it (the parent's function exactly), saved as the trainer saves."""
    import json
    import shutil

    import torch
    from safetensors.torch import save_file

    options = argparse.ArgumentParser()
    options.add_argument("--target", type=Path, default=Path(train_eagle3.HERE) / "tiny-target")
    options.add_argument("--out", type=Path, required=True)
    options.add_argument("--aux-layers", default="1,3,5")
    options.add_argument("--seed", type=int, default=0)
    known, _ = options.parse_known_args(rest)
    torch.manual_seed(known.seed)  # the added layers' q/k/v, gate/up and norms: the same bytes on every run
    aux_layers = sorted(int(x) for x in known.aux_layers.split(","))
    config = deep_head_config(layers)(json.loads((known.target / "config.json").read_text()), aux_layers)
    target = train_eagle3.load_target(known.target, torch.device("cpu"))
    head = deep_head_builder(layers, parent)(
        config, target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    )
    known.out.mkdir(parents=True, exist_ok=True)
    save_file(head.vllm_state_dict(), str(known.out / "model.safetensors"), metadata={"format": "pt"})
    (known.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in train_eagle3.TOKENIZER_FILES:  # the target's files, byte for byte
        if (known.target / name).exists():
            shutil.copyfile(known.target / name, known.out / name)
    return 0


def _rope(head_config: dict):
    """train_eagle3's rotation (neox style, as vLLM's Llama), for q and k of shape (B, H, T, hd)."""
    import torch

    head_dim = head_config["head_dim"]
    theta = head_config["rope_parameters"]["rope_theta"]

    def rotate(x, positions):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=x.device).float() / head_dim))
        freqs = positions.float()[..., None] * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    return rotate


if __name__ == "__main__":
    raise SystemExit(main())
