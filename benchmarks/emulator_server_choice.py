"""Why the emulator is a raw asyncio HTTP server: its CPU per streamed chunk against a minimal ASGI app.

Both servers stream the same vLLM-shaped chat chunks on the same schedule (TTFT, then one chunk a step on
absolute deadlines) and run under uvloop in their own process pinned to CPU 1; our client drives them from
CPU 0 at the same closed-loop concurrency. The ASGI side is a bare ASGI callable (no framework) under
uvicorn with httptools, the fastest ASGI setup we know of. Printed: server CPU seconds per 1,000 chunks and
the p99 of the client-measured TPOT minus the injected step (lateness of a server that cannot keep up).

    .venv/bin/python benchmarks/emulator_server_choice.py [--concurrency 256] [--requests 512]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

from emulator import EmulatorConfig, EmulatorProcess
from experiments.spec import Sampling
from tasks.load.client import StreamingClient
from tasks.load.runner import LoadPlan, run_load
from workloads.schema import Prompt

REPO = Path(__file__).resolve().parent.parent

TTFT_S, STEP_S, TOKENS, MODEL = 0.05, 0.02, 32, "emulated"


async def asgi_app(scope, receive, send) -> None:
    """The same stream as the emulator's (role chunk, one token a step, usage, [DONE]) as bare ASGI."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    arrived = time.perf_counter()
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    n = int(orjson.loads(body).get("max_tokens") or TOKENS)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
        }
    )
    base = {"id": "chatcmpl-asgi", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    for i in range(n):
        delay = arrived + TTFT_S + i * STEP_S - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        delta = {"content": " w"} if i else {"role": "assistant", "content": " w"}
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": "length" if i == n - 1 else None,
            "token_ids": [i + 2],
        }
        await send(
            {
                "type": "http.response.body",
                "body": b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n",
                "more_body": True,
            }
        )
    usage = {
        **base,
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
    }
    await send(
        {"type": "http.response.body", "body": b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"}
    )


def serve_asgi(port: int) -> None:
    import uvicorn

    uvicorn.run(
        asgi_app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        backlog=4096,
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(url: str, concurrency: int, requests: int) -> list[float]:
    import uvloop

    prompts = [Prompt(id="p", workload="w", messages=[{"role": "user", "content": "hi"}], max_tokens=TOKENS)]
    plan = LoadPlan("closed", concurrency=concurrency, requests=requests, warmup=concurrency)

    async def main() -> list[float]:
        async with StreamingClient(url, MODEL, max_connections=concurrency, want_token_ids=False) as client:
            result = await run_load(client, prompts, plan, Sampling())
        bad = [r.error for r in result.measured if not r.ok]
        if bad:
            raise RuntimeError(f"{len(bad)} requests failed: {bad[:3]}")
        return [r.tpot_s - STEP_S for r in result.measured]

    return uvloop.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--serve-asgi", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_asgi:
        serve_asgi(args.serve_asgi)
        return
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {0})
    rows = []
    emu = EmulatorProcess(
        EmulatorConfig(port=0, model=MODEL, ttft_ms=TTFT_S * 1000, step_ms=STEP_S * 1000), cpu=1
    )
    emu.start()
    try:
        before = emu.cpu_seconds()
        late = drive(emu.url, args.concurrency, args.requests)
        rows.append(("raw asyncio + httptools (emulator)", emu.cpu_seconds() - before, late))
    finally:
        emu.stop()
    from tasks.launch.local import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-asgi", str(port)], cwd=REPO)
    try:
        os.sched_setaffinity(proc.pid, {1})
        import httpx

        for _ in range(100):
            with contextlib.suppress(httpx.TransportError):
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            time.sleep(0.1)
        before = cpu_seconds(proc.pid)
        late = drive(f"http://127.0.0.1:{port}", args.concurrency, args.requests)
        rows.append(("bare ASGI under uvicorn + httptools", cpu_seconds(proc.pid) - before, late))
    finally:
        proc.terminate()
        proc.wait(10)
    chunks = (args.requests + args.concurrency) * TOKENS
    print(
        f"C={args.concurrency}, {args.requests} requests (+{args.concurrency} warm-up) of {TOKENS} chunks, "
        f"step {STEP_S * 1000:g} ms\n"
    )
    print("| server | CPU s per 1,000 chunks | TPOT - step p50 / p99 (ms) |")
    print("|---|---|---|")
    for name, cpu, late in rows:
        print(
            f"| {name} | {cpu / chunks * 1000:.3f} | {np.percentile(late, 50) * 1000:.2f} / "
            f"{np.percentile(late, 99) * 1000:.2f} |"
        )
    print(f"\nASGI / raw CPU per chunk: {rows[1][1] / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()
