"""N-gram acceptance against context length, offline: the tiny target's greedy answers to the prompt-length
buckets (workloads/length-buckets.jsonl), replayed through the simulator's port of vLLM's prompt lookup
(analysis/simulate: exact for n-gram given the same outputs, docs/simulate.md) at k = 1, 3 and 5.

The answers come from `transformers` (greedy, float32, in the engine's venv), not from vLLM: a projection on
this corpus without launching an engine, not a served measurement (the engine test
tests/test_length_buckets.py measures the served counters). Prints one table, per bucket and depth.

    .venv/bin/python benchmarks/context_length_replay.py [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GENERATE = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(1)
model_dir, max_tokens, tail = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
out = []
for line in sys.stdin:
    row = json.loads(line)
    ids = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        gen = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens + tail, do_sample=False)
    new = gen[0, len(ids):].tolist()
    eos = tok.eos_token_id
    answer = new[: new.index(eos) + 1] if eos in new[:max_tokens] else new[:max_tokens]
    out.append({"id": row["id"], "stratum": row["workload"], "prompt": ids, "output": answer,
                "tail": [] if eos in answer else new[max_tokens:]})
json.dump(out, sys.stdout)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(REPO / "workloads" / "length-buckets.jsonl"))
    parser.add_argument("--model", default=str(REPO / "models" / "tiny-target"))
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    from analysis.simulate.proposers import NgramProposer
    from analysis.simulate.replay import Request, replay
    from specgauge.settings import get_settings
    from workloads.length_buckets import parse_bucket_stratum
    from workloads.schema import load_corpus

    rows = [
        {"id": p.id, "workload": p.workload, "messages": p.chat_messages()}
        for p in load_corpus(args.corpus).prompts
    ]
    done = subprocess.run(
        [str(get_settings().engine_python), "-c", GENERATE, args.model, str(args.max_tokens), "8"],
        input="\n".join(json.dumps(r) for r in rows),
        capture_output=True,
        text=True,
        check=True,
    )
    answers = json.loads(done.stdout)
    requests = [
        Request(a["id"], a["stratum"], tuple(a["prompt"]), tuple(a["output"]), tuple(a["tail"]))
        for a in answers
    ]
    strata = sorted({r.stratum for r in requests}, key=lambda s: (parse_bucket_stratum(s) or ("", 0))[1])
    print(
        "| bucket from (tokens) | prompts | mean prompt tokens | k | drafts | draft tokens | accepted | rate | MAL |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for k in (1, 3, 5):
        proposer = NgramProposer(min_n=1, max_n=4, max_model_len=2048)  # the campaign specs' n-gram settings
        result = replay(
            requests,
            lambda request, t, k=k, proposer=proposer: proposer.tree(request, t, 1, k, k),
            f"ngram-k{k}",
            k,
        )
        for stratum in strata:
            mine = [r for r in requests if r.stratum == stratum]
            c = result.total(stratum)
            rate = c.accepted / c.draft_tokens if c.draft_tokens else float("nan")
            mal = 1 + c.accepted / c.drafts if c.drafts else float("nan")
            print(
                f"| {parse_bucket_stratum(stratum)[1]} | {len(mine)} | {sum(len(r.prompt) for r in mine) / len(mine):.0f} "
                f"| {k} | {c.drafts} | {c.draft_tokens} | {c.accepted} | {rate:.3f} | {mal:.2f} |"
            )


if __name__ == "__main__":
    main()
