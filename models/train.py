"""Train the tiny target/draft pair that the embedded engine serves.

Both models are Llama-architecture decoders sharing one byte-level BPE tokenizer, trained on Python's
own standard library (sources, docstrings and the bundled pydoc topics), which every CPython install
carries, so the data is available offline. The text is shaped into the three strata specgauge measures:

- chat: "What does `json.dumps` do?" -> the docstring,
- code: "Write the Python function `name(args)` that ..." -> its source,
- summarization: a whole function or module -> its docstring's first paragraph (partly extractive,
  which is what lets n-gram prompt lookup find matches, as in real summarization),

plus raw source files for plain language modelling.

The target is trained on the data; the draft is distilled from the target (cross-entropy on the data plus
KL to the target's next-token distribution), the way real draft models are aligned with their target.

Run it with any Python that has torch, transformers, tokenizers and safetensors (the engine's venv has
them all); `--device cuda` when a GPU is at hand. See models/README.md for the command that produced the
committed weights.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SKIP_DIRS = {"site-packages", "idlelib", "lib2to3", "__pycache__", "turtledemo", "ensurepip"}
VALIDATION_SHARE = 0.05  # files whose path hash falls here are held out (and feed the prompt corpora)

EXPLAIN_QUESTIONS = [
    "What does `{mod}.{name}` do?",
    "Explain `{name}` from the `{mod}` module.",
    "How do I use `{mod}.{name}`?",
    "What is `{name}` in `{mod}` for?",
]
CODE_REQUESTS = [
    "Write the Python function `{name}({args})` that {doc}",
    "Implement `{name}({args})` in Python. It should {doc}",
]
SUMMARY_REQUESTS = [
    "Summarize the following Python code.\n\n{code}",
    "Read this code and summarize what it does.\n\n{code}",
]


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    intermediate: int


TARGET_SHAPE = ModelShape(layers=6, hidden=320, heads=5, intermediate=864)
DRAFT_SHAPE = ModelShape(layers=2, hidden=192, heads=3, intermediate=512)


def is_validation(path: str) -> bool:
    digest = hashlib.sha256(path.encode()).digest()
    return digest[0] < 256 * VALIDATION_SHARE


def stdlib_files(stdlib: Path) -> list[Path]:
    files = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if SKIP_DIRS.intersection(rel.parts):
            continue
        files.append(path)
    return files


def chat(user: str, assistant: str) -> str:
    return f"<|user|>\n{user}<|end|>\n<|assistant|>\n{assistant}<|end|>\n"


def first_paragraph(doc: str) -> str:
    return doc.strip().split("\n\n")[0].strip()


def lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text else text


def examples_from_source(module: str, source: str, rng: random.Random) -> list[str]:
    """Instruction-shaped examples (chat, code, summarization) from one module's source."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out: list[str] = []
    module_doc = ast.get_docstring(tree)
    if module_doc and len(module_doc) > 60:
        body_start = tree.body[1].lineno - 1 if len(tree.body) > 1 else len(lines)
        code = "\n".join(lines[body_start : body_start + 120])
        request = rng.choice(SUMMARY_REQUESTS).format(code=code)
        out.append(chat(request, first_paragraph(module_doc)))
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 30 or node.name.startswith("_"):
            continue
        segment = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        if len(segment) > 6000:
            continue
        question = rng.choice(EXPLAIN_QUESTIONS).format(mod=module, name=node.name)
        out.append(chat(question, doc.strip()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = ", ".join(a.arg for a in node.args.args)
            request = rng.choice(CODE_REQUESTS).format(
                name=node.name, args=args, doc=lower_first(first_paragraph(doc))
            )
            out.append(chat(request, f"```python\n{segment}\n```"))
        if len(segment) > 400:
            request = rng.choice(SUMMARY_REQUESTS).format(code=segment)
            out.append(chat(request, first_paragraph(doc)))
    return out


def pydoc_topic_examples() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [chat(f"Explain the Python topic `{name}`.", text.strip()[:4000]) for name, text in topics.items()]


def build_corpus(stdlib: Path, seed: int) -> tuple[list[str], list[str], dict]:
    rng = random.Random(seed)
    train: list[str] = []
    valid: list[str] = []
    stats = {"files": 0, "raw_chars": 0, "examples": 0}
    for path in stdlib_files(stdlib):
        rel = str(path.relative_to(stdlib))
        source = path.read_text(encoding="utf-8", errors="replace")
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        docs = [source, *examples_from_source(module, source, rng)]
        stats["files"] += 1
        stats["raw_chars"] += len(source)
        stats["examples"] += len(docs) - 1
        (valid if is_validation(rel) else train).extend(docs)
    train.extend(pydoc_topic_examples())
    rng.shuffle(train)
    return train, valid, stats


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:4],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    return fast


def pack(tokenizer, texts: list[str], seq_len: int):
    import torch

    sep = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids: list[int] = []
    for start in range(0, len(texts), 512):
        for encoded in tokenizer(texts[start : start + 512], add_special_tokens=False)["input_ids"]:
            ids.extend(encoded)
            ids.append(sep)
    usable = (len(ids) // (seq_len + 1)) * (seq_len + 1)
    return torch.tensor(ids[:usable], dtype=torch.long).view(-1, seq_len + 1), len(ids)


def make_model(shape: ModelShape, tokenizer, max_positions: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def evaluate(model, data, device, batch: int) -> float:
    import torch

    model.eval()
    losses = []
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        for start in range(0, min(len(data), batch * 8), batch):
            chunk = data[start : start + batch].to(device)
            logits = model(input_ids=chunk[:, :-1]).logits
            losses.append(float(lm_loss(logits, chunk[:, 1:])))
    model.train()
    return sum(losses) / max(len(losses), 1)


def lm_loss(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def train_model(
    name: str,
    model,
    train_data,
    valid_data,
    *,
    device,
    steps: int,
    batch: int,
    lr: float,
    teacher=None,
    distill_weight: float = 0.5,
    log_every: int = 100,
) -> dict:
    import torch
    import torch.nn.functional as F

    model.to(device).train()
    if teacher is not None:
        teacher.to(device).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(steps // 50, 10)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    generator = torch.Generator().manual_seed(0)
    history = []
    best = {"valid_loss": float("inf"), "step": -1, "state": None}
    started = time.time()
    for step in range(steps):
        rows = torch.randint(0, len(train_data), (batch,), generator=generator)
        chunk = train_data[rows].to(device, non_blocking=True)
        inputs, targets = chunk[:, :-1], chunk[:, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(input_ids=inputs).logits
            loss = lm_loss(logits, targets)
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(input_ids=inputs).logits.float()
                kl = F.kl_div(
                    F.log_softmax(logits.float(), dim=-1).reshape(-1, logits.size(-1)),
                    F.log_softmax(teacher_logits, dim=-1).reshape(-1, logits.size(-1)),
                    log_target=True,
                    reduction="batchmean",
                )
                loss = (1 - distill_weight) * loss + distill_weight * kl
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % log_every == 0 or step == steps - 1:
            entry = {"step": step, "loss": round(loss.item(), 4), "seconds": round(time.time() - started, 1)}
            if step % (log_every * 5) == 0 or step == steps - 1:
                entry["valid_loss"] = round(evaluate(model, valid_data, device, batch), 4)
                # Keep the best held-out checkpoint: the corpus is small and many epochs overfit it.
                if entry["valid_loss"] < best["valid_loss"]:
                    best = {
                        "valid_loss": entry["valid_loss"],
                        "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    }
            history.append(entry)
            print(f"[{name}] {json.dumps(entry)}", flush=True)
    model.load_state_dict(best["state"])
    return {
        "steps": steps,
        "batch": batch,
        "train_seconds": round(time.time() - started, 1),
        "kept_step": best["step"],
        "final_train_loss": history[-1]["loss"],
        "kept_valid_loss": best["valid_loss"],
        "history": history,
    }


def sample(model, tokenizer, device, prompt: str, max_new_tokens: int = 80) -> str:
    import torch

    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]], device=device)
    model.eval()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)


def save(model, tokenizer, out_dir: Path, report: dict) -> None:
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training.json").write_text(json.dumps(report, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--target-steps", type=int, default=3000)
    parser.add_argument("--draft-steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else args.device)
    if device.type == "auto":
        device = torch.device("cpu")
    started = time.time()
    train_texts, valid_texts, stats = build_corpus(args.stdlib, args.seed)
    print(f"corpus: {stats}, train docs {len(train_texts)}, valid docs {len(valid_texts)}", flush=True)
    tokenizer = train_tokenizer(train_texts, args.vocab_size)
    train_data, train_tokens = pack(tokenizer, train_texts, args.seq_len)
    valid_data, valid_tokens = pack(tokenizer, valid_texts, args.seq_len)
    print(f"tokens: train {train_tokens}, valid {valid_tokens}", flush=True)

    common = {
        "data": {
            "source": f"CPython standard-library sources ({args.stdlib.name}), tests included",
            **stats,
            "train_tokens": train_tokens,
            "valid_tokens": valid_tokens,
            "validation_share_of_files": VALIDATION_SHARE,
        },
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "seq_len": args.seq_len,
        "command": "python models/train.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }

    def train(name: str, model, **settings) -> dict:  # both models see the same data, device and batch
        return train_model(name, model, train_data, valid_data, device=device, batch=args.batch, **settings)

    target = make_model(TARGET_SHAPE, tokenizer, max_positions=2048)
    target_report = train("target", target, steps=args.target_steps, lr=2e-3)
    draft = make_model(DRAFT_SHAPE, tokenizer, max_positions=2048)
    draft_report = train("draft", draft, steps=args.draft_steps, lr=3e-3, teacher=target)
    prompts = [
        "What does `json.dumps` do?",
        "Write the Python function `chunked(items, size)` that splits a list.",
    ]
    for name, model, shape, report in (
        ("tiny-target", target, TARGET_SHAPE, target_report),
        ("tiny-draft", draft, DRAFT_SHAPE, draft_report),
    ):
        report.update(common)
        report["shape"] = shape.__dict__
        report["parameters"] = sum(p.numel() for p in model.parameters())
        report["samples"] = {p: sample(model, tokenizer, device, p) for p in prompts}
        save(model, tokenizer, args.out / name, report)
        print(
            f"{name}: {report['parameters']} parameters, samples {json.dumps(report['samples'])}", flush=True
        )
    print(f"total {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
