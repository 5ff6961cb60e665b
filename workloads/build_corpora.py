"""Build the shipped corpora (smoke.jsonl, capture.jsonl) from the standard-library files that the tiny
models never saw in training (the held-out split of models/train.py), so prompts are in-domain but not
memorised. Deterministic: the same Python stdlib gives the same files.

    .engine-venv/bin/python workloads/build_corpora.py   # needs `tokenizers` to size the long prompts
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import random
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
_spec = importlib.util.spec_from_file_location("train", REPO / "models" / "train.py")
train = importlib.util.module_from_spec(_spec)
sys.modules["train"] = train  # dataclasses look their module up there
_spec.loader.exec_module(train)  # type: ignore[union-attr]

GENERAL_CHAT = [
    "How do I read a text file line by line in Python?",
    "What is the difference between a list and a tuple?",
    "Explain what a context manager is.",
    "How do I sort a dictionary by its values?",
    "What does the `yield` keyword do?",
    "When should I use a dataclass?",
]
MAX_PROMPT_TOKENS = 1500  # long-context prompts stay inside the 2,048-token context with room to answer


def held_out_functions(stdlib: Path) -> list[tuple[str, ast.FunctionDef, str]]:
    found = []
    for path in train.stdlib_files(stdlib):
        rel = str(path.relative_to(stdlib))
        if not train.is_validation(rel) or "/test" in f"/{rel}":
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for node in tree.body:
            if (
                isinstance(node, ast.FunctionDef)
                and not node.name.startswith("_")
                and ast.get_docstring(node)
            ):
                found.append((module, node, source))
    return found


def held_out_modules(stdlib: Path) -> list[tuple[str, str]]:
    out = []
    for path in train.stdlib_files(stdlib):
        rel = str(path.relative_to(stdlib))
        if train.is_validation(rel) and "/test" not in f"/{rel}":
            out.append((rel, path.read_text(encoding="utf-8", errors="replace")))
    return out


def fit(text: str, tokenizer, limit: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= limit:
        return text
    lines = text.splitlines()
    while lines and len(tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"]) > limit:
        lines = lines[: int(len(lines) * 0.9)]
    return "\n".join(lines)


def build(stdlib: Path, per_stratum: int, seed: int, prefix: str, max_tokens: dict[str, int]) -> list[dict]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(REPO / "models" / "tiny-target")
    rng = random.Random(seed)
    functions = held_out_functions(stdlib)
    rng.shuffle(functions)
    modules = [m for m in held_out_modules(stdlib) if len(m[1]) > 3000]
    rng.shuffle(modules)
    rows: list[dict] = []

    chat_questions = list(GENERAL_CHAT)
    for module, node, _ in functions:
        chat_questions.append(rng.choice(train.EXPLAIN_QUESTIONS).format(mod=module, name=node.name))
    for i, question in enumerate(chat_questions[:per_stratum]):
        rows.append(
            {
                "id": f"{prefix}-chat-{i:02d}",
                "workload": "chat",
                "messages": [{"role": "user", "content": question}],
                "max_tokens": max_tokens["chat"],
            }
        )

    code = [f for f in functions if f[1].args.args][per_stratum : per_stratum * 2]
    for i, (module, node, _) in enumerate(code):
        args = ", ".join(a.arg for a in node.args.args)
        doc = train.lower_first(train.first_paragraph(ast.get_docstring(node) or ""))
        request = rng.choice(train.CODE_REQUESTS).format(name=node.name, args=args, doc=doc)
        rows.append(
            {
                "id": f"{prefix}-code-{i:02d}",
                "workload": "code",
                "source": module,
                "messages": [{"role": "user", "content": request}],
                "max_tokens": max_tokens["code"],
            }
        )

    for i, (rel, source) in enumerate(modules[:per_stratum]):
        body = fit(source, tokenizer, MAX_PROMPT_TOKENS)
        request = rng.choice(train.SUMMARY_REQUESTS).format(code=body)
        rows.append(
            {
                "id": f"{prefix}-sum-{i:02d}",
                "workload": "summarization",
                "source": rel,
                "messages": [{"role": "user", "content": request}],
                "max_tokens": max_tokens["summarization"],
            }
        )
    return rows


# The shifted stratum (issue 19): long-context summarization of the stdlib packages train.py skips
# (SKIP_DIRS: never in the tiny models' training, nor in the EAGLE-3 head's), so that adapting a head has
# something to find. Its files are split by path hash: the training part feeds train-drafter, the held-out
# part is what a confirmation measures (a fine-tune never sees its prompts, nor any window of its files).
SHIFTED_DIRS = ("idlelib", "lib2to3", "turtledemo")
SHIFTED_WINDOW = 1300  # source tokens per prompt: past the 1,024-token sequences the target trained on
SHIFTED_HELD_OUT = 0.2


def shifted_is_held_out(rel: str) -> bool:
    return hashlib.sha256(rel.encode()).digest()[0] < 256 * SHIFTED_HELD_OUT


def build_shifted(stdlib: Path, seed: int, max_tokens: int) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): each file of SHIFTED_DIRS (tests left out) cut into windows of
    SHIFTED_WINDOW tokens, every window (a last one of at least 600 tokens) one summarization request."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(REPO / "models" / "tiny-target")
    rng = random.Random(seed)
    sides: dict[bool, list[dict]] = {False: [], True: []}
    for name in SHIFTED_DIRS:
        for path in sorted((stdlib / name).rglob("*.py")):
            rel = str(path.relative_to(stdlib))
            if "test" in rel:
                continue
            ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)[
                "input_ids"
            ]
            held = shifted_is_held_out(rel)
            for start in range(0, max(len(ids) - 600, 1), SHIFTED_WINDOW):
                code = tokenizer.decode(ids[start : start + SHIFTED_WINDOW])
                if len(ids[start : start + SHIFTED_WINDOW]) < 300:
                    continue
                sides[held].append(
                    {
                        "workload": "shifted",
                        "source": f"{rel}@{start}",
                        "messages": [
                            {"role": "user", "content": rng.choice(train.SUMMARY_REQUESTS).format(code=code)}
                        ],
                        "max_tokens": max_tokens,
                    }
                )
    out = []
    for held, prefix in ((False, "shifted-train"), (True, "shifted")):
        out.append([{"id": f"{prefix}-{i:03d}", **row} for i, row in enumerate(sides[held])])
    return out[0], out[1]


def write(path: Path, header: str, rows: list[dict]) -> None:
    lines = [f"# {line}" for line in header.strip().splitlines()]
    lines += [json.dumps(row, ensure_ascii=False) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{path}: {len(rows)} prompts")


def main() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    write(
        HERE / "smoke.jsonl",
        "Smoke corpus: 4 prompts each of open chat, code and long-context summarization.\n"
        "Built by workloads/build_corpora.py from stdlib files held out of the tiny models' training.",
        build(stdlib, 4, seed=1, prefix="smoke", max_tokens={"chat": 64, "code": 96, "summarization": 64}),
    )
    write(
        HERE / "capture.jsonl",
        "Greedy-capture corpus for the correctness gate: 12 prompts per stratum (36).\n"
        "Built by workloads/build_corpora.py from stdlib files held out of the tiny models' training.",
        build(stdlib, 12, seed=2, prefix="cap", max_tokens={"chat": 48, "code": 48, "summarization": 48}),
    )

    shifted_train, shifted_held = build_shifted(stdlib, seed=3, max_tokens=64)
    write(
        HERE / "shifted-train.jsonl",
        "Shifted stratum, training part: long-context summarization of idlelib, lib2to3 and turtledemo\n"
        "(stdlib packages the tiny models never saw), 80% of their files by path hash. Built by\n"
        "workloads/build_corpora.py; train-drafter's input (models/README.md).",
        shifted_train,
    )
    write(
        HERE / "shifted.jsonl",
        "Shifted stratum, held-out part: the other 20% of those files' windows. A head adapted on\n"
        "shifted-train.jsonl never saw these prompts: confirmations measure them. Built by\n"
        "workloads/build_corpora.py.",
        shifted_held,
    )


if __name__ == "__main__":
    main()
