"""The torch side of draft truncation (tasks/drafters/truncate.py), run by a Python that has torch,
transformers and safetensors (the engine's venv) as a script: `python truncate_worker.py < request.json`.
It imports nothing from specgauge (see torch_worker's docstring).

Op `truncate`: read the draft at `source`, keep its first `layers` decoder layers (`model.layers.<i>.` for
i < layers; embeddings, final norm and lm_head kept), write config.json (`num_hidden_layers` = layers,
`layer_types` cut to match, the `truncation` block under `truncation_key`), model.safetensors and the
source's tokenizer and generation files into `out`; then load `out` with transformers (no missing or
unexpected weights) and run it on a few tokens (logits finite, of the vocabulary's width): a checkpoint
that transformers cannot load is refused here, before any engine starts.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_worker

# Files beside the weights that the engine reads (the tokenizer must be the source's, byte for byte).
COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


def truncate(request: dict[str, Any]) -> dict[str, Any]:
    from safetensors.torch import load_file, save_file

    source, out, layers = Path(request["source"]), Path(request["out"]), int(request["layers"])
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    total = int(config["num_hidden_layers"])
    if not 1 <= layers < total:
        raise SystemExit(f"{source}/config.json: num_hidden_layers is {total}; layers must be 1..{total - 1}")
    kept: dict[str, Any] = {}
    dropped = 0
    for file in sorted(source.glob("*.safetensors")):
        for name, tensor in load_file(str(file)).items():
            match = _LAYER.match(name)
            if match and int(match.group(1)) >= layers:
                dropped += 1
                continue
            kept[name] = tensor.contiguous()
    config["num_hidden_layers"] = layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    config[request["truncation_key"]] = request["truncation"]
    out.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in COPIED:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    return {"layers": layers, "source_layers": total, "tensors": len(kept), "dropped": dropped, **_check(out)}


def _check(folder: Path) -> dict[str, Any]:
    """Load the checkpoint as the engine's transformers would and run it on a few tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    problems = {
        k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    if problems:
        raise SystemExit(f"{folder}: transformers does not load it cleanly: {problems}")
    vocab = int(model.config.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    if tuple(logits.shape) != (1, 4, vocab) or not bool(torch.isfinite(logits).all()):
        raise SystemExit(
            f"{folder}: a forward pass gave logits of shape {tuple(logits.shape)}, finite: "
            f"{bool(torch.isfinite(logits).all())}"
        )
    return {
        "loaded_layers": len(model.model.layers),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


if __name__ == "__main__":
    raise SystemExit(torch_worker.run_once({"truncate": truncate}))
