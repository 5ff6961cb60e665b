"""How accurate and how cheap is our streaming client? Side by side with vLLM's own benchmark client.

Part 1, the emulator (emulator/, in its own process, pinned to CPU 1; the clients run on CPU 0): every
request gets a known injected TTFT and step time (one token a chunk), at closed-loop C = 1, 64, 256, 1024
and at the open-loop (Poisson) rates that give the same mean concurrency (Little's law). For each client:
the error (measured minus injected) of TTFT and TPOT at p50 and p99, and token chunks per CPU-second of
the client process (process time: ours around `run_load`, vLLM's around its `benchmark()` coroutine). The
emulator's own lateness (its write times minus the injected schedule, from its trace) is shown too: it is
inside both clients' errors and is no client's fault.

Part 2, the real engine (plain variant of experiments/demo.yaml, holding the engine lock): both clients,
same prompts (workloads/smoke.jsonl), same settings, at C = 1 and 4; their TTFT and TPOT medians.

Targets (issue 3): p99 TTFT error <= 2 ms at C=256 and no worse than vLLM's client at any C; twice its
chunk rate per core. `--quick` runs C = 1, 64, 256 with fewer requests.

    .venv/bin/python benchmarks/client_accuracy.py [--quick] [--skip-engine] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from emulator import EmulatorConfig, EmulatorProcess
from experiments.spec import Sampling
from tasks.load.client import StreamingClient
from tasks.load.runner import LoadPlan, run_load
from workloads.schema import Prompt, load_corpus

REPO = Path(__file__).resolve().parent.parent

TTFT_MS = 50.0
# The emulator polls for the last 1.5 ms before each write (its timers round to 1 ms), so that its own
# lateness, which counts in the error, stays in the tens of microseconds; it costs the emulator's core.
SPIN_MS = 1.5
STARVED_S = 0.003  # emulator lateness (p50; p95 over 10x this plus BURST_S per stream) that means another
BURST_S = 0.00005  # process had the CPU: then the pair is run again (a burst of C requests takes C x BURST_S)
RETRIES = 2
TOKENS = 32
MODEL = "emulated"
TOKENIZER = REPO / "models" / "tiny-target"
ENGINE_LOCK = Path(os.environ.get("SPECGAUGE_ENGINE_LOCK", "/tmp/specgauge-engine.lock"))


def step_ms(concurrency: int) -> float:
    """A step time that grows with the batch, like an engine's: 10 ms up to C=64, 20 at 256, 40 at 1024."""
    return max(10.0, concurrency * 0.04)


@dataclass
class Run:
    client: str  # "specgauge" or "vllm"
    mode: str  # "closed" or "open"
    concurrency: int
    rate: float | None
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    chunks: int = 0
    cpu_s: float = 0.0
    attempts: int = 1
    bursts: int = 0  # ok measured requests whose every token arrived within 1 ms (the server held them)
    measured_tokens: int = 0  # ok measured requests: tokens and token-bearing chunks
    measured_chunks: int = 0
    failed: int = 0
    sent_at: list[float] = field(default_factory=list)  # perf_counter (CLOCK_MONOTONIC), per ok request
    first_at: list[float] = field(default_factory=list)
    intake_s: list[float] = field(default_factory=list)  # client send -> emulator read the request
    server_ttft_late_s: list[float] = field(default_factory=list)  # emulator: first write - arrival - TTFT
    receive_s: list[float] = field(default_factory=list)  # emulator wrote the first token -> client stamp

    @property
    def load(self) -> str:
        return (
            f"C={self.concurrency}" if self.mode == "closed" else f"{self.rate:.1f}/s (~C={self.concurrency})"
        )


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def prompts(n: int = 16) -> list[Prompt]:
    """The smoke corpus' prompts as one user message each: exactly what vLLM's client sends for them."""
    corpus = list(load_corpus(REPO / "workloads" / "smoke.jsonl").prompts)[:n]
    return [
        Prompt(
            id=p.id,
            workload=p.workload,
            max_tokens=TOKENS,
            messages=[{"role": "user", "content": p.messages[-1].content}],
        )
        for p in corpus
    ]


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


# -- our client -------------------------------------------------------------------------------------------------
def run_ours(url: str, model: str, plan: LoadPlan, sampling: Sampling, corpus: list[Prompt], run: Run) -> Run:
    import uvloop

    async def main() -> tuple[list, float]:
        async with StreamingClient(url, model, max_connections=plan.connections(), timeout_s=120) as client:
            start = time.process_time()
            result = await run_load(client, corpus, plan, sampling)
            return result.records, time.process_time() - start, result.t0_perf

    records, run.cpu_s, t0 = uvloop.run(main())
    for r in records:
        run.chunks += r.chunks  # CPU time covers warm-up too, so chunks do
        if r.phase != "measured":
            continue
        if not r.ok:
            run.failed += 1
            continue
        run.ttft_s.append(r.ttft_s)
        run.tpot_s.append(r.tpot_s)
        run.measured_tokens += r.completion_tokens
        run.measured_chunks += r.chunks
        run.bursts += r.e2e_s - r.ttft_s < 0.001
        run.sent_at.append(t0 + r.sent_s)
        run.first_at.append(t0 + r.first_token_s)
    return run


# -- vLLM's client ------------------------------------------------------------------------------------------------
def vllm_args(
    url: str, model: str, data: Path, n: int, warmup: int, concurrency: int | None, rate: float | None
) -> list[str]:
    args = [
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        url,
        "--model",
        model,
        "--tokenizer",
        str(TOKENIZER),
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(data),
        "--sharegpt-output-len",
        str(TOKENS),
        "--disable-shuffle",
        "--num-prompts",
        str(n),
        "--num-warmups",
        str(warmup),
        "--ignore-eos",
        "--temperature",
        "0",
        "--save-detailed",
        "--disable-tqdm",
        "--request-rate",
        "inf" if rate is None else repr(rate),
        "--percentile-metrics",
        "ttft,tpot,itl",
        "--metric-percentiles",
        "50,99",
    ]
    if concurrency is not None:
        args += ["--max-concurrency", str(concurrency)]
    return args


class VllmClient:
    """vLLM's benchmark client in a child process (engine venv, vLLM imported once), one run at a time."""

    def __init__(self, engine_python: Path, log: Path) -> None:
        self.log = open(log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [str(engine_python), str(REPO / "benchmarks" / "vllm_bench_client.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=REPO,
        )
        self._expect("READY")

    def _expect(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"vLLM's client ended (exit {self.proc.wait()}); see {self.log.name}")

    def run(self, run: Run, args: list[str]) -> Run:
        """Run vLLM's client; its CPU time covers its warm-up requests, so their chunks are counted too."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        result = json.loads(self._expect("RESULT "))
        run.cpu_s = result["cpu_s"]
        run.chunks += int(args[args.index("--num-warmups") + 1]) * TOKENS
        rows = zip(
            result["ttfts"],
            result["itls"],
            result["output_lens"],
            result["errors"],
            result["start_times"],
            strict=True,
        )
        for ttft, itls, n, error, start in rows:
            if error or not n:
                run.failed += 1
                continue
            run.ttft_s.append(ttft)
            run.sent_at.append(start)  # vLLM's start_time is time.perf_counter() too
            run.first_at.append(start + ttft)
            run.tpot_s.append(sum(itls) / (n - 1) if n > 1 else 0.0)
            run.chunks += n
            run.measured_tokens += n
            run.bursts += sum(itls) < 0.001
            run.measured_chunks += len(itls)  # the role chunk starts TTFT; each later chunk adds a gap
        return run

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def dataset_file(corpus: list[Prompt], workdir: Path) -> Path:
    """The same prompts as a ShareGPT-format file (vLLM's `custom` dataset would need pandas)."""
    path = workdir / "prompts.json"
    entries = [
        {
            "id": p.id,
            "conversations": [
                {"from": "human", "value": p.messages[-1].content},
                {"from": "gpt", "value": "unused"},
            ],
        }
        for p in corpus
    ]
    path.write_text(json.dumps(entries))
    return path


def server_lateness(emu: EmulatorProcess, run: Run, ttft_ms: float) -> None:
    """Split each TTFT error in three: intake (send -> emulator reads the request), the emulator's own
    lateness (first write - arrival - injected TTFT) and receive (first write -> the client's timestamp).

    Both processes read CLOCK_MONOTONIC, so times compare directly. Requests are paired in send order with
    the emulator's requests in arrival order (warm-up excluded); a mis-paired neighbour only moves time
    between the parts of one error, whose sum is exact: intake + lateness + receive = TTFT - injected.
    """
    first_send = min(run.sent_at, default=0.0)
    trace = sorted(
        (t for t in emu.trace() if t["received"] >= first_send - 1e-4), key=lambda t: t["received"]
    )
    client = sorted(zip(run.sent_at, run.first_at, strict=True))
    for (sent, first), t in zip(client, trace, strict=False):
        run.intake_s.append(t["received"] - sent)
        run.server_ttft_late_s.append(t["first"] - t["received"] - ttft_ms / 1000)
        run.receive_s.append(first - t["first"])


# -- part 1 --------------------------------------------------------------------------------------------------------
def emulator_part(levels: list[int], quick: bool, vllm: VllmClient, workdir: Path) -> list[Run]:
    corpus = prompts()
    data = dataset_file(corpus, workdir)
    sampling = Sampling(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    runs: list[Run] = []
    emulators: dict[tuple[int, str], EmulatorProcess] = {}
    try:
        plans = []
        for c in levels:
            # at C = 1 a client spends about 0.1 CPU-s on 20 requests: too small a sample for its chunk rate
            n = max(10, c) if quick else max(64, 2 * c)
            duration = (TTFT_MS + (TOKENS - 1) * step_ms(c)) / 1000
            rate = c / duration  # Little's law: this rate keeps C requests in flight on average
            for mode in ("closed", "open"):
                config = EmulatorConfig(
                    port=0, model=MODEL, ttft_ms=TTFT_MS, step_ms=step_ms(c), spin_ms=SPIN_MS, trace=True
                )
                emu = EmulatorProcess(config, cpu=1)
                emu.start()
                emulators[(c, mode)] = emu
                plan = (
                    LoadPlan("closed", concurrency=c, requests=n, warmup=c)
                    if mode == "closed"
                    else LoadPlan("open", rate=rate, requests=n, warmup=c, seed=1)
                )
                plans.append((c, mode, n, rate, plan))
        # each pair runs back to back, so that the machine's load is the same for both clients
        for c, mode, n, rate, plan in plans:
            emu = emulators[(c, mode)]
            for attempt in range(1 + RETRIES):
                print(f"  {mode:6s} C={c:<5d} n={n}: specgauge, then vLLM's client ...", flush=True)
                ours = Run("specgauge", mode, c, rate if mode == "open" else None)
                run_ours(emu.url, MODEL, plan, sampling, corpus, ours)
                server_lateness(emu, ours, TTFT_MS)
                theirs = Run("vllm", mode, c, rate if mode == "open" else None)
                open_rate = rate if mode == "open" else None
                vllm.run(theirs, vllm_args(emu.url, MODEL, data, n, c, None if open_rate else c, open_rate))
                server_lateness(emu, theirs, TTFT_MS)
                late = ours.server_ttft_late_s + theirs.server_ttft_late_s
                starved = pct(late, 50) > STARVED_S or pct(late, 95) > STARVED_S * 10 + c * BURST_S
                if not starved:
                    break
                # The emulator is the reference: when its median write is this late, something else had
                # the CPU and neither client's figures mean anything; run the pair again.
                again = "again" if attempt < RETRIES else "keeping this run"
                print(
                    f"    emulator late by {ms(pct(late, 50))} / {ms(pct(late, 95))} ms (p50 / p95): busy, {again}"
                )
            ours.attempts = theirs.attempts = attempt + 1
            runs += [ours, theirs]
    finally:
        for emu in emulators.values():
            emu.stop()
    return runs


# -- part 2 --------------------------------------------------------------------------------------------------------
def merge(into: Run, other: Run) -> None:
    """Add another run of the same client and load to `into` (lists joined, counts added)."""
    for name, value in other.__dict__.items():
        if isinstance(value, list):
            getattr(into, name).extend(value)
        elif isinstance(value, int | float) and name not in ("concurrency", "rate", "attempts"):
            setattr(into, name, getattr(into, name) + value)


def engine_part(vllm: VllmClient, workdir: Path, quick: bool) -> list[Run]:
    from experiments.spec import load_spec
    from tasks.health import wait_ready
    from tasks.launch.local import LocalLauncher

    spec = load_spec(REPO / "experiments" / "demo.yaml")
    variant = next(v for v in spec.variants if v.method == "none")
    corpus = prompts(8)
    data = dataset_file(corpus, workdir)
    sampling = Sampling(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    runs: list[Run] = []
    ENGINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(ENGINE_LOCK, "w") as lock:
        print("  waiting for the engine lock ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        launcher = LocalLauncher(spec.launcher)
        deployment = launcher.launch(
            spec.target, variant, deployment_id="bench.client-accuracy", directory=workdir / "engine"
        )
        try:
            print("  starting the plain engine (about a minute) ...", flush=True)
            wait_ready(deployment, launcher, timeout_s=600)
            model, url = deployment.served_model_name, deployment.base_url
            n = 8 if quick else 16
            for c in (1, 4):
                # alternate the clients, twice, so that a change in the machine's load hits both alike
                ours, theirs = Run("specgauge", "closed", c, None), Run("vllm", "closed", c, None)
                for _ in range(2):
                    print(f"  closed C={c} n={n}: vLLM's client, then specgauge ...", flush=True)
                    merge(
                        theirs,
                        vllm.run(Run("vllm", "closed", c, None), vllm_args(url, model, data, n, 2, c, None)),
                    )
                    plan = LoadPlan("closed", concurrency=c, requests=n, warmup=2)
                    merge(
                        ours,
                        run_ours(url, model, plan, sampling, corpus, Run("specgauge", "closed", c, None)),
                    )
                runs += [ours, theirs]
        finally:
            launcher.teardown(deployment)
    return runs


# -- report -------------------------------------------------------------------------------------------------------
def ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def p50_99(values: list[float]) -> str:
    return f"{ms(pct(values, 50))} / {ms(pct(values, 99))}"


def emulator_table(runs: list[Run]) -> str:
    lines = [
        f"Injected: TTFT {TTFT_MS:g} ms; step 10 ms (C<=64), 20 ms (C=256), 40 ms (C=1024); {TOKENS} tokens, one a "
        "chunk. Times in ms.",
        "",
        "TTFT error = intake (send -> emulator reads it) + emulator lateness + receive (emulator writes the",
        "first token -> client timestamp); only receive is the client's own (with the kernel's loopback).",
        "",
        "| load | client | ok | TTFT err p50 / p99 | intake p50 / p99 | emulator late p50 / p99 "
        "| receive p50 / p99 | TPOT err p50 / p99 | chunks | CPU s | chunks / CPU-s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        step = step_ms(r.concurrency) / 1000
        ttft_err = [t - TTFT_MS / 1000 for t in r.ttft_s]
        tpot_err = [t - step for t in r.tpot_s]
        lines.append(
            f"| {r.mode} {r.load}{f' ({r.attempts} tries)' if r.attempts > 1 else ''} | {r.client} | {len(r.ttft_s)}/{len(r.ttft_s) + r.failed} "
            f"| {p50_99(ttft_err)} | {p50_99(r.intake_s)} | {p50_99(r.server_ttft_late_s)} | {p50_99(r.receive_s)} "
            f"| {p50_99(tpot_err)} | {r.chunks} | {r.cpu_s:.2f} | {r.chunks / r.cpu_s:,.0f} |"
        )
    return "\n".join(lines)


def ratio_table(runs: list[Run]) -> str:
    lines = [
        "| load | p99 TTFT err: specgauge / vLLM (ms) | TTFT p99 ok? | chunks/CPU-s: specgauge / vLLM | x |",
        "|---|---|---|---|---|",
    ]
    pairs = {}
    for r in runs:
        pairs.setdefault((r.mode, r.concurrency), {})[r.client] = r
    for (mode, c), pair in pairs.items():
        ours, theirs = pair.get("specgauge"), pair.get("vllm")
        if not ours or not theirs:
            continue
        p99_ours = pct([t - TTFT_MS / 1000 for t in ours.ttft_s], 99)
        p99_theirs = pct([t - TTFT_MS / 1000 for t in theirs.ttft_s], 99)
        ok = abs(p99_ours) <= abs(p99_theirs) and (c != 256 or mode != "closed" or p99_ours <= 0.002)
        rate_ours, rate_theirs = ours.chunks / ours.cpu_s, theirs.chunks / theirs.cpu_s
        lines.append(
            f"| {mode} {ours.load} | {ms(p99_ours)} / {ms(p99_theirs)} | {'yes' if ok else 'NO'} "
            f"| {rate_ours:,.0f} / {rate_theirs:,.0f} | {rate_ours / rate_theirs:.2f} |"
        )
    return "\n".join(lines)


def relative(ours: float, theirs: float) -> str:
    return f"{(ours / theirs - 1) * 100:+.1f}%" if theirs > 0 else "n/a"


def engine_table(runs: list[Run]) -> str:
    lines = [
        "| C | client | ok | TTFT p50 (ms) | TPOT p50 (ms) | tokens / chunk | all tokens in one burst "
        "| TTFT p50 vs vLLM | TPOT p50 vs vLLM |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by_c: dict[int, dict[str, Run]] = {}
    for r in runs:
        by_c.setdefault(r.concurrency, {})[r.client] = r
    for c, pair in by_c.items():
        theirs = pair.get("vllm")
        for name in ("specgauge", "vllm"):
            r = pair.get(name)
            if r is None:
                continue
            ttft, tpot = pct(r.ttft_s, 50), pct(r.tpot_s, 50)
            diff_ttft = diff_tpot = ""
            if theirs is not None and name == "specgauge":
                diff_ttft, diff_tpot = (
                    relative(ttft, pct(theirs.ttft_s, 50)),
                    relative(tpot, pct(theirs.tpot_s, 50)),
                )
            lines.append(
                f"| {c} | {name} | {len(r.ttft_s)}/{len(r.ttft_s) + r.failed} | {ms(ttft)} | {ms(tpot)} "
                f"| {r.measured_tokens / max(r.measured_chunks, 1):.2f} | {r.bursts}/{len(r.ttft_s)} "
                f"| {diff_ttft} | {diff_tpot} |"
            )
    return "\n".join(lines)


def both_parts(vllm: VllmClient, levels: list[int], args: argparse.Namespace, workdir: Path):
    print("Part 1: both clients against the emulator", flush=True)
    emu_runs = emulator_part(levels, args.quick, vllm, workdir)
    print("\n## Against the emulator\n")
    print(emulator_table(emu_runs))
    print()
    print(ratio_table(emu_runs), flush=True)
    engine_runs: list[Run] = []
    if not args.skip_engine:
        every_cpu = set(range(os.cpu_count() or 1))  # the engine needs every core; so do both clients
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, every_cpu)
            os.sched_setaffinity(vllm.proc.pid, every_cpu)
        print("Part 2: both clients against the real engine (plain)", flush=True)
        engine_runs = engine_part(vllm, workdir, args.quick)
    return emu_runs, engine_runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="C = 1, 64, 256 and fewer requests (about 3 min)"
    )
    parser.add_argument("--skip-engine", action="store_true", help="emulator part only (no engine start)")
    parser.add_argument("--json", type=Path, help="also write every per-run figure here")
    args = parser.parse_args()
    from specgauge.settings import get_settings

    engine_python = Path(get_settings().engine_python)
    raise_fd_limit()
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {0})  # the clients on CPU 0, the emulator on CPU 1
    levels = [1, 64, 256] if args.quick else [1, 64, 256, 1024]
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="client-accuracy-") as tmp:
        workdir = Path(tmp)
        print("Starting vLLM's client (imports vLLM once) ...", flush=True)
        vllm = VllmClient(engine_python, workdir / "vllm_client.log")
        try:
            emu_runs, engine_runs = both_parts(vllm, levels, args, workdir)
        finally:
            vllm.close()
    if engine_runs:
        print("\n## Against the real engine (plain, tiny target on the CPU)\n")
        print(engine_table(engine_runs))
    print(
        f"\nMachine: {os.cpu_count()} CPUs, 1-min load average {load_before:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end (anything else running shows up as client and emulator delay)."
    )
    print(
        f"\n({time.monotonic() - started:.0f} s; {sys.executable} benchmarks/client_accuracy.py"
        f"{' --quick' if args.quick else ''})"
    )
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in emu_runs + engine_runs], default=str))


if __name__ == "__main__":
    main()
