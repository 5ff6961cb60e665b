"""Fine-tune tiny-eagle3 on the shifted stratum: models/tiny-eagle3-shifted, the adapted head that
`specgauge drafters confirm` swaps in for the demo of the drafter lifecycle (docs/adaptation.md).

It runs train-drafter's own trainer (tasks/drafters/head_worker.py: the `hidden_states` and `train` ops,
models/train_eagle3.py's head and objective) without the application around it, so that it runs on any
machine with torch and transformers (the workplace's GPU machine has no room for specgauge's venv):

1. training data: workloads/shifted-train-outputs.jsonl (212 shifted windows at offset 0 plus 120 chat and
   code rehearsal examples, the target's greedy outputs) and more windows of the same training files at
   offsets 325, 650 and 975 (files held out by workloads/build_corpora.py's rule never enter), answered
   greedily by the target here (at most 64 new tokens, as the corpus asks);
2. the target's states at the head's aux layers, then each configuration in --sweep fine-tuned from
   models/tiny-eagle3, keeping the step with the best held-out (10% of ids by hash) simulated acceptance;
3. the choice: the configuration with the best held-out shifted acceptance among those that keep chat and
   code within --guard (default 3%) of the parent's, held-out ids only (never the test prompts);
4. the test: workloads/shifted.jsonl (files no training window came from), answered by the target here,
   simulated acceptance of parent and chosen head, offline (vLLM's is what the confirmation measures).

Writes OUT/<tag>/ per configuration (the head folder vLLM loads, with training.json) and OUT/chosen.txt.

    python -m models.adapt_shifted_head --stdlib /path/to/python3.11 --out /tmp/adapted --device cuda
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

from models import train as corpus
from models import train_eagle3 as te
from tasks.drafters import head_worker
from workloads import build_corpora  # the shifted stratum's files, windows and held-out rule

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "models" / "tiny-target"
PARENT = REPO / "models" / "tiny-eagle3"
EXTRA_OFFSETS = (325, 650, 975)
AUX = [1, 3, 5]
DEFAULT_SWEEP = [
    {"tag": "lr3e-4", "lr": 3e-4, "steps": 300},
    {"tag": "lr1e-4", "lr": 1e-4, "steps": 600},
    {"tag": "lr3e-5", "lr": 3e-5, "steps": 600},
    {"tag": "lr1e-4-rehearse3", "lr": 1e-4, "steps": 600, "rehearse": 3},
]


def rows_of(path: Path) -> list[dict]:
    return [
        json.loads(line)
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def held_out_by_id(example_id: str, share: float = 0.1) -> bool:  # tasks/drafters/training_data.py's rule
    return hashlib.sha256(example_id.encode()).digest()[0] < 256 * share


def chat_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


def extra_windows(stdlib: Path, tokenizer) -> list[tuple[str, list[int]]]:
    rng = random.Random(7)
    out = []
    for name in build_corpora.SHIFTED_DIRS:
        for path in sorted((stdlib / name).rglob("*.py")):
            rel = str(path.relative_to(stdlib))
            if "test" in rel or build_corpora.shifted_is_held_out(rel):
                continue
            ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)[
                "input_ids"
            ]
            for offset in EXTRA_OFFSETS:
                for start in range(offset, max(len(ids) - 600, 1), build_corpora.SHIFTED_WINDOW):
                    window = ids[start : start + build_corpora.SHIFTED_WINDOW]
                    if len(window) < 300:
                        continue
                    request = rng.choice(corpus.SUMMARY_REQUESTS).format(code=tokenizer.decode(window))
                    out.append(
                        (
                            f"shifted-extra-{rel}@{start}",
                            chat_ids(tokenizer, [{"role": "user", "content": request}]),
                        )
                    )
    return out


def as_examples(rows: list[dict], held_out: bool | None, copies: dict[str, int] | None = None) -> list[dict]:
    out = []
    for row in sorted(rows, key=lambda r: r["id"]):
        room = 2048 - len(row["prompt_ids"])
        if room < 2:
            continue
        example = {
            "id": row["id"],
            "ids": row["prompt_ids"] + row["output_ids"][:room],
            "prompt_len": len(row["prompt_ids"]),
            "stratum": row["workload"],
            "held_out": held_out_by_id(row["id"]) if held_out is None else held_out,
        }
        n = 1 if example["held_out"] else (copies or {}).get(row["workload"], 1)
        out.extend([example] * n)
    return out


def digest(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for row in sorted(rows, key=lambda r: r["id"]):
        h.update(json.dumps([row["id"], row["prompt_ids"], row["output_ids"]]).encode())
    return h.hexdigest()


def main() -> int:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stdlib",
        type=Path,
        required=True,
        help="CPython 3.11's Lib folder (holds idlelib, lib2to3, turtledemo)",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sweep", default=json.dumps(DEFAULT_SWEEP), help="JSON list of configurations")
    parser.add_argument("--guard", type=float, default=0.03, help="largest held-out loss on chat or code")
    args = parser.parse_args()
    started = time.time()
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    eos, pad = tokenizer.convert_tokens_to_ids("<|end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    target = te.load_target(TARGET, device)

    base = rows_of(REPO / "workloads" / "shifted-train-outputs.jsonl")
    extra = extra_windows(args.stdlib, tokenizer)
    answers = te.generate(
        target, [p for _, p in extra], max_new=64, eos=eos, pad=pad, batch_tokens=200_000, device=device
    )
    extra_rows = [
        {"id": i, "workload": "shifted", "prompt_ids": p, "output_ids": a}
        for (i, p), a in zip(extra, answers, strict=True)
    ]
    test_prompts = [
        (r["id"], chat_ids(tokenizer, r["messages"])) for r in rows_of(REPO / "workloads" / "shifted.jsonl")
    ]
    test_answers = te.generate(
        target,
        [p for _, p in test_prompts],
        max_new=64,
        eos=eos,
        pad=pad,
        batch_tokens=200_000,
        device=device,
    )
    test_rows = [
        {"id": i, "workload": "shifted", "prompt_ids": p, "output_ids": a}
        for (i, p), a in zip(test_prompts, test_answers, strict=True)
    ]
    train_rows = base + extra_rows
    generated_s = round(time.time() - started, 1)

    config = te.head_config_for(json.loads((TARGET / "config.json").read_text()), AUX)

    def head_of(path: Path):
        head = te.build_head(
            config, target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
        )
        head.load_state_dict(
            {k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()}, strict=False
        )
        return head.to(device)

    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    state_files: dict[int, str] = {}
    for entry in json.loads(args.sweep):
        entry = dict(entry)
        tag, rehearse = entry.pop("tag"), int(entry.pop("rehearse", 1))
        examples = as_examples(train_rows, None, {"chat": rehearse, "code": rehearse}) + as_examples(
            test_rows, True
        )
        n_train_side = len(examples) - len(test_rows)
        if rehearse not in state_files:  # one states file per distinct sequence list (test rows last)
            state_files[rehearse] = str(args.out / f".states-{rehearse}.safetensors")
            head_worker.hidden_states(
                {
                    "target": str(TARGET),
                    "aux_layers": AUX,
                    "sequences": [e["ids"] for e in examples],
                    "out": state_files[rehearse],
                    "device": args.device,
                }
            )
        hp = {
            "steps": 300,
            "lr": 3e-4,
            "batch_tokens": 32768,
            "ttt_steps": 3,
            "step_decay": 0.8,
            "prompt_weight": 0.1,
            "eval_every": 25,
            "seed": 0,
            **entry,
        }
        head_dir = args.out / tag
        # the trainer sees the training side only (its held-out check: the hash-held-out ids)
        answer = head_worker.train(
            {
                "target": str(TARGET),
                "parent": str(PARENT),
                "aux_layers": AUX,
                "states": state_files[rehearse],
                "examples": examples[:n_train_side],
                "pad": 0,
                "hyperparameters": hp,
                "out": str(head_dir),
                "device": args.device,
            }
        )
        features = head_worker.StoredFeatures(state_files[rehearse], target, device)
        every = [(e["ids"], e["prompt_len"], e["stratum"]) for e in examples]
        test_batches = [
            [n_train_side + i for i in b]
            for b in te.length_batches(every[n_train_side:], 32768, random.Random(0))
        ]

        def on_test(head, every=every, batches=test_batches, features=features):
            return te.evaluate(
                head,
                None,
                None,
                every,
                batches,
                steps=3,
                pad=0,
                device=device,
                prompt_weight=0.1,
                features=lambda rows, ids: features.batch(rows, ids.shape[1]),
            )

        initial, kept = (
            answer["held_out_initial"]["simulated_acceptance_length"],
            answer["held_out_kept"]["simulated_acceptance_length"],
        )
        record = {
            "command": " ".join(sys.argv),
            "made_by": "tasks/drafters/head_worker.py train (train-drafter's trainer), fine-tuning models/tiny-eagle3",
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "tag": tag,
            "hyperparameters": hp,
            "rehearsal_copies": rehearse,
            "data": {
                "files": {"workloads/shifted-train-outputs.jsonl": len(base)},
                "extra_windows": {
                    "offsets": list(EXTRA_OFFSETS),
                    "prompts": len(extra_rows),
                    "max_new_tokens": 64,
                },
                "train_examples": answer["train_examples"],
                "held_out_examples": answer["held_out_examples"],
                "sha256": digest(train_rows),
                "generation_seconds": generated_s,
            },
            "kept_step": answer["kept_step"],
            "held_out_initial": initial,
            "held_out_kept": kept,
            "test_shifted": {
                "prompts": len(test_rows),
                "parent": on_test(head_of(PARENT)),
                "adapted": on_test(head_of(head_dir)),
            },
            "curve": [
                {
                    "step": c["step"],
                    "loss": c["loss"],
                    "held_out": (c["held_out"] or {}).get("simulated_acceptance_length"),
                }
                for c in answer["curve"]
                if c["held_out"]
            ],
            "train_seconds": answer["train_seconds"],
        }
        (head_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")
        guard = all(kept[s] >= (1 - args.guard) * initial[s] for s in ("chat", "code"))
        results.append((guard, kept["shifted"], tag))
        test = record["test_shifted"]
        print(
            json.dumps(
                {
                    "tag": tag,
                    "kept_step": answer["kept_step"],
                    "held_out": {"initial": initial, "kept": kept},
                    "guard": guard,
                    "test_shifted": [
                        test["parent"]["simulated_acceptance_length"]["shifted"],
                        test["adapted"]["simulated_acceptance_length"]["shifted"],
                    ],
                    "seconds": answer["train_seconds"],
                }
            ),
            flush=True,
        )
    for path in state_files.values():
        Path(path).unlink()
    chosen = max(results)[2] if any(g for g, _, _ in results) else None
    (args.out / "chosen.txt").write_text(f"{chosen}\n")
    print(f"chosen: {chosen} ({time.time() - started:.0f} s in all)")
    return 0 if chosen else 1


if __name__ == "__main__":
    raise SystemExit(main())
