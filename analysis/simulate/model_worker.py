"""The model side of the simulator, run by a Python that has torch and transformers (the engine's venv on
the embedded setup: the application's venv has neither). It imports nothing from specgauge, so that any
such interpreter can run it as a script: `python model_worker.py < request.json > answer.json`.

Requests (one JSON object on stdin, `op` says which; with `--serve`, one per line, answered line by line):
- `tokenize`: the prompt token ids of each conversation, the chat template applied as vLLM's chat endpoint
  does (`apply_chat_template(messages, add_generation_prompt=True)`, no extra special tokens).
- `draft_ranks`: per sequence (prompt + output), the draft model's top-`top` next-token ids at every output
  index i (the tokens predicted for output[i] from prompt + output[:i]), teacher-forced: one forward pass.
- `eagle_ranks`: the same for the EAGLE-3 head, per draft step j (its step j predicts output[i] from the
  chain anchored at i - j), computed with train_eagle3's training-time-test forward, which its self-test
  checks equals vLLM's drafting loop.
- `continue`: the target's greedy continuation of each sequence by `tokens` tokens (what the target
  would have verified beyond the captured output).

Why teacher forcing is exact for acceptance: a draft token at depth d only counts as accepted when the
d tokens before it were accepted, i.e. equal to the target's output; so the only drafter states that
matter are those fed the reference tokens, which is what one teacher-forced pass computes (see
docs/simulate.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# What both torch workers share (tasks/drafters/torch_worker.py), imported by its folder: see its docstring.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tasks" / "drafters"))
import torch_worker


def _dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def tokenize(request: dict[str, Any]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(request["tokenizer"])
    return {"prompts": torch_worker.chat_prompt_ids(tokenizer, request["conversations"])}


def _top(logits, top: int) -> list[list[int]]:
    """Top-`top` ids per row, ties broken towards the lower id (as argmax does)."""
    import torch

    # torch.topk does not promise an order among equal values; a stable descending sort does.
    order = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[..., :top]
    return order.tolist()


def draft_ranks(request: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=_dtype(request["dtype"])).eval()
    top = int(request["top"])
    ranks = []
    with torch.no_grad():
        for seq in request["sequences"]:
            prompt, output = seq["prompt"], seq["output"]
            ids = torch.tensor([prompt + output])
            logits = model(input_ids=ids).logits[0]
            # logits at position p predict token p+1: output[i] sits at len(prompt)+i, predicted at -1 of it
            start = len(prompt) - 1
            ranks.append(_top(logits[start : start + len(output) + 1], top))
    return {"ranks": ranks}


def _eagle_modules(request: dict[str, Any]):
    import torch

    te = torch_worker.train_eagle3()
    dtype = _dtype(request["dtype"])
    target_dir, head_dir = Path(request["target"]), Path(request["head"])
    head_file = json.loads((head_dir / "config.json").read_text())
    aux_layers = sorted(head_file["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    target = te.load_target(target_dir, torch.device("cpu")).to(dtype)
    _, head = torch_worker.new_head(target, target_dir, aux_layers)
    torch_worker.load_head_weights(head, head_dir)
    head = head.to(dtype).eval()
    return target, head, te.FeatureTap(target, aux_layers)


def eagle_ranks(request: dict[str, Any]) -> dict[str, Any]:
    import torch

    target, head, tap = _eagle_modules(request)
    top, steps = int(request["top"]), int(request["steps"])
    ranks = []
    with torch.no_grad():
        for seq in request["sequences"]:
            prompt, output = seq["prompt"], seq["output"]
            ids = torch.tensor([prompt + output])
            aux, _ = tap.features(target, ids)
            # head(...)[j][0, p] predicts token p + 2 + j (step 0 pairs the features at p with token p + 1);
            # output[i] is token len(prompt) + i, so step j predicts it at index len(prompt) + i - 2 - j.
            per_step = head(aux, ids, steps)
            table = []
            for j, logits in enumerate(per_step):
                rows = []
                for i in range(len(output) + 1):
                    index = len(prompt) + i - 2 - j
                    # i - j >= 1: the chain is anchored after the first output token (the prefill's);
                    # the last index reads padding after the sequence: no prediction
                    ok = i - j >= 1 and 0 <= index < ids.shape[1] - 1 - j
                    rows.append(_top(logits[0, index], top) if ok else [])
                table.append(rows)
            ranks.append(table)
    return {"ranks": ranks}


def continue_greedy(request: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=_dtype(request["dtype"])).eval()
    tokens = int(request["tokens"])
    tails = []
    with torch.no_grad():
        for seq in request["sequences"]:
            # A plain argmax loop, not generate(): it must run on past an end token, as the verifier does
            # when drafts follow one, and generate() would either stop there or suppress the end token.
            out = model(input_ids=torch.tensor([seq["prompt"] + seq["output"]]), use_cache=True)
            tail: list[int] = []
            for _ in range(tokens):
                token = int(torch.argmax(out.logits[0, -1].float()))
                tail.append(token)
                out = model(
                    input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True
                )
            tails.append(tail)
    return {"tails": tails}


OPS = {
    "tokenize": tokenize,
    "draft_ranks": draft_ranks,
    "eagle_ranks": eagle_ranks,
    "continue": continue_greedy,
}


def serve() -> int:
    """`--serve`: one request per stdin line, one answer per stdout line, until stdin closes; so a
    caller with several ops pays for importing torch and transformers once (models.worker_session).
    A failed op answers {"error": ...} and the loop goes on."""
    import torch

    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        torch.set_num_threads(int(request.get("threads", 1)))
        try:
            answer = OPS[request["op"]](request)
        except (Exception, SystemExit) as exc:  # the caller gets it as the op's error, with its type
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


def main() -> int:
    if "--serve" in sys.argv[1:]:
        return serve()
    return torch_worker.run_once(OPS)


if __name__ == "__main__":
    raise SystemExit(main())
