"""Why tasks/load/http1.py exists: token chunks per CPU-second of HTTP stacks reading the same streams.

Each stack streams the same chat completions from the emulator (own process, CPU 1) at closed-loop
concurrency C, parses every SSE data line with orjson, and counts chunks; the client process (CPU 0)
reports chunks / its CPU seconds. Stacks: httpx with httpx-sse, httpx reading raw bytes (our own SSE
split), aiohttp (from the engine's venv, where vLLM's client uses it), and StreamingClient (http1.py, the
full record-keeping client). All on uvloop.

    .venv/bin/python benchmarks/client_transport_choice.py [--levels 64,256] [--rounds 3]
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

REPO = Path(__file__).resolve().parent.parent
BODY = (
    b'{"model":"emulated","messages":[{"role":"user","content":"hello"}],"max_tokens":32,"stream":true,'
    b'"stream_options":{"include_usage":true},"return_token_ids":true}'
)
HEADERS = {"content-type": "application/json"}


def lines_to_chunks(lines: list[bytes], loads) -> int:
    n = 0
    for line in lines:
        if line[:5] == b"data:":
            data = line[5:].strip()
            if data != b"[DONE]":
                loads(data)
                n += 1
    return n


async def httpx_sse(url: str, concurrency: int, total: int) -> int:
    import httpx
    import orjson
    from httpx_sse import EventSource

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def one() -> int:
            n = 0
            async with client.stream("POST", url, content=BODY, headers=HEADERS) as response:
                async for event in EventSource(response).aiter_sse():
                    if event.data != "[DONE]":
                        orjson.loads(event.data)
                        n += 1
            return n

        return await closed_loop(one, concurrency, total)


async def httpx_raw(url: str, concurrency: int, total: int) -> int:
    import httpx
    import orjson

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def one() -> int:
            n, pending = 0, b""
            async with client.stream("POST", url, content=BODY, headers=HEADERS) as response:
                async for raw in response.aiter_raw():
                    *lines, pending = (pending + raw).split(b"\n")
                    n += lines_to_chunks(lines, orjson.loads)
            return n

        return await closed_loop(one, concurrency, total)


async def aiohttp_raw(url: str, concurrency: int, total: int) -> int:
    import json

    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def one() -> int:
            n, pending = 0, b""
            async with session.post(url, data=BODY, headers=HEADERS) as response:
                async for raw in response.content.iter_any():
                    *lines, pending = (pending + raw).split(b"\n")
                    n += lines_to_chunks(lines, json.loads)
            return n

        return await closed_loop(one, concurrency, total)


async def streaming_client(url: str, concurrency: int, total: int) -> int:
    sys.path.insert(0, str(REPO))
    from experiments.spec import Sampling
    from tasks.load.client import StreamingClient
    from workloads.schema import Prompt

    prompt = Prompt(id="p", workload="w", messages=[{"role": "user", "content": "hello"}], max_tokens=32)
    base = url.rsplit("/v1/", 1)[0]
    async with StreamingClient(base, "emulated", max_connections=concurrency) as client:
        t0 = time.perf_counter()

        async def one() -> int:
            record = await client.send(prompt, Sampling(), index=0, phase="measured", t0=t0, queued_s=0.0)
            if not record.ok:
                raise RuntimeError(record.error)
            return record.chunks

        return await closed_loop(one, concurrency, total)


async def closed_loop(one, concurrency: int, total: int) -> int:
    left = [total]

    async def worker() -> int:
        n = 0
        while left[0] > 0:
            left[0] -= 1
            n += await one()
        return n

    await asyncio.gather(*(one() for _ in range(concurrency)))  # open the connections first
    start = time.process_time()
    chunks = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
    print(f"RESULT {chunks} {time.process_time() - start}", flush=True)
    return chunks


STACKS = {
    "httpx + httpx-sse": httpx_sse,
    "httpx, raw bytes": httpx_raw,
    "aiohttp": aiohttp_raw,
    "StreamingClient (http1.py)": streaming_client,
}


def run_stack(name: str, url: str, concurrency: int, total: int, engine_python: str) -> tuple[int, float]:
    python = engine_python if name == "aiohttp" else sys.executable
    cmd = [python, __file__, "--child", name, url, str(concurrency), str(total)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-2000:]}")
    _, chunks, cpu = line.split()
    return int(chunks), float(cpu)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        name, url, concurrency, total = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {0})
        try:
            import uvloop

            uvloop.run(STACKS[name](url, concurrency, total))
        except ImportError:
            asyncio.run(STACKS[name](url, concurrency, total))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", default="64,256")
    parser.add_argument("--rounds", type=int, default=3, help="requests per worker")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from emulator import EmulatorConfig, EmulatorProcess
    from specgauge.settings import get_settings

    engine_python = str(get_settings().engine_python)
    print("| C | stack | chunks | client CPU s | chunks / CPU-s |\n|---|---|---|---|---|")
    for concurrency in (int(x) for x in args.levels.split(",")):
        with EmulatorProcess(EmulatorConfig(port=0, ttft_ms=20, step_ms=10), cpu=1) as emu:
            for name in STACKS:
                chunks, cpu = run_stack(
                    name,
                    f"{emu.url}/v1/chat/completions",
                    concurrency,
                    concurrency * args.rounds,
                    engine_python,
                )
                print(f"| {concurrency} | {name} | {chunks} | {cpu:.2f} | {chunks / cpu:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
