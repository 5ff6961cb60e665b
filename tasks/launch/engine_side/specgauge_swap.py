"""specgauge's vLLM worker extension: load another EAGLE-3 head into the running drafter, in place.

This module runs INSIDE the engine's worker process (`--worker-extension-cls
specgauge_swap.SpecgaugeSwapExtension`, its directory on the engine's PYTHONPATH). It imports only what
the engine's environment has (torch, safetensors, vllm) and nothing of specgauge. vLLM mixes the class
into its worker, so `self` is the worker: `self.model_runner.drafter.model` is the live
`Eagle3LlamaForCausalLM` and `self.model_runner.get_model()` the target. The client is
tasks/drafters/swap.py, through the engine's dev-mode `POST /collective_rpc`; the RPC runs in the engine
core between two engine steps, never during a forward pass.

Why not `drafter.model.load_weights(...)`: on the CPU, vLLM replaces each linear layer's weight by an empty
tensor after loading and computes with a packed copy (a oneDNN handle, or a packed tensor on AMX) that the
compiled graph reads (vllm/model_executor/layers/utils.py `dispatch_cpu_unquantized_gemm`); the head's
embed_tokens (and lm_head when the checkpoint has none) are the target's own modules
(llm_base_proposer.py `_maybe_share_embeddings`, `_maybe_share_lm_head`), so a naive load would write into
the target or fail. Here a swap is two phases:

1. stage: read the head's files once (their bytes give the digest the client computes, `drafter_digest`),
   build every tensor in the live layout in new memory (each layer's own `weight_loader`, so q/k/v and
   gate/up are stacked as vLLM stacks them), build the new packed weights, and refuse (nothing touched)
   when a tensor is missing, has no live counterpart, has the wrong shape, is not finite, or would change
   a tensor the head shares with the target;
2. commit: copy the staged tensors into the existing parameters and packed weights (`copy_`, and the
   oneDNN handle pointer swapped inside the tensor the graph reads; no storage the compiled graph holds is
   reallocated), then verify that every live layer computes with the new weights (one-hot probes through
   the packed kernel, exact in any float dtype).

The drafter keeps no other weight-derived state between steps; its KV cache entries of cached prefixes were
computed by the old head, so the client resets the prefix cache after a swap.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
import traceback
from pathlib import Path
from typing import Any

import torch

# Names as vLLM's llama_eagle3 maps checkpoint names (`midlayer.` -> `layers.0.`, q/k/v and gate/up stacked).
_STACKED = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
)
_PROBE_COLUMNS = 64  # input columns checked per linear layer after a swap


def live_name(name: str) -> tuple[str, str | int | None] | None:
    """The live parameter (dotted name under the drafter model) and shard a checkpoint tensor loads into;
    None for tensors vLLM skips (t2d)."""
    if "t2d" in name:
        return None
    key = name.removeprefix("model.")
    if key == "d2t":
        return "draft_id_to_target_id", None
    if key.startswith("lm_head."):
        return key, None
    key = key.replace("midlayer.", "layers.0.")
    for old, new, shard in _STACKED:
        if old in key:
            return "model." + key.replace(old, new), shard
    return "model." + key, None


def read_head(head_dir: str) -> tuple[str, dict[str, torch.Tensor]]:
    """The head's `drafter_digest` (specgauge/checkpoints.py: each *.safetensors and config.json by
    name as name, size and bytes) and its tensors, both from one read of the files."""
    from safetensors.torch import load as load_safetensors

    directory = Path(head_dir)
    files = sorted(
        {f for pattern in ("*.safetensors", "config.json") for f in directory.glob(pattern) if f.is_file()},
        key=lambda f: f.name,
    )
    if not any(f.suffix == ".safetensors" for f in files) or not (directory / "config.json").is_file():
        raise ValueError(f"{directory}: a head needs config.json and at least one .safetensors file")
    digest = hashlib.sha256()
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        data = file.read_bytes()
        digest.update(f"{file.name}\0{len(data)}\0".encode())
        digest.update(data)
        if file.suffix == ".safetensors":
            _check_safetensors_length(file, data)
            try:
                tensors.update(load_safetensors(data))
            except Exception as exc:  # safetensors raises its own error types
                raise ValueError(f"{file}: not a readable safetensors file ({exc})") from None
    return digest.hexdigest(), tensors


def _check_safetensors_length(file: Path, data: bytes) -> None:
    """The data section must be exactly as long as the header says (a truncated or padded file is corrupt)."""
    if len(data) < 8:
        raise ValueError(f"{file}: shorter than a safetensors header")
    (length,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + length])
    except ValueError as exc:
        raise ValueError(f"{file}: unreadable safetensors header ({exc})") from None
    end = max((e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end != len(data):
        raise ValueError(f"{file}: {len(data)} bytes, its header describes {8 + length + end}")


def _packed_kind(module: torch.nn.Module) -> str:
    """How a CPU linear layer computes: 'onednn' (a handle to packed weights), 'sgl' (a packed tensor),
    'weight' (from module.weight, unpacked), or 'other' (not swappable in place)."""
    linear = getattr(module, "cpu_linear", None)
    if linear is None or linear is torch.nn.functional.linear:
        return "weight"
    names = getattr(getattr(linear, "__code__", None), "co_freevars", ())
    if "handler" in names:
        return "onednn"
    if "packed_weight" in names:
        return "sgl"
    if not names:
        return "weight"  # the fallback lambda: F.linear on the layer's own weight
    return "other"


def _closure(module: torch.nn.Module, name: str) -> Any:
    linear = module.cpu_linear
    return linear.__closure__[linear.__code__.co_freevars.index(name)].cell_contents


class _Staged:
    """One live tensor built from the new head, not yet in place."""

    def __init__(self, module: torch.nn.Module | None, param: torch.nn.Parameter | None, data: torch.Tensor):
        self.module = module  # a linear layer (its packed weights are rebuilt), else None
        self.param = param  # the live parameter, None where the layer dropped its weight
        self.data = data
        self.shards: set[Any] = set()
        self.packed: Any = None  # the new packed form: a oneDNN handler or a packed tensor


class SpecgaugeSwapExtension:
    """Mixed into vLLM's worker; methods are called by name through `/collective_rpc`. Each returns a JSON
    object, `{"ok": false, "error": ...}` when it refused or failed (the old head then still serves)."""

    # ---------------------------------------------------------------- what the client calls

    def specgauge_swap_head(self, head_dir: str) -> dict[str, Any]:
        """Load the head at `head_dir` into the running drafter; `{ok, sha256, seconds, stage_s, commit_s,
        tensors}` where sha256 is the head's `drafter_digest` as read here."""
        started = time.perf_counter()
        try:
            digest, tensors = read_head(head_dir)
            staged = self._stage(tensors)
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "phase": "stage"}
        staged_at = time.perf_counter()
        with torch.no_grad():
            for item in staged.values():
                self._commit(item)
        problems = self._probe(staged)
        done = time.perf_counter()
        if problems:  # cannot happen unless vLLM computes from a copy this module does not know
            return {"ok": False, "error": "after the copy: " + "; ".join(problems[:5]), "phase": "verify"}
        kinds: dict[str, int] = {}
        for item in staged.values():
            kind = _packed_kind(item.module) if item.module is not None else "plain"
            kinds[kind] = kinds.get(kind, 0) + 1
        return {
            "ok": True,
            "sha256": digest,
            "tensors": len(tensors),
            "replaced": kinds,  # live tensors by how the layer computes: onednn, sgl, weight, plain
            "stage_s": staged_at - started,
            "commit_s": done - staged_at,
            "seconds": done - started,
        }

    def specgauge_verify_head(self, head_dir: str) -> dict[str, Any]:
        """Whether the running drafter computes with the head at `head_dir`: `{ok, matches, sha256,
        mismatches}` (nothing is changed)."""
        try:
            digest, tensors = read_head(head_dir)
            staged = self._stage(tensors)
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        problems = self._probe(staged)
        return {"ok": True, "matches": not problems, "sha256": digest, "mismatches": problems[:5]}

    # ---------------------------------------------------------------- stage, commit, probe

    def _models(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        runner = self.model_runner  # type: ignore[attr-defined]
        drafter = getattr(getattr(runner, "drafter", None), "model", None)
        if drafter is None:
            raise RuntimeError("this engine serves no model-based drafter (no model_runner.drafter.model)")
        if getattr(runner.drafter, "parallel_drafting", False):
            raise RuntimeError("parallel drafting keeps state derived from the head's weights: not swappable")
        return drafter, runner.get_model()

    def _stage(self, tensors: dict[str, torch.Tensor]) -> dict[str, _Staged]:
        """Every live tensor the new head provides, built in new memory; raises (nothing changed) when the
        head does not fit the running drafter."""
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        drafter, target = self._models()
        target_modules = {id(m) for m in target.modules()}
        target_params = {p.data_ptr() for p in target.parameters() if p.numel()}
        staged: dict[str, _Staged] = {}
        for name, tensor in sorted(tensors.items()):
            mapped = live_name(name)
            if mapped is None:
                continue
            pname, shard = mapped
            module_name, _, attr = pname.rpartition(".")
            try:
                module = drafter.get_submodule(module_name) if module_name else drafter
            except AttributeError:
                raise ValueError(f"{name}: the serving head has no module {module_name!r}") from None
            live = getattr(module, attr, None)
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise ValueError(f"{name}: has non-finite values")
            if id(module) in target_modules or (
                isinstance(live, torch.Tensor) and live.numel() and live.data_ptr() in target_params
            ):
                # The target's own tensor, shared with the head at launch: a copy in the checkpoint is fine,
                # a different one would change the target (or needs the head's own tensor: a restart).
                if not isinstance(live, torch.Tensor) or live.shape != tensor.shape:
                    raise ValueError(
                        f"{name}: shared with the target, shape {list(tensor.shape)} does not fit"
                    )
                if not torch.equal(live, tensor.to(live.dtype)):
                    raise ValueError(
                        f"{name}: the running head shares the target's {pname}; a head with its own "
                        "differing one needs a restart"
                    )
                continue
            if not isinstance(live, torch.Tensor):
                raise ValueError(f"{name}: the serving head has no parameter {pname!r}")
            if tensor.is_floating_point() != live.is_floating_point():
                # A float width is cast as a restart would cast it (the engine's dtype); an integer map
                # (d2t) as floats, or weights as integers (a quantized head), is another head format.
                raise ValueError(f"{name}: dtype {tensor.dtype} where the serving head has {live.dtype}")
            kind = _packed_kind(module) if attr == "weight" and hasattr(module, "cpu_linear") else None
            item = staged.get(pname)
            if item is None:
                if kind is not None and live.numel() == 0:  # the layer dropped its weight after packing
                    # ReplicatedLinear (EAGLE-3's fc) has no per-partition input size: it is its input size
                    columns = getattr(module, "input_size_per_partition", None) or module.input_size
                    shape = (sum(module.output_partition_sizes), columns)
                    dtype = getattr(module, "params_dtype", None) or tensor.dtype
                    item = _Staged(module, None, torch.zeros(shape, dtype=dtype))
                else:
                    item = _Staged(module if kind else None, live, torch.zeros_like(live.data))
                staged[pname] = item
            if kind == "other":
                raise ValueError(f"{name}: {module_name} computes with weights this extension cannot replace")
            holder = torch.nn.Parameter(item.data, requires_grad=False)
            if item.param is not None:  # its loader's attributes (output_dim, ...), where it kept them
                holder.__dict__.update({k: v for k, v in item.param.__dict__.items() if k != "weight_loader"})
            if hasattr(module, "output_partition_sizes"):  # a linear layer's weight is [out, in] (linear.py)
                holder.__dict__.update({"input_dim": 1, "output_dim": 0})
            loader = getattr(module, "weight_loader", None) if kind else None
            if loader is None:
                loader = getattr(live, "weight_loader", default_weight_loader)
            try:
                if shard is None:
                    loader(holder, tensor)
                else:
                    loader(holder, tensor, shard)
            except (AssertionError, RuntimeError, ValueError) as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                raise ValueError(
                    f"{name}: does not fit {pname} {list(item.data.shape)} ({type(exc).__name__} {exc} at "
                    f"{Path(where.filename).name}:{where.lineno} `{where.line}`)"
                ) from None
            item.shards.add(shard)
        for pname, item in staged.items():
            expected = self._expected_shards(item.module, item.shards)
            if expected != item.shards:
                raise ValueError(
                    f"{pname}: the checkpoint gives shards {sorted(map(str, item.shards))}, not all of "
                    f"{sorted(map(str, expected))}"
                )
            if item.module is not None:
                item.packed = self._pack(item)
        # What a head must replace: every linear layer's and norm's weight of its own (the client has
        # checked the checkpoint's tensor names equal the serving head's).
        own = {
            f"{n}.weight"
            for n, m in drafter.named_modules()
            if id(m) not in target_modules
            and isinstance(getattr(m, "weight", None), torch.Tensor)
            and (hasattr(m, "cpu_linear") or type(m).__name__.endswith("RMSNorm"))
        }
        missing = sorted(own - set(staged))
        if missing:
            raise ValueError(f"the checkpoint lacks {', '.join(missing)}, which the serving head has")
        return staged

    @staticmethod
    def _expected_shards(module: torch.nn.Module | None, found: set[Any]) -> set[Any]:
        if None in found or module is None:
            return {None}
        if all(isinstance(s, str) for s in found):
            return {"q", "k", "v"}
        return set(range(len(getattr(module, "output_sizes", [0, 0]))))

    @staticmethod
    def _pack(item: _Staged) -> Any:
        """The new packed weights for a linear layer, built before anything is replaced."""
        module = item.module
        kind = _packed_kind(module)
        if kind == "onednn":
            from vllm import _custom_ops as ops

            return ops.create_onednn_mm(item.data.t(), 32)
        if kind == "sgl":
            packed = torch.ops._C.convert_weight_packed(item.data)
            old = _closure(module, "packed_weight")
            if packed.shape != old.shape or packed.dtype != old.dtype:
                raise ValueError(f"packed weight {list(packed.shape)} does not fit {list(old.shape)}")
            return packed
        return None

    @staticmethod
    def _commit(item: _Staged) -> None:
        if item.param is not None:
            item.param.data.copy_(item.data)
        if item.module is None:
            return
        kind = _packed_kind(item.module)
        if kind == "onednn":
            old = _closure(item.module, "handler")
            new = item.packed
            previous = old.handler_tensor.clone()
            old.handler_tensor.copy_(new.handler_tensor)  # the graph reads the pointer from this tensor
            new.handler_tensor.copy_(previous)  # `new` now owns (and will release) the old head's handle
        elif kind == "sgl":
            _closure(item.module, "packed_weight").copy_(item.packed)
        elif item.param is None:
            raise RuntimeError("a linear layer without weight or packed weights")

    @staticmethod
    def _probe(staged: dict[str, _Staged]) -> list[str]:
        """Layers that do not compute with the staged tensors: one-hot inputs through each linear layer's
        own kernel give columns of its weight exactly; plain tensors are compared directly."""
        problems: list[str] = []
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for pname, item in staged.items():
                if item.module is None:
                    if not torch.equal(item.param.data, item.data):  # type: ignore[union-attr]
                        problems.append(pname)
                    continue
                weight = item.data
                cols = torch.randperm(weight.shape[1], generator=generator)[:_PROBE_COLUMNS]
                probe = torch.zeros(len(cols), weight.shape[1], dtype=weight.dtype)
                probe[torch.arange(len(cols)), cols] = 1
                module = item.module
                out = module.cpu_linear(probe, module.weight, None) if hasattr(module, "cpu_linear") else None
                if out is None or out.shape != (len(cols), weight.shape[0]):
                    problems.append(f"{pname}: no output to compare")
                elif not torch.allclose(out.float(), weight[:, cols].t().float(), rtol=1e-3, atol=1e-6):
                    problems.append(pname)
        return problems
