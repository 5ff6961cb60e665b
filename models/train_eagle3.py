"""Train the tiny EAGLE-3 head for models/tiny-target, in the exact shape vLLM runs it.

EAGLE-3 (Li et al., 2025) drafts with one decoder layer that reads the target's own features: the
residual stream at a low, a middle and a high layer of the target, concatenated and fused by `fc`, next to
the embedding of the token the target just produced. This script

1. builds the prompts of train.py's corpus (imported, not copied: CPython's standard library shaped into
   chat / code / summarization requests; held-out files stay held out),
2. self-distils: the target answers every training prompt greedily (as vLLM serves it in the demo), so the
   head learns the target's own distribution, not the human text's,
3. trains the head with the training-time-test (TTT) objective: step 0 reads the target's fused features;
   steps 1..K-1 read the head's own pre-norm output of the previous step and attend, like vLLM's drafter,
   to the step-0 keys of the context plus the keys of their own earlier steps; each step's soft labels are
   the target's next-token distribution at that position,
4. saves the head under vLLM's checkpoint names (`midlayer.*`, `fc.weight`, `norm.weight`, `lm_head.weight`;
   `embed_tokens` is left out, so vLLM shares the target's) with a config vLLM maps to
   `Eagle3LlamaForCausalLM`, and the target's tokenizer files.

What the module below mirrors (vllm 0.32, checked in the engine venv):
- model_executor/models/llama.py + interfaces.py (EagleModelMixin): aux layer id i is the residual stream
  `hidden_states + residual` after i decoder layers (id 0 = the embeddings, id 6 = the last layer's output
  before the final norm), i.e. the output of transformers' decoder layer i-1; the ids are sorted and
  concatenated in that order before `fc`.
- model_executor/models/llama_eagle3.py: `combine_hidden_states` = fc(cat(aux)); the layer takes
  cat([input_layernorm(embed(token)), hidden_norm(h)]) into q/k/v (2 x hidden wide), the residual is the
  un-normed h, post_attention_layernorm adds the attention output to it, the MLP output is added again,
  and `norm` gives both the normed state (-> lm_head) and the pre-norm sum (-> the next draft step).
- v1/spec_decode/llm_base_proposer.py: in the first pass the token ids are shifted left by one (the token
  at position p+1, or the target's freshly sampled token at the last position, is paired with the target's
  features at position p, at RoPE position p); later steps feed the draft token with the previous step's
  pre-norm output at position +1.

Run it with any Python that has torch, transformers and safetensors; see models/README.md for the command
that produced the committed head.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as corpus  # train.py's corpus building, reused as is

HERE = Path(__file__).resolve().parent
USER_TAG, ASSISTANT_TAG = "<|user|>\n", "<|end|>\n<|assistant|>\n"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def stratum_of(user: str) -> str:
    """Which smoke stratum a train.py request belongs to (by the templates train.py writes)."""
    if user.startswith(("Summarize the following", "Read this code")):
        return "summarization"
    if user.startswith(("Write the Python function", "Implement `")):
        return "code"
    return "chat"


def prompts_from(texts: list[str]) -> list[tuple[str, str]]:
    """(prompt text up to the assistant tag, stratum) for every chat-shaped document."""
    out = []
    for text in texts:
        if not text.startswith(USER_TAG) or ASSISTANT_TAG not in text:
            continue
        cut = text.index(ASSISTANT_TAG) + len(ASSISTANT_TAG)
        out.append((text[:cut], stratum_of(text[len(USER_TAG) :])))
    return out


# ---------------------------------------------------------------------------------------------------------
# The head: a PyTorch mirror of vllm/model_executor/models/llama_eagle3.py (one layer, no d2t)


def build_head(head_config: dict, embed_weight, lm_head_init):
    import torch
    import torch.nn.functional as F
    from torch import nn

    hidden = head_config["hidden_size"]
    heads = head_config["num_attention_heads"]
    kv_heads = head_config["num_key_value_heads"]
    head_dim = head_config["head_dim"]
    eps = head_config["rms_norm_eps"]
    theta = head_config["rope_parameters"]["rope_theta"]
    n_aux = len(head_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])

    class RMSNorm(nn.Module):
        def __init__(self, size: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(size))

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return self.weight * xf.to(x.dtype)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
            self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            inter = head_config["intermediate_size"]
            self.gate_proj = nn.Linear(hidden, inter, bias=False)
            self.up_proj = nn.Linear(hidden, inter, bias=False)
            self.down_proj = nn.Linear(inter, hidden, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class MidLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm = RMSNorm(hidden)
            self.hidden_norm = RMSNorm(hidden)
            self.post_attention_layernorm = RMSNorm(hidden)
            self.self_attn = Attention()
            self.mlp = MLP()

    def rotate(x, positions):
        # vLLM's Llama RoPE is neox style (rotate halves), like transformers'.
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=x.device).float() / head_dim))
        freqs = positions.float()[..., None] * inv_freq  # (B, T, hd/2)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, hd)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    class Eagle3Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # Not saved: vLLM shares the target's embedding when the checkpoint has none.
            self.embed_tokens = nn.Embedding.from_pretrained(embed_weight.float().clone(), freeze=True)
            self.fc = nn.Linear(n_aux * hidden, hidden, bias=False)
            self.midlayer = MidLayer()
            self.norm = RMSNorm(hidden)
            self.lm_head = nn.Linear(hidden, lm_head_init.shape[0], bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(lm_head_init.float())

        def qkv(self, token_ids, hidden_in, positions):
            """The layer up to attention: q, k, v (rotated) and the residual (the un-normed input)."""
            layer = self.midlayer
            embeds = layer.input_layernorm(self.embed_tokens(token_ids))
            x = torch.cat([embeds, layer.hidden_norm(hidden_in)], dim=-1)
            batch, length, _ = x.shape
            q = layer.self_attn.q_proj(x).view(batch, length, heads, head_dim).transpose(1, 2)
            k = layer.self_attn.k_proj(x).view(batch, length, kv_heads, head_dim).transpose(1, 2)
            v = layer.self_attn.v_proj(x).view(batch, length, kv_heads, head_dim).transpose(1, 2)
            return rotate(q, positions), rotate(k, positions), v, hidden_in

        def finish(self, attn_out, residual):
            """o_proj, the two residual adds, and the final norm: (logits, pre-norm state)."""
            layer = self.midlayer
            batch, _, length, _ = attn_out.shape
            attn_out = attn_out.transpose(1, 2).reshape(batch, length, heads * head_dim)
            residual = layer.self_attn.o_proj(attn_out) + residual
            prenorm = layer.mlp(layer.post_attention_layernorm(residual)) + residual
            return self.lm_head(self.norm(prenorm)), prenorm

        def forward(self, aux, input_ids, steps: int):
            """Training-time test over `steps` draft steps; returns each step's logits.

            Index t of step j is the draft chain anchored at context position t: step 0 pairs the
            target's fused features at t with token t+1 (RoPE position t); step j pairs step j-1's
            pre-norm output at t with token t+1+j (position t+j; the reference token: a chain only
            continues past a step when the draft matched it) and attends to the step-0 keys at
            positions <= t plus the keys of its own steps 1..j, as vLLM's KV cache holds them.
            """
            batch, length = input_ids.shape
            arange = torch.arange(length, device=input_ids.device)
            pad = input_ids.new_zeros(batch, steps)
            shifted = torch.cat([input_ids, pad], dim=1)
            hidden_in = self.fc(aux)
            keys, values, all_logits = [], [], []
            for step in range(steps):
                token_ids = shifted[:, 1 + step : 1 + step + length]
                positions = (arange + step).expand(batch, length)
                q, k, v, residual = self.qkv(token_ids, hidden_in, positions)
                keys.append(k)
                values.append(v)
                if step == 0:
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                else:
                    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
                    diagonal = torch.eye(length, dtype=torch.bool, device=q.device)
                    mask = torch.cat([causal] + [diagonal] * step, dim=1)
                    out = F.scaled_dot_product_attention(
                        q, torch.cat(keys, dim=2), torch.cat(values, dim=2), attn_mask=mask
                    )
                logits, hidden_in = self.finish(out, residual)
                all_logits.append(logits)
            return all_logits

        def vllm_state_dict(self) -> dict:
            return {
                name: tensor.detach().to(torch.bfloat16).contiguous().cpu()
                for name, tensor in self.state_dict().items()
                if not name.startswith("embed_tokens")
            }

    return Eagle3Head()


def head_config_for(target_config: dict, aux_layers: list[int]) -> dict:
    hidden = target_config["hidden_size"]
    heads = target_config["num_attention_heads"]
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": target_config["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": target_config.get("num_key_value_heads", heads),
        "head_dim": target_config.get("head_dim", hidden // heads),
        "hidden_act": "silu",
        "rms_norm_eps": target_config["rms_norm_eps"],
        "max_position_embeddings": target_config["max_position_embeddings"],
        "rope_parameters": target_config["rope_parameters"],
        "rope_theta": target_config["rope_parameters"]["rope_theta"],
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": target_config["vocab_size"],
        "draft_vocab_size": target_config["vocab_size"],
        "tie_word_embeddings": False,
        "bos_token_id": target_config["bos_token_id"],
        "eos_token_id": target_config["eos_token_id"],
        "pad_token_id": target_config["pad_token_id"],
        "dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layers, "use_aux_hidden_state": True},
    }


# ---------------------------------------------------------------------------------------------------------
# The target: greedy self-distillation data and, per batch, its features and next-token distributions


def load_target(path: Path, device):
    import torch
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    return target


def generate(
    target, prompts: list[list[int]], *, max_new: int, eos: int, pad: int, batch_tokens: int, device
):
    """Greedy answers (cut after the first end-of-turn token) to every prompt, longest batches first."""
    import torch

    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    started, position = time.time(), 0
    while position < len(order):
        longest = len(prompts[order[position]]) + max_new
        size = max(1, min(2048, batch_tokens // longest))
        chunk = order[position : position + size]
        position += len(chunk)
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):  # left padding: every prompt ends where generation starts
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        with torch.no_grad():
            out = target.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=max_new,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        for row, i in enumerate(chunk):
            new = out[row, width:].tolist()
            answers[i] = new[: new.index(eos) + 1] if eos in new else new
        print(f"[generate] {position}/{len(order)} prompts, {time.time() - started:.0f} s", flush=True)
    return answers


class FeatureTap:
    """The residual stream after `layer_id` decoder layers of a transformers Llama, as vLLM's aux state."""

    def __init__(self, target, layer_ids: list[int]) -> None:
        self.layer_ids = sorted(layer_ids)
        self.captured: dict[int, object] = {}
        for layer_id in self.layer_ids:
            module = target.model.embed_tokens if layer_id == 0 else target.model.layers[layer_id - 1]
            module.register_forward_hook(self._hook(layer_id))

    def _hook(self, layer_id: int):
        def hook(_module, _inputs, output):
            self.captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def features(self, target, input_ids):
        """(aux states concatenated in sorted id order, the target's logits)."""
        import torch

        self.captured.clear()
        with torch.no_grad():
            logits = target(input_ids=input_ids).logits
        return torch.cat([self.captured[i] for i in self.layer_ids], dim=-1), logits


# ---------------------------------------------------------------------------------------------------------
# Batches, loss and the held-out check


def collate(examples: list[tuple[list[int], int, str]], rows: list[int], pad: int, device):
    import torch

    width = max(len(examples[i][0]) for i in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    for row, i in enumerate(rows):
        ids[row, : len(examples[i][0])] = torch.tensor(examples[i][0])
    lengths = torch.tensor([len(examples[i][0]) for i in rows])
    prompt_lengths = torch.tensor([examples[i][1] for i in rows])
    return ids.to(device), lengths.to(device), prompt_lengths.to(device)


def length_batches(examples, batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Batches of similar length (padding is wasted work) under a padded-token budget, shuffled."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    batches, current, width = [], [], 0
    for i in order:
        size = len(examples[i][0])
        if current and max(width, size) * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, size)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def step_terms(head_logits, teacher_logits, ids, lengths, prompt_lengths, step: int, prompt_weight: float):
    """Soft cross-entropy against the target, its weights, and top-1 agreement, for one TTT step.

    Index t of step j predicts the token at t+2+j; the target's distribution for it sits at t+1+j.
    Only predictions of tokens inside the sequence count (the end-of-turn token included). vLLM drafts
    answer tokens from the second on (the first comes from the prefill): those weigh 1, the others
    `prompt_weight`.
    """
    import torch
    import torch.nn.functional as F

    length = ids.shape[1]
    usable = length - 2 - step
    if usable <= 0:
        return None
    drafted = head_logits[:, :usable].float()
    teacher = teacher_logits[:, 1 + step : 1 + step + usable].float()
    index = torch.arange(usable, device=ids.device)[None, :]
    predicted_at = index + 2 + step
    valid = predicted_at < lengths[:, None]
    answer = valid & (predicted_at > prompt_lengths[:, None])
    weight = torch.where(answer, 1.0, torch.where(valid, prompt_weight, 0.0))
    soft_ce = -(F.softmax(teacher, dim=-1) * F.log_softmax(drafted, dim=-1)).sum(-1)
    agree = drafted.argmax(-1) == teacher.argmax(-1)
    return soft_ce, weight, agree, answer


def ttt_loss(logits, teacher, ids, lengths, prompt_lengths, decay: list[float], prompt_weight: float):
    """The training-time-test objective over len(decay) draft steps: soft cross-entropy to the target, step j
    weighted decay[j]. Returns (the loss, each step's loss rounded, each step's top-1 agreement rounded);
    specgauge's trainer (tasks/drafters/head_worker.py) uses it as it is."""
    total, parts, top1 = 0.0, [], []
    for j in range(len(decay)):
        terms = step_terms(logits[j], teacher, ids, lengths, prompt_lengths, j, prompt_weight)
        if terms is None:
            continue
        soft_ce, weight, agree, answer = terms
        part = (soft_ce * weight).sum() / weight.sum().clamp(min=1.0)
        total = total + decay[j] * part
        parts.append(round(part.item(), 4))
        top1.append(round(float((agree & answer).sum() / answer.sum().clamp(min=1)), 4))
    return total / sum(decay), parts, top1


def evaluate(
    head, tap, target, examples, batches, *, steps: int, pad: int, device, prompt_weight: float, features=None
):
    """Held-out: soft CE and top-1 agreement per TTT step on answer tokens, and the acceptance length the
    greedy chain would reach (1 + sum over j of P[steps 0..j all agree]) per stratum, anchored at every
    answer position where all steps fit. `features(rows, ids)`, when given, supplies a batch's aux states
    and target logits instead of running the target through `tap` (tasks/drafters reads stored states)."""
    import torch

    head.eval()
    loss = [0.0] * steps
    agree_count = [0.0] * steps
    count = [0.0] * steps
    chain: dict[str, list[float]] = {}
    # bfloat16 autocast only off the CPU: there its matrix products ran 14x slower than float32 (2026-12-02)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type != "cpu"):
        for rows in batches:
            ids, lengths, prompt_lengths = collate(examples, rows, pad, device)
            aux, teacher = features(rows, ids) if features else tap.features(target, ids)
            logits = head(aux, ids, steps)
            per_step = []
            for step in range(steps):
                terms = step_terms(logits[step], teacher, ids, lengths, prompt_lengths, step, prompt_weight)
                if terms is None:
                    per_step = []
                    break
                soft_ce, _, agree, answer = terms
                loss[step] += float((soft_ce * answer).sum())
                agree_count[step] += float((agree & answer).sum())
                count[step] += float(answer.sum())
                per_step.append((agree, answer))
            if len(per_step) != steps:
                continue
            usable = per_step[-1][0].shape[1]
            alive = torch.ones_like(per_step[-1][0])
            accepted = torch.ones(alive.shape, device=device)
            for agree, _ in per_step:
                alive = alive & agree[:, :usable]
                accepted = accepted + alive.float()
            # a chain anchored at t exists when its first draft predicts a drafted answer token; the last
            # step's prediction must still be inside the sequence
            anchors = per_step[-1][1] & (per_step[0][1][:, :usable])
            for row, i in enumerate(rows):
                stratum = examples[i][2]
                chain.setdefault(stratum, []).extend(accepted[row][anchors[row]].tolist())
    head.train()
    top1 = [round(agree_count[s] / max(count[s], 1), 4) for s in range(steps)]
    return {
        "answer_soft_ce": [round(loss[s] / max(count[s], 1), 4) for s in range(steps)],
        "top1_per_step": top1,
        "simulated_acceptance_length": {
            stratum: round(sum(v) / max(len(v), 1), 3) for stratum, v in sorted(chain.items())
        },
        "simulated_acceptance_length_all": round(
            sum(sum(v) for v in chain.values()) / max(sum(len(v) for v in chain.values()), 1), 3
        ),
    }


# ---------------------------------------------------------------------------------------------------------


def self_test(target_dir: Path, aux_layers: list[int]) -> None:
    """Check the batched training-time test against vLLM's way of drafting, on the CPU in float32.

    The reference replays llm_base_proposer.propose for one anchor n: a first pass over positions 0..n
    (token p+1 with the target's fused features at p, causal), then one query per later step at position
    n+j fed the previous step's pre-norm output, attending to everything in its KV cache. The taps are
    checked against transformers' own hidden states (aux id i = the stream after i layers).
    """
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    target = load_target(target_dir, torch.device("cpu")).float()
    config = head_config_for(json.loads((target_dir / "config.json").read_text()), aux_layers)
    ids = torch.randint(5, config["vocab_size"], (2, 40))
    tap = FeatureTap(target, aux_layers)
    aux, _ = tap.features(target, ids)
    with torch.no_grad():
        reference_states = target(input_ids=ids, output_hidden_states=True).hidden_states
    for slot, layer_id in enumerate(tap.layer_ids):
        if layer_id < len(reference_states) - 1:  # transformers' last state is after the final norm
            width = config["hidden_size"]
            got = aux[..., slot * width : (slot + 1) * width]
            assert torch.allclose(got, reference_states[layer_id], atol=1e-5), f"tap {layer_id} differs"
    head = build_head(config, target.model.embed_tokens.weight, target.lm_head.weight)
    for name, parameter in head.named_parameters():  # random, so that a wrong mask or shift shows
        if parameter.requires_grad:
            torch.nn.init.normal_(parameter, mean=1.0 if "norm" in name else 0.0, std=0.2)
    steps = 3
    with torch.no_grad():
        batched = head(aux, ids, steps)
        for anchor in (0, 7, 30):
            tokens = ids[:, 1 : anchor + 2]
            positions = torch.arange(anchor + 1).expand(2, -1)
            q, k, v, residual = head.qkv(tokens, head.fc(aux[:, : anchor + 1]), positions)
            logits, prenorm = head.finish(F.scaled_dot_product_attention(q, k, v, is_causal=True), residual)
            keys, values = [k], [v]
            chain = [logits[:, anchor]]
            hidden = prenorm[:, anchor : anchor + 1]
            for step in range(1, steps):
                token = ids[:, anchor + 1 + step : anchor + 2 + step]
                position = torch.full((2, 1), anchor + step)
                q, k, v, residual = head.qkv(token, hidden, position)
                keys.append(k)
                values.append(v)
                out = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2))
                logits, hidden = head.finish(out, residual)
                chain.append(logits[:, 0])
            for step in range(steps):
                diff = (batched[step][:, anchor] - chain[step]).abs().max().item()
                scale = chain[step].abs().max().item()
                assert diff < 1e-4 * scale, f"anchor {anchor} step {step}: TTT differs by {diff} of {scale}"
    print("self-test passed: taps match transformers' hidden states; batched TTT == vLLM-style drafting")


def self_distillation_data(args, tokenizer, target, device, log: dict):
    """Prompts from train.py's corpus, answered greedily by the target (cached to --data-cache)."""
    import torch

    train_texts, valid_texts, stats = corpus.build_corpus(args.stdlib, args.seed)
    if stats["files"] < 1000:  # a wrong --stdlib would silently train on the pydoc topics alone
        raise SystemExit(f"--stdlib {args.stdlib}: {stats['files']} source files; point it at CPython's Lib")
    limit = args.max_new_tokens
    room = args.max_positions - limit

    def encode(pairs):
        texts = [text for text, _ in pairs]
        ids = []
        for start in range(0, len(texts), 512):
            ids.extend(tokenizer(texts[start : start + 512], add_special_tokens=False)["input_ids"])
        return [(i, s) for i, (_, s) in zip(ids, pairs, strict=True) if len(i) <= room]

    rng = random.Random(args.seed)
    train_prompts = encode(prompts_from(train_texts))
    valid_prompts = encode(prompts_from(valid_texts))
    rng.shuffle(valid_prompts)
    valid_prompts = valid_prompts[: args.eval_prompts]
    if args.max_prompts:
        train_prompts = train_prompts[: args.max_prompts]
    eos = tokenizer.convert_tokens_to_ids("<|end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    all_prompts = [p for p, _ in train_prompts] + [p for p, _ in valid_prompts]
    key = hashlib.sha256(json.dumps([all_prompts, limit]).encode()).hexdigest()[:16]
    cache = args.data_cache
    answers = None
    if cache and cache.exists():
        stored = torch.load(cache)
        if stored["key"] == key:
            answers = stored["answers"]
            print(f"[generate] reused {len(answers)} answers from {cache}", flush=True)
    started = time.time()
    if answers is None:
        answers = generate(
            target,
            all_prompts,
            max_new=limit,
            eos=eos,
            pad=pad,
            batch_tokens=args.generate_batch_tokens,
            device=device,
        )
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"key": key, "answers": answers}, cache)
    examples = [
        (prompt + answer, len(prompt), stratum)
        for (prompt, stratum), answer in zip(train_prompts + valid_prompts, answers, strict=True)
    ]
    train_examples, valid_examples = examples[: len(train_prompts)], examples[len(train_prompts) :]
    answer_tokens = sum(len(e[0]) - e[1] for e in train_examples)
    ended = sum(1 for e in train_examples if e[0][-1] == eos)
    log["data"] = {
        "source": f"prompts of train.py's corpus ({args.stdlib.name}: {stats['files']} files, "
        f"{stats['examples']} examples; the held-out 5% of files kept out), answered greedily by the target",
        "train_prompts": len(train_examples),
        "train_prompt_tokens": sum(e[1] for e in train_examples),
        "train_answer_tokens": answer_tokens,
        "answers_ending_with_end_token": round(ended / max(len(train_examples), 1), 3),
        "train_prompts_per_stratum": {
            s: sum(1 for e in train_examples if e[2] == s) for s in ("chat", "code", "summarization")
        },
        "held_out_prompts": len(valid_examples),
        "max_new_tokens": limit,
        "generation_seconds": round(time.time() - started, 1),
    }
    print(f"[data] {json.dumps(log['data'])}", flush=True)
    return train_examples, valid_examples, pad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--target", type=Path, default=HERE / "tiny-target")
    parser.add_argument("--out", type=Path, default=HERE / "tiny-eagle3")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--aux-layers", default="1,3,5", help="target layer ids (vLLM's numbering)")
    parser.add_argument("--ttt-steps", type=int, default=3, help="draft steps unrolled in training")
    parser.add_argument("--step-decay", type=float, default=0.8, help="loss weight of step j: decay**j")
    parser.add_argument("--prompt-weight", type=float, default=0.1, help="loss weight inside prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="length cap of the target's answers")
    parser.add_argument("--max-positions", type=int, default=2048)
    parser.add_argument("--max-prompts", type=int, default=0, help="0: all training prompts")
    parser.add_argument(
        "--eval-prompts", type=int, default=400, help="held-out prompts answered for the check"
    )
    parser.add_argument("--generate-batch-tokens", type=int, default=400_000)
    parser.add_argument("--batch-tokens", type=int, default=65_536)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--data-cache", type=Path, default=None, help="store/reuse the generated answers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--self-test", action="store_true", help="check the mirror on the CPU and exit")
    args = parser.parse_args(argv)

    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    torch.manual_seed(args.seed)
    wanted = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = torch.device("cpu" if wanted == "auto" else wanted)
    started = time.time()
    aux_layers = sorted(int(x) for x in args.aux_layers.split(","))
    target_config = json.loads((args.target / "config.json").read_text())
    if max(aux_layers) > target_config["num_hidden_layers"] or len(set(aux_layers)) != len(aux_layers):
        parser.error(f"--aux-layers {aux_layers}: distinct ids in 0..{target_config['num_hidden_layers']}")
    head_config = head_config_for(target_config, aux_layers)
    if args.self_test:
        self_test(args.target, aux_layers)
        return 0
    log: dict = {
        "command": "python models/train_eagle3.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "aux_layers": aux_layers,
        "ttt_steps": args.ttt_steps,
    }
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = load_target(args.target, device)
    train_examples, valid_examples, pad = self_distillation_data(args, tokenizer, target, device, log)

    embed = target.model.embed_tokens.weight.detach()
    head = build_head(head_config, embed, target.lm_head.weight.detach()).to(device)
    tap = FeatureTap(target, aux_layers)
    trainable = [p for p in head.parameters() if p.requires_grad]
    log["parameters"] = sum(p.numel() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(args.steps // 20, 10)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(args.steps - warmup, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    rng = random.Random(args.seed)
    valid_batches = length_batches(valid_examples, args.batch_tokens, random.Random(0))
    decay = [args.step_decay**j for j in range(args.ttt_steps)]
    history, batches = [], []
    best = {"score": -1.0, "step": -1, "state": None}

    def check_held_out() -> dict:  # the same held-out check during training and on the kept weights
        return evaluate(
            head,
            tap,
            target,
            valid_examples,
            valid_batches,
            steps=args.ttt_steps,
            pad=pad,
            device=device,
            prompt_weight=args.prompt_weight,
        )

    train_started = time.time()
    for step in range(args.steps):
        if not batches:
            batches = length_batches(train_examples, args.batch_tokens, rng)
        ids, lengths, prompt_lengths = collate(train_examples, batches.pop(), pad, device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            aux, teacher = tap.features(target, ids)
            logits = head(aux, ids, args.ttt_steps)
            total, parts, top1 = ttt_loss(
                logits, teacher, ids, lengths, prompt_lengths, decay, args.prompt_weight
            )
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        scheduler.step()
        if step % 50 == 0 or step == args.steps - 1:
            entry = {
                "step": step,
                "loss": round(total.item(), 4),
                "loss_per_step": parts,
                "train_top1_per_step": top1,
                "seconds": round(time.time() - train_started, 1),
            }
            if step % args.eval_every == 0 or step == args.steps - 1:
                entry["held_out"] = check_held_out()
                score = entry["held_out"]["simulated_acceptance_length_all"]
                if score > best["score"]:  # keep the best held-out head: the prompts are seen many times
                    best = {"score": score, "step": step, "state": head.vllm_state_dict()}
            history.append(entry)
            print(f"[train] {json.dumps(entry)}", flush=True)
    train_seconds = time.time() - train_started

    # The check that counts: the saved (bfloat16) weights, reloaded, on the held-out answers.
    head.load_state_dict({k: v.float() for k, v in best["state"].items()}, strict=False)
    final = check_held_out()
    print(f"[final] kept step {best['step']}: {json.dumps(final)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(best["state"], str(args.out / "model.safetensors"), metadata={"format": "pt"})
    (args.out / "config.json").write_text(json.dumps(head_config, indent=2) + "\n")
    for name in TOKENIZER_FILES:  # the target's files, byte for byte: the tokenizer hash must match
        if (args.target / name).exists():
            shutil.copyfile(args.target / name, args.out / name)
    log.update(
        {
            "steps": args.steps,
            "batch_tokens": args.batch_tokens,
            "lr": args.lr,
            "step_decay": args.step_decay,
            "prompt_weight": args.prompt_weight,
            "train_seconds": round(train_seconds, 1),
            "total_seconds": round(time.time() - started, 1),
            "kept_step": best["step"],
            "held_out_final": final,
            "history": history,
        }
    )
    (args.out / "training.json").write_text(json.dumps(log, indent=2) + "\n")
    print(f"total {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
