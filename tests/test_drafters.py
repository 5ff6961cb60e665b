"""Drafters: the EAGLE-3 head contract (one test per rule, each with a broken head built here from a valid
random one), the other speculative methods' pre-launch checks, a start-up death on a bad drafter being
permanent, and the drafter's provenance (content hash and card)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from experiments.spec import parse_spec
from flows.retry import transient_exception
from specgauge.errors import EngineDied, InputError, SpecError
from specgauge.settings import get_settings
from tasks.drafters import (
    check_eagle3_head,
    check_method_target,
    check_suffix_available,
    drafter_digest,
    drafter_record,
    training_card,
)
from tasks.drafters.contract import llama_eagle3_layer
from tasks.drafters.prelaunch import check_launchable
from tasks.health import permanent_start_failure, wait_ready
from tasks.launch.local import LocalLauncher

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "models" / "tiny-target"
ENGINE_SITE = REPO / ".engine-venv" / "lib" / "python3.11" / "site-packages" / "vllm"


# -- building heads -------------------------------------------------------------------------------------
def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout: 8-byte little-endian header length, JSON header, raw little-endian bytes.
    float32 arrays are stored as BF16 (their upper 16 bits), int64 as I64."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, array in tensors.items():
        if array.dtype == np.int64:
            dtype, blob = "I64", array.astype("<i8").tobytes()
        else:
            dtype, blob = "BF16", (array.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


def head_config(**changes: Any) -> dict[str, Any]:
    """A head for models/tiny-target as docs' facts verified it serves (engine.md, 2026-12-01)."""
    target = json.loads((TARGET / "config.json").read_text())
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target["hidden_size"],
        "intermediate_size": target["intermediate_size"],
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target["head_dim"],
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": target["max_position_embeddings"],
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": target["vocab_size"],
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True},
    }
    config.update(changes)
    return config


def head_tensors(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_out = config["num_attention_heads"] * config["head_dim"]
    kv_out = config["num_key_value_heads"] * config["head_dim"]
    feeds = config.get("target_hidden_size", hidden)
    draft_vocab = config.get("draft_vocab_size") or config["vocab_size"]
    # The layer's shapes are the contract's (models/train_eagle3.py's trained heads check them against a real
    # head: tests/test_train_drafter.py); what each rule reads beyond them is built here.
    shapes = {
        **llama_eagle3_layer(hidden, q_out, kv_out, inter),
        "fc.weight": (hidden, 3 * feeds),
        "lm_head.weight": (draft_vocab, hidden),
    }
    tensors = {name: rng.normal(0, 0.02, shape).astype(np.float32) for name, shape in shapes.items()}
    if draft_vocab < config["vocab_size"]:
        tensors["d2t"] = np.arange(draft_vocab, dtype=np.int64) * 0
    return tensors


def build_head(
    directory: Path,
    config: dict[str, Any] | None = None,
    edit: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> Path:
    """A random EAGLE-3 head for tiny-target; `edit` changes its tensors before they are written."""
    config = config or head_config()
    tensors = head_tensors(config)
    if edit:
        edit(tensors)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_safetensors(directory / "model.safetensors", tensors)
    return directory


def refused(head: Path) -> str:
    with pytest.raises(InputError) as info:
        check_eagle3_head(TARGET, head)
    return str(info.value)


# -- the contract, one rule at a time -------------------------------------------------------------------
def test_a_valid_random_head_meets_the_contract(tmp_path: Path) -> None:
    head = build_head(tmp_path / "head")
    check_eagle3_head(TARGET, head)
    shutil.copy(TARGET / "tokenizer.json", head / "tokenizer.json")  # the target's own tokenizer: fine
    check_eagle3_head(TARGET, head)


def test_rule_config_readable(tmp_path: Path) -> None:
    head = build_head(tmp_path / "head")
    (head / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"],')
    assert refused(head).startswith(f"config: {head / 'config.json'} is not readable JSON")
    (head / "config.json").unlink()
    assert refused(head) == f"config: head {head} has no config.json"


def test_rule_architecture_vllm_maps_to_an_eagle3_model(tmp_path: Path) -> None:
    message = refused(build_head(tmp_path / "h1", head_config(architectures=["MedusaModel"])))
    assert message.startswith(
        "architecture: 'MedusaModel' (looked up as 'Eagle3MedusaModel') is not an EAGLE-3"
    )
    # vLLM's own renaming: a plain LlamaForCausalLM head is looked up as Eagle3LlamaForCausalLM, which it knows.
    check_eagle3_head(TARGET, build_head(tmp_path / "h2", head_config(architectures=["LlamaForCausalLM"])))


def test_rule_hidden_size_equals_the_targets(tmp_path: Path) -> None:
    message = refused(build_head(tmp_path / "h1", head_config(hidden_size=256, intermediate_size=512)))
    assert message == (
        "hidden size: the head's hidden_size is 256, the target's hidden_size is 320: the head reads the "
        "target's hidden states"
    )
    # A narrower head that says which hidden size it reads (target_hidden_size) is fine.
    narrow = head_config(
        hidden_size=256, intermediate_size=512, num_attention_heads=4, target_hidden_size=320
    )
    check_eagle3_head(TARGET, build_head(tmp_path / "h2", narrow))
    assert refused(build_head(tmp_path / "h3", {**narrow, "target_hidden_size": 192})).startswith(
        "hidden size: the head's target_hidden_size is 192"
    )


def test_rule_aux_layers_are_the_targets(tmp_path: Path) -> None:
    config = head_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 6]})
    assert refused(build_head(tmp_path / "h1", config)) == (
        "aux layers: eagle_aux_hidden_state_layer_ids [1, 3, 6] has [6] outside the target's 6 layers (0..5)"
    )
    top_level = head_config(eagle_aux_hidden_state_layer_ids=[-1, 2, 4])  # where vLLM also looks
    assert "has [-1] outside" in refused(build_head(tmp_path / "h2", top_level))


def test_rule_draft_vocabulary_fits_the_targets(tmp_path: Path) -> None:
    assert refused(build_head(tmp_path / "h1", head_config(draft_vocab_size=5000))) == (
        "draft vocabulary: draft_vocab_size 5000 does not fit the target's vocabulary of 4096"
    )
    assert refused(build_head(tmp_path / "h2", head_config(vocab_size=8192))).startswith(
        "draft vocabulary: the head's vocab_size is 8192, the target's 4096"
    )
    small = head_config(draft_vocab_size=1024)
    check_eagle3_head(TARGET, build_head(tmp_path / "h3", small))  # with its d2t map
    no_map = build_head(tmp_path / "h4", small, edit=lambda t: t.pop("d2t"))
    assert refused(no_map) == (
        "draft vocabulary: draft_vocab_size 1024 is smaller than the target's 4096 but the checkpoint has no "
        "d2t tensor (draft id -> target id)"
    )


def test_rule_tokenizer_matches_the_targets_by_content(tmp_path: Path) -> None:
    head = build_head(tmp_path / "head")
    tokenizer = json.loads((TARGET / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [*tokenizer.get("added_tokens", []), {"id": 4095, "content": "<x>"}]
    (head / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert refused(head).startswith(f"tokenizer: {head / 'tokenizer.json'} differs from the target's")


def test_rule_tensors_as_llama_eagle3_loads_them(tmp_path: Path) -> None:
    missing = build_head(tmp_path / "h1", edit=lambda t: t.pop("fc.weight"))
    assert refused(missing) == "tensors: fc.weight [320, 960] is missing from the checkpoint"

    def two_aux_states(tensors: dict[str, np.ndarray]) -> None:
        tensors["fc.weight"] = tensors["fc.weight"][:, :640]

    assert refused(build_head(tmp_path / "h2", edit=two_aux_states)) == (
        "tensors: fc.weight has shape [320, 640], vLLM's llama_eagle3 expects [320, 960]"
    )

    def one_hidden_in(tensors: dict[str, np.ndarray]) -> None:  # q_proj must read [embedding; fused state]
        tensors["midlayer.self_attn.q_proj.weight"] = tensors["midlayer.self_attn.q_proj.weight"][:, :320]

    assert "midlayer.self_attn.q_proj.weight has shape [320, 320]" in refused(
        build_head(tmp_path / "h3", edit=one_hidden_in)
    )

    # Checkpoints that name the layer `layers.0.` under `model.` load the same in vLLM: accepted.
    def renamed(tensors: dict[str, np.ndarray]) -> None:
        for name in [n for n in tensors if n.startswith("midlayer.")]:
            tensors["model.layers.0." + name.removeprefix("midlayer.")] = tensors.pop(name)

    check_eagle3_head(TARGET, build_head(tmp_path / "h4", edit=renamed))
    (tmp_path / "h5").mkdir()
    (tmp_path / "h5" / "config.json").write_text(json.dumps(head_config()))
    (tmp_path / "h5" / "model.safetensors").write_bytes(b"\x10\x00")
    assert "is not a safetensors file" in refused(tmp_path / "h5")


# -- refused before launch, through the campaign's own check ----------------------------------------------
def spec_with(*variants: dict[str, Any], **changes: Any) -> Any:
    data = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    data.pop("profile", None)
    data["validity"] = {"aa_control": False}  # the variants below, without the demo's A/A arm
    data["variants"] = [{"name": "plain"}, *variants]
    data.update(changes)
    return parse_spec(data, "experiments/x.yaml")


def test_a_broken_head_is_refused_before_launch_naming_the_field(tmp_path: Path) -> None:
    head = build_head(tmp_path / "head", edit=lambda t: t.pop("norm.weight"))
    spec = spec_with({"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": str(head)})
    with pytest.raises(SpecError) as info:
        check_launchable(spec, source="experiments/x.yaml")
    assert str(info.value) == (
        "experiments/x.yaml: variants[1].eagle_head: tensors: norm.weight [320] is missing from the checkpoint"
    )
    # A head path that is no directory here (and cannot be a hub id) is refused too, not retried.
    spec = spec_with({"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": "models/nope/head"})
    with pytest.raises(
        SpecError, match=r"variants\[1\]\.eagle_head: config: models/nope/head is not a directory"
    ):
        check_launchable(spec, source="experiments/x.yaml")
    good = build_head(tmp_path / "good")
    check_launchable(spec_with({"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": str(good)}))


def test_methods_the_local_target_has_no_drafter_for_are_refused(tmp_path: Path) -> None:
    for method, expected in [
        (
            "dspark",
            "method 'dspark' needs a Qwen3 or Gemma4 target in vLLM 0.32; the target is LlamaForCausalLM",
        ),
        (
            "dflash",
            "method 'dflash' needs a Qwen3 or Laguna target in vLLM 0.32; the target is LlamaForCausalLM",
        ),
    ]:
        spec = spec_with({"name": "x", "method": method, "k": 3, "draft_model": "models/tiny-draft"})
        with pytest.raises(SpecError) as info:
            check_launchable(spec, source="s.yaml")
        assert str(info.value) == f"s.yaml: variants[1].method: {expected}"
    with pytest.raises(SpecError, match="method 'mtp' drafts with the target's own multi-token-prediction"):
        check_launchable(spec_with({"name": "x", "method": "mtp", "k": 1}))
    qwen3 = tmp_path / "qwen3"
    qwen3.mkdir()
    (qwen3 / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})
    )
    check_method_target("dflash", qwen3)
    check_method_target("dspark", qwen3)
    with pytest.raises(InputError):
        check_method_target("mtp", qwen3)
    # On a cluster nothing here can read the target: passed through to the engine.
    cluster = {"kind": "slurm", "cluster": "c"}
    check_launchable(
        spec_with({"name": "x", "method": "dspark", "k": 3, "draft_model": "d/x"}, launcher=cluster)
    )


def test_draft_tensor_parallel_size_is_one_or_the_targets() -> None:
    spec = spec_with(
        {"name": "x", "method": "eagle3", "k": 3, "eagle_head": "org/head", "draft_tensor_parallel_size": 2},
        target={"model": "org/target", "tensor_parallel_size": 4},
        launcher={"kind": "slurm", "cluster": "c"},
    )
    with pytest.raises(SpecError) as info:
        check_launchable(spec, source="s.yaml")
    assert str(info.value) == (
        "s.yaml: variants[1].draft_tensor_parallel_size: vLLM takes 1 or the target's tensor_parallel_size "
        "(4), got 2"
    )


def test_suffix_needs_arctic_inference_in_the_engine_environment(tmp_path: Path, monkeypatch) -> None:
    # This interpreter (the application's) has no arctic_inference: refused, naming package and command.
    with pytest.raises(InputError) as info:
        check_suffix_available(sys.executable)
    assert "`arctic-inference` package" in str(info.value)
    assert f"`{sys.executable} -m pip install arctic-inference==0.1.1`" in str(info.value)
    # An engine python that has it (a wrapper putting a package of that name on its path) passes.
    package = tmp_path / "site" / "arctic_inference"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    wrapper = tmp_path / "engine-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    check_suffix_available(wrapper)
    # Through the campaign's check, with the engine named by the settings.
    spec = spec_with({"name": "suffix-k8", "method": "suffix", "k": 8})
    monkeypatch.setenv("SPECGAUGE_ENGINE_PYTHON", sys.executable)
    get_settings.cache_clear()
    with pytest.raises(
        SpecError, match=r"^s\.yaml: variants\[1\]\.method: method 'suffix' needs the `arctic-inference`"
    ):
        check_launchable(spec, source="s.yaml")
    monkeypatch.setenv("SPECGAUGE_ENGINE_PYTHON", str(wrapper))
    get_settings.cache_clear()
    check_launchable(spec, source="s.yaml")


# -- a death at start on a bad drafter is permanent --------------------------------------------------------
# Log tails as vLLM 0.32 writes them (wording from its sources; pids and paths made up).
MISSING_HEAD_DIR = """\
(APIServer pid=4107) INFO 12-01 14:02:11 [utils.py:299] non-default args: {'model': '/repo/models/tiny-target', 'speculative_config': {'num_speculative_tokens': 3, 'method': 'eagle3', 'model': '/repo/models/tiny-eagle3'}}
(APIServer pid=4107) Traceback (most recent call last):
(APIServer pid=4107)   File "/repo/.engine-venv/lib/python3.11/site-packages/vllm/engine/arg_utils.py", line 1912, in create_speculative_config
(APIServer pid=4107)     return SpeculativeConfig(**self.speculative_config)
(APIServer pid=4107)            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(APIServer pid=4107) pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
(APIServer pid=4107)   Value error, Invalid repository ID or local directory specified: '/repo/models/tiny-eagle3'.
(APIServer pid=4107) Please verify the following requirements:
(APIServer pid=4107) 1. Provide a valid Hugging Face repository ID.
(APIServer pid=4107) 2. Specify a local directory that contains a recognized configuration file.
"""
SHAPE_MISMATCH = """\
(EngineCore pid=4188) INFO 12-01 14:03:40 [default_loader.py:291] Loading weights took 0.21 seconds
(EngineCore pid=4188) ERROR 12-01 14:03:40 [core.py:1510] EngineCore failed to start.
(EngineCore pid=4188) ERROR 12-01 14:03:40 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=4188) ERROR 12-01 14:03:40 [core.py:1510]   File "/repo/.engine-venv/lib/python3.11/site-packages/vllm/model_executor/models/llama_eagle3.py", line 467, in load_weights
(EngineCore pid=4188) ERROR 12-01 14:03:40 [core.py:1510]   File "/repo/.engine-venv/lib/python3.11/site-packages/vllm/model_executor/model_loader/weight_utils.py", line 1485, in default_weight_loader
(EngineCore pid=4188) ERROR 12-01 14:03:40 [core.py:1510]     assert param.size() == loaded_weight.size(), (
(EngineCore pid=4188) ERROR 12-01 14:03:40 [core.py:1510] AssertionError: Attempted to load weight (torch.Size([320, 640])) into parameter (torch.Size([320, 960]))
(APIServer pid=4107) Traceback (most recent call last):
(APIServer pid=4107)   File "/repo/.engine-venv/lib/python3.11/site-packages/vllm/v1/engine/utils.py", line 1432, in wait_for_engine_startup
(APIServer pid=4107) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""
UNKNOWN_TENSOR = """\
(EngineCore pid=4188) ERROR 12-01 14:03:40 [core.py:1510]   File "/repo/.engine-venv/lib/python3.11/site-packages/vllm/model_executor/models/utils.py", line 443, in _load_module
(EngineCore pid=4188) ERROR 12-01 14:03:40 [core.py:1510] ValueError: There is no module or parameter named 'model.layers.6.self_attn.rotary' in Eagle3LlamaForCausalLM. The available parameters belonging to model.layers.6 (LlamaDecoderLayer) are: {...}
"""
OOM_KILLED = """\
(EngineCore pid=4188) INFO 12-01 14:03:30 [cpu_worker.py:120] Loading model from /repo/models/tiny-target
(APIServer pid=4107) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': -9}
"""
PORT_TAKEN = "(APIServer pid=4107) OSError: [Errno 98] Address already in use\n"


@pytest.mark.parametrize(
    ("tail", "cause"),
    [
        (MISSING_HEAD_DIR, "Invalid repository ID or local directory specified: '/repo/models/tiny-eagle3'"),
        (SHAPE_MISMATCH, "AssertionError: Attempted to load weight (torch.Size([320, 640]))"),
        (UNKNOWN_TENSOR, "There is no module or parameter named 'model.layers.6.self_attn.rotary'"),
        (
            "(EngineCore pid=9) KeyError: 'layers.0.self_attn.qkv.weight'\n",
            "KeyError: 'layers.0.self_attn.qkv.weight'",
        ),
        (
            "ImportError: Arctic Inference is required for suffix decoding. Install via `pip install x`.\n",
            "Arctic",
        ),
        (OOM_KILLED, None),
        (PORT_TAKEN, None),
        ("", None),
    ],
    ids=[
        "missing-dir",
        "shape",
        "unknown-tensor",
        "key-error",
        "arctic",
        "oom-killed",
        "port-taken",
        "silent",
    ],
)
def test_start_up_failures_on_a_bad_model_or_drafter_are_permanent(tail: str, cause: str | None) -> None:
    found = permanent_start_failure(tail)
    assert (found is None) if cause is None else (found is not None and cause in found), found


def fake_engine(tmp_path: Path, log: str) -> Path:
    """An 'engine' that writes a vLLM log and exits 1, launched by the real local launcher."""
    (tmp_path / "tail.txt").write_text(log)
    script = tmp_path / "engine-python"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'tail.txt'}\nexit 1\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(
    ("log", "transient"), [(SHAPE_MISMATCH, False), (OOM_KILLED, True)], ids=["shape", "oom"]
)
def test_the_gate_fails_a_bad_head_for_good_and_a_killed_engine_for_a_retry(
    tmp_path: Path, log: str, transient: bool
) -> None:
    spec = spec_with({"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": "models/tiny-eagle3"})
    launcher = LocalLauncher(spec.launcher, engine_python=fake_engine(tmp_path, log))
    deployment = launcher.launch(spec.target, spec.variants[1], deployment_id="bad", directory=tmp_path / "d")
    try:
        with pytest.raises(EngineDied) as info:
            wait_ready(deployment, launcher, timeout_s=60, poll_s=0.2)
    finally:
        launcher.teardown(deployment)
    assert info.value.transient is transient and transient_exception(info.value) is transient
    assert ("cannot start with this model or drafter: " in str(info.value)) is not transient
    assert "--- log tail ---" in str(info.value)


# -- provenance -------------------------------------------------------------------------------------------
def test_drafter_digest_is_the_content_of_weights_and_config(tmp_path: Path) -> None:
    head = build_head(tmp_path / "a")
    digest = drafter_digest(head)
    assert len(digest) == 64 and digest == drafter_digest(head)
    copy = shutil.copytree(head, tmp_path / "elsewhere" / "b")
    assert drafter_digest(copy) == digest  # where it lives is not what it is
    (copy / "README.md").write_text("# card\n")
    assert drafter_digest(copy) == digest  # nor is its card
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}, indent=2))
    assert drafter_digest(copy) != digest
    other = build_head(tmp_path / "c")
    data = bytearray((other / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of one weight
    (other / "model.safetensors").write_bytes(bytes(data))
    assert drafter_digest(other) != digest
    with pytest.raises(FileNotFoundError):
        drafter_digest(tmp_path / "elsewhere")


def test_drafter_digest_streams_and_matches_a_direct_hash(tmp_path: Path) -> None:
    import hashlib

    head = build_head(tmp_path / "h")
    expected = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        data = (head / name).read_bytes()
        expected.update(f"{name}\0{len(data)}\0".encode() + data)
    assert drafter_digest(head) == expected.hexdigest()


def test_the_drafter_record_carries_method_path_hash_and_card() -> None:
    record = drafter_record("draft_model", "models/tiny-draft", REPO / "models" / "tiny-draft")
    training = json.loads((REPO / "models" / "tiny-draft" / "training.json").read_text())
    assert record["method"] == "draft_model" and record["path"] == "models/tiny-draft"
    assert record["sha256"] == drafter_digest(REPO / "models" / "tiny-draft")
    assert set(record["card"]["files"]) == {"README.md", "training.json"}
    assert record["card"]["training"]["steps"] == training["steps"]
    assert "history" not in record["card"]["training"]
    hub = drafter_record("eagle3", "org/some-head", None)
    assert hub == {"method": "eagle3", "path": "org/some-head", "sha256": None, "card": None}


def test_no_card_is_none(tmp_path: Path) -> None:
    assert training_card(build_head(tmp_path / "h")) is None


# -- the speculative config is what vLLM's SpeculativeConfig takes ----------------------------------------
def vllm_speculative_fields() -> tuple[set[str], set[str]]:
    """SpeculativeConfig's field names and the methods its Literal types allow, read from the engine venv's
    source (parsed, not imported: no torch start-up)."""
    tree = ast.parse((ENGINE_SITE / "config" / "speculative.py").read_text())
    literals: dict[str, list[Any]] = {}
    fields: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript):
            names = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else [node.value.slice]
            literals[node.targets[0].id] = [
                n.value if isinstance(n, ast.Constant) else n.id
                for n in names
                if isinstance(n, ast.Constant | ast.Name)
            ]
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
            fields = {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }

    def expand(name: str) -> set[str]:
        return {v for item in literals.get(name, []) for v in (expand(item) if item in literals else {item})}

    return fields, expand("SpeculativeMethod")


@pytest.mark.skipif(not ENGINE_SITE.exists(), reason="no engine venv (make engine)")
def test_every_variant_renders_a_config_vllm_accepts() -> None:
    fields, methods = vllm_speculative_fields()
    assert {"num_speculative_tokens", "model", "method", "draft_tensor_parallel_size"} <= fields
    variants = [
        {"name": "ngram", "method": "ngram", "k": 3, "prompt_lookup_min": 2},
        {
            "name": "draft",
            "method": "draft_model",
            "k": 3,
            "draft_model": "d",
            "draft_tensor_parallel_size": 1,
        },
        {"name": "eagle3", "method": "eagle3", "k": 3, "eagle_head": "h", "draft_tensor_parallel_size": 1},
        {"name": "suffix", "method": "suffix", "k": 8},
        {"name": "dspark", "method": "dspark", "k": 7, "draft_model": "d"},
        {"name": "dflash", "method": "dflash", "k": 4, "draft_model": "d"},
        {"name": "mtp", "method": "mtp", "k": 1},
        {"name": "mtp-own", "method": "mtp", "k": 2, "draft_model": "d"},
    ]
    spec = spec_with(*variants)
    for variant in spec.variants[1:]:
        config = variant.speculative_config()
        assert config is not None and set(config) <= fields, (variant.name, set(config) - fields)
        assert config["method"] in methods


def test_specgauge_campaign_run_refuses_a_broken_head_and_writes_nothing(tmp_path: Path) -> None:
    head = build_head(
        tmp_path / "head", head_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 9]})
    )
    data = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    data.pop("profile", None)
    data["name"] = "drafter-contract"
    data["variants"] = [v for v in data["variants"] if v["method"] != "eagle3"]  # the demo's own head is fine
    data["variants"].append({"name": "eagle3-k3", "method": "eagle3", "k": 3, "eagle_head": str(head)})
    broken = len(data["variants"]) - 1
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-m", "cli", "campaign", "run", str(spec)],
        cwd=REPO,
        env={**os.environ, "SPECGAUGE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"error: {spec}: variants[{broken}].eagle_head: aux layers: eagle_aux_hidden_state_layer_ids [2, 4, 9] has [9] "
        "outside the target's 6 layers (0..5)"
    )
    assert not (home / "raw").exists() or not any((home / "raw").iterdir())
    assert not (home / "ledger").exists() or not any((home / "ledger").iterdir())


@pytest.mark.engine
def test_a_draft_model_deployment_records_its_drafter(engines) -> None:
    """On the real engine (the session's shared draft-k3 deployment): deployment.json names the draft
    served by content hash, and its card."""
    deployment = engines.get("draft-k3")
    deployment.save()
    saved = json.loads((deployment.directory / "deployment.json").read_text())
    assert saved["drafter"]["method"] == "draft_model" and saved["drafter"]["path"] == "models/tiny-draft"
    assert saved["drafter"]["sha256"] == drafter_digest(REPO / "models" / "tiny-draft")
    assert set(saved["drafter"]["card"]["files"]) == {"README.md", "training.json"}
    assert engines.get("plain").drafter is None
