"""The drafter contract: what a drafter must be for the target it serves, checked before anything launches.

An EAGLE-3 head that does not fit its target fails only deep inside the engine's start-up (a minute or two
on a CPU, then a traceback), or worse, serves and accepts nothing. These checks read the head's
config.json and the headers of its safetensors files (never the weights) and name the rule broken.
The rules follow vLLM 0.32 (`vllm/model_executor/models/llama_eagle3.py`,
`vllm/transformers_utils/configs/eagle.py`, `vllm/config/speculative.py`); docs/cluster.md lists them.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path
from typing import Any

from experiments.methods import REGISTRY
from specgauge.errors import InputError
from specgauge.provenance import sha256_file

# Head architectures vLLM 0.32 maps to an EAGLE-3 model: `_SPECULATIVE_DECODING_MODELS` in
# vllm/model_executor/models/registry.py, architecture -> the vLLM module that implements it.
EAGLE3_HEAD_ARCHITECTURES: dict[str, str] = {
    "Eagle3LlamaForCausalLM": "llama_eagle3",
    "LlamaForCausalLMEagle3": "llama_eagle3",
    "Eagle3MiniMaxM2ForCausalLM": "llama_eagle3",
    "Eagle3Qwen2_5vlForCausalLM": "llama_eagle3",
    "Eagle3Qwen3vlForCausalLM": "llama_eagle3",
    "PeagleLlamaForCausalLM": "llama_eagle3",
    "Eagle3Qwen3ForCausalLM": "qwen3_eagle3",
    "PeagleQwen3ForCausalLM": "qwen3_eagle3",
    "Eagle3DeepseekV2ForCausalLM": "deepseek_eagle3",
    "Eagle3DeepseekV3ForCausalLM": "deepseek_eagle3",
}

# Target model types whose own MTP layers vLLM 0.32 can draft with (`SpeculativeConfig.hf_config_override`
# maps each to an MTP model); `method: mtp` without a draft checkpoint needs one of these.
MTP_TARGET_MODEL_TYPES = frozenset(
    {
        "deepseek_v3", "deepseek_v32", "deepseek_v4", "glm_moe_dsa", "glm4_moe", "glm4_moe_lite", "glm5_next",
        "mimo", "mimo_v2", "mimo_v2_flash", "ernie4_5_moe", "nemotron_h", "qwen3_next", "qwen3_5",
        "qwen3_5_moe", "qwen4_exp", "bailing_hybrid", "exaone_moe", "exaone4_5", "longcat_flash", "step3p5",
        "step3p7", "hy_v3", "hy_v4", "kimi_k3", "pangu_ultra_moe", "dots3_note", "minimax_m3_vl",
    }
)  # fmt: skip
# vLLM's message (vllm/config/speculative.py `_validate_suffix_decoding`) names this exact pin.
ARCTIC_INFERENCE = "arctic-inference==0.1.1"


def _read_config(directory: Path, what: str) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"config: {what} {directory} has no config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"config: {path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"config: {path} holds {type(data).__name__}, not a JSON object")
    return data


def safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """Tensor name -> {dtype, shape} from a safetensors file's header (8-byte length, then JSON);
    the tensor data after it is never read."""
    try:
        with open(path, "rb") as fh:
            raw_length = fh.read(8)
            if len(raw_length) != 8:
                raise ValueError("shorter than its 8-byte header length")
            (length,) = struct.unpack("<Q", raw_length)
            if length > 100 * 1024 * 1024:  # the format caps headers at 100 MB
                raise ValueError(f"header length {length} is not plausible")
            header = json.loads(fh.read(length))
    except (OSError, ValueError) as exc:
        raise InputError(f"tensors: {path} is not a safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise InputError(f"tensors: {path} has a header that is not a JSON object")
    return {name: entry for name, entry in header.items() if name != "__metadata__"}


def head_tensors(head_dir: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of the head's safetensors files, named as llama_eagle3.py loads them (`midlayer.`,
    with any `model.` prefix dropped), with its shape."""
    files = sorted(head_dir.glob("*.safetensors"))
    if not files:
        raise InputError(f"tensors: {head_dir} has no .safetensors file")
    tensors: dict[str, tuple[int, ...]] = {}
    for file in files:
        for name, entry in safetensors_header(file).items():
            key = name.removeprefix("model.")
            key = "midlayer." + key.removeprefix("layers.0.") if key.startswith("layers.0.") else key
            tensors[key] = tuple(entry.get("shape", ()))
    return tensors


def resolved_eagle3_architecture(architecture: str) -> str:
    """The name vLLM looks up for a head declared as `architecture` (EAGLEConfig: `X` -> `Eagle3X` unless
    it already starts or ends with Eagle3)."""
    if architecture.startswith("Eagle3") or architecture.endswith("Eagle3"):
        return architecture
    return f"Eagle3{architecture}"


def aux_layer_ids(head: dict[str, Any]) -> list[Any] | None:
    """The target layers whose hidden states feed the head, where vLLM's model runner looks for them."""
    eagle_config = head.get("eagle_config") if isinstance(head.get("eagle_config"), dict) else {}
    ids = head.get("eagle_aux_hidden_state_layer_ids") or eagle_config.get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if isinstance(ids, list | tuple) and ids else None


def llama_eagle3_layer(hidden: int, q_out: int, kv_out: int, inter: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the llama_eagle3 head's one decoder layer and final norm (`q_out`, `kv_out`: attention
    heads x head_dim). The layer reads [token embedding; fused hidden state]: 2 x hidden in."""
    return {
        "midlayer.self_attn.q_proj.weight": (q_out, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv_out, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv_out, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, q_out),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "norm.weight": (hidden,),
    }


def _expected_llama_eagle3_tensors(
    head: dict[str, Any], target_vocab: int, draft_vocab: int
) -> dict[str, tuple[int, ...] | None]:
    """Name -> shape the llama_eagle3 head must have (None: optional, shape checked when present)."""
    hidden = int(head["hidden_size"])
    heads = int(head.get("num_attention_heads") or 0)
    kv_heads = int(head.get("num_key_value_heads") or heads)
    head_dim = int(head.get("head_dim") or (hidden // heads if heads else 0))
    inter = int(head.get("intermediate_size") or 0)
    expected: dict[str, tuple[int, ...] | None] = {
        **llama_eagle3_layer(hidden, heads * head_dim, kv_heads * head_dim, inter)
    }
    eagle_config = head.get("eagle_config") if isinstance(head.get("eagle_config"), dict) else {}
    if eagle_config.get("use_aux_hidden_state", True):
        n_aux = head.get("num_aux_hidden_states") or len(aux_layer_ids(head) or [0, 0, 0])
        target_hidden = int(head.get("target_hidden_size") or hidden)
        expected["fc.weight"] = (hidden, n_aux * target_hidden)
    # With the full vocabulary the head may share the target's lm_head and embeddings; a smaller draft
    # vocabulary needs its own lm_head and the draft-to-target id map.
    expected["lm_head.weight"] = (draft_vocab, hidden) if draft_vocab < target_vocab else None
    if draft_vocab < target_vocab:
        expected["d2t"] = (draft_vocab,)
    expected["embed_tokens.weight"] = None
    return expected


def check_eagle3_head(target_dir: Path | str, head_dir: Path | str) -> None:
    """Raise InputError naming the first contract rule the EAGLE-3 head at `head_dir` breaks for the
    target at `target_dir` (both local checkpoint directories)."""
    target_dir, head_dir = Path(target_dir), Path(head_dir)
    if not head_dir.is_dir():
        raise InputError(f"config: {head_dir} is not a directory")
    head = _read_config(head_dir, "head")
    target = _read_config(target_dir, "target")
    target_text = target.get("text_config") if isinstance(target.get("text_config"), dict) else target

    architectures = head.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise InputError("architecture: config.json lists no architectures")
    resolved = resolved_eagle3_architecture(str(architectures[0]))
    module = EAGLE3_HEAD_ARCHITECTURES.get(resolved)
    if module is None:
        raise InputError(
            f"architecture: {architectures[0]!r} (looked up as {resolved!r}) is not an EAGLE-3 head vLLM "
            f"0.32 knows; one of {', '.join(sorted(EAGLE3_HEAD_ARCHITECTURES))}"
        )

    target_hidden = target_text.get("hidden_size")
    head_hidden = head.get("hidden_size")
    if not isinstance(head_hidden, int):
        raise InputError("hidden size: config.json has no integer hidden_size")
    feeds = head.get("target_hidden_size", head_hidden)
    if feeds != target_hidden:
        which = "target_hidden_size" if "target_hidden_size" in head else "hidden_size"
        raise InputError(
            f"hidden size: the head's {which} is {feeds}, the target's hidden_size is {target_hidden}: "
            "the head reads the target's hidden states"
        )

    layers = target_text.get("num_hidden_layers")
    ids = aux_layer_ids(head)
    if ids is not None and isinstance(layers, int):
        bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < layers]
        if bad:
            raise InputError(
                f"aux layers: eagle_aux_hidden_state_layer_ids {ids} has {bad} outside the target's "
                f"{layers} layers (0..{layers - 1})"
            )

    target_vocab = target_text.get("vocab_size")
    head_vocab = head.get("vocab_size", target_vocab)
    draft_vocab = head.get("draft_vocab_size") or head_vocab
    if not isinstance(target_vocab, int) or not isinstance(draft_vocab, int):
        raise InputError("draft vocabulary: vocab_size missing from the head's or the target's config.json")
    if head_vocab != target_vocab:
        raise InputError(
            f"draft vocabulary: the head's vocab_size is {head_vocab}, the target's {target_vocab}: the "
            "head embeds the target's tokens"
        )
    if not 0 < draft_vocab <= target_vocab:
        raise InputError(
            f"draft vocabulary: draft_vocab_size {draft_vocab} does not fit the target's vocabulary of "
            f"{target_vocab}"
        )
    tensors = head_tensors(head_dir)
    if draft_vocab < target_vocab and "d2t" not in tensors:
        raise InputError(
            f"draft vocabulary: draft_vocab_size {draft_vocab} is smaller than the target's {target_vocab} "
            "but the checkpoint has no d2t tensor (draft id -> target id)"
        )

    head_tokenizer = head_dir / "tokenizer.json"
    if head_tokenizer.is_file():  # absent: the engine uses the target's tokenizer
        target_tokenizer = target_dir / "tokenizer.json"
        if not target_tokenizer.is_file() or sha256_file(head_tokenizer) != sha256_file(target_tokenizer):
            raise InputError(
                f"tokenizer: {head_tokenizer} differs from the target's {target_tokenizer} (sha256): a head "
                "is trained on one tokenizer's ids"
            )

    if module != "llama_eagle3":
        return  # other heads' tensor layouts are theirs to check at load
    for name, shape in _expected_llama_eagle3_tensors(head, target_vocab, draft_vocab).items():
        found = tensors.get(name)
        if found is None:
            if shape is not None:
                raise InputError(f"tensors: {name} {list(shape)} is missing from the checkpoint")
            continue
        if shape is not None and found != shape:
            raise InputError(
                f"tensors: {name} has shape {list(found)}, vLLM's llama_eagle3 expects {list(shape)}"
            )
    embed = tensors.get("embed_tokens.weight")
    if embed is not None and embed != (target_vocab, head_hidden):
        raise InputError(
            f"tensors: embed_tokens.weight has shape {list(embed)}, expected {[target_vocab, head_hidden]}"
        )
    lm_head = tensors.get("lm_head.weight")
    if lm_head is not None and lm_head != (draft_vocab, head_hidden):
        raise InputError(
            f"tensors: lm_head.weight has shape {list(lm_head)}, expected {[draft_vocab, head_hidden]}"
        )


def check_method_target(method: str, target_dir: Path | str) -> None:
    """dspark and dflash need a target family vLLM has such drafters for (their registry entry's
    `target_architectures`, experiments/methods.py); mtp without a draft checkpoint needs a target with MTP
    layers. Raise InputError when the local target is not one."""
    target = _read_config(Path(target_dir), "target")
    architectures = target.get("architectures") or []
    architecture = str(architectures[0]) if architectures else "(none)"
    prefixes = REGISTRY[method].target_architectures
    if prefixes and not architecture.startswith(prefixes):
        raise InputError(
            f"method {method!r} needs a {' or '.join(prefixes)} target in vLLM 0.32; the target is "
            f"{architecture}"
        )
    if method == "mtp" and target.get("model_type") not in MTP_TARGET_MODEL_TYPES:
        raise InputError(
            f"method 'mtp' drafts with the target's own multi-token-prediction layers; the target "
            f"({architecture}, model_type {target.get('model_type')!r}) has none vLLM 0.32 knows"
        )


def check_suffix_available(engine_python: Path | str) -> None:
    """Suffix decoding needs the `arctic-inference` package in the engine's environment (vLLM checks
    `importlib.util.find_spec("arctic_inference")`, the same test as here)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('arctic_inference') is None)"
    try:
        found = (
            subprocess.run([str(engine_python), "-c", probe], capture_output=True, timeout=60).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        found = False
    if not found:
        raise InputError(
            f"method 'suffix' needs the `arctic-inference` package in the engine's environment "
            f"({engine_python}), which lacks it: install it with `{engine_python} -m pip install "
            f"{ARCTIC_INFERENCE}` (it builds a C++ extension), or drop the variant"
        )
