"""Serve an EAGLE-3 head for tiny-target with vLLM (offline, greedy, k=3) on the smoke corpus's code prompts and
print what vLLM's own counters say: drafts, drafted and accepted tokens. Two heads that compute the same
function must give the same counts (models/README.md: the 2-layer head's warm start against tiny-eagle3).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 \\
        .engine-venv/bin/python models/check_head_vllm.py models/tiny-eagle3-2layer
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(head: str) -> int:
    from vllm import LLM, SamplingParams

    lines = (REPO / "workloads" / "smoke.jsonl").read_text(encoding="utf-8").splitlines()
    prompts = [json.loads(line) for line in lines if line.startswith("{")]
    conversations = [p["messages"] for p in prompts if p["workload"] == "code"]
    started = time.time()
    llm = LLM(
        model=str(REPO / "models" / "tiny-target"),
        max_model_len=1024,
        enforce_eager=True,
        seed=0,
        dtype="bfloat16",
        disable_log_stats=False,  # the counters below need the engine's stats
        speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": 3},
    )
    ready_s = time.time() - started
    outputs = llm.chat(conversations, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    counters = {m.name: m.value for m in llm.get_metrics() if "spec_decode" in m.name and hasattr(m, "value")}
    answer = {
        "head": head,
        "ready_s": round(ready_s, 1),
        "prompts": len(conversations),
        "tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "counters": counters,
    }
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
