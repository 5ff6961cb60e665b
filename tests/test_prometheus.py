"""Prometheus parsing and deltas (tasks/metrics/prometheus.py), the gauge sampler and `specgauge
metrics-delta`: hand-built snapshots with known answers, a real before/after pair captured from the
embedded engine (tests/data/metrics/), and a capture on the real engine itself."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from metrics_support import DATA, SPEC_DELTA_KEYS
from prometheus_client.parser import text_string_to_metric_families

from specgauge.errors import CounterReset, MetricsError
from tasks.metrics.gauges import GAUGE_SCHEMA, GaugeSampler
from tasks.metrics.prometheus import (
    SpecDelta,
    counter_delta,
    gauges,
    has_spec_decode,
    parse,
    scrape,
    spec_decode_delta,
)

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / ".venv" / "bin" / "specgauge"
MODEL = "tiny-draft-k3"

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
    "generation": "vllm:generation_tokens",
    "preemptions": "vllm:num_preemptions",
}


def exposition(
    engines: dict[tuple[str, str], dict[str, float]],
    *,
    per_position: dict[tuple[str, str], list[float]] | None = None,
    created: float = 1_700_000_000.0,
    typed: bool = True,
    gauge_values: dict[tuple[str, str], dict[str, float]] | None = None,
) -> str:
    """A vLLM-like /metrics text: counters per (model_name, engine), `_created` samples like the real one.

    typed=False leaves out the # TYPE lines, so the parser keeps `_total` in the family names (older
    exporters and hand-saved texts look like this).
    """
    lines: list[str] = []
    for key, name in COUNTERS.items():
        if typed:
            lines += [f"# HELP {name}_total {key}.", f"# TYPE {name}_total counter"]
        for (model, engine), values in engines.items():
            if key in values:
                lines.append(f'{name}_total{{engine="{engine}",model_name="{model}"}} {values[key]}')
        if typed:
            lines.append(f"# TYPE {name}_created gauge")
        for (model, engine), values in engines.items():
            if key in values:
                lines.append(f'{name}_created{{engine="{engine}",model_name="{model}"}} {created}')
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    if per_position:
        if typed:
            lines.append(f"# TYPE {name}_total counter")
        for (model, engine), counts in per_position.items():
            for pos, value in enumerate(counts):
                labels = f'engine="{engine}",model_name="{model}",position="{pos}"'
                lines.append(f"{name}_total{{{labels}}} {value}")
                lines.append(f"{name}_created{{{labels}}} {created + pos}")
    for (model, engine), values in (gauge_values or {}).items():
        for gauge, value in values.items():
            lines.append(f'{gauge}{{engine="{engine}",model_name="{model}"}} {value}')
    return "\n".join(lines) + "\n"


# Two data-parallel engines of MODEL, plus another model served by the same process.
BEFORE = exposition(
    {
        (MODEL, "0"): {"drafts": 10, "draft_tokens": 30, "accepted": 12, "generation": 50, "preemptions": 1},
        (MODEL, "1"): {"drafts": 20, "draft_tokens": 60, "accepted": 30, "generation": 90, "preemptions": 0},
        ("other", "0"): {"drafts": 5, "draft_tokens": 15, "accepted": 1, "generation": 10, "preemptions": 0},
    },
    per_position={(MODEL, "0"): [6, 4, 2], (MODEL, "1"): [15, 10, 5], ("other", "0"): [1, 0, 0]},
)
AFTER = exposition(
    {
        (MODEL, "0"): {
            "drafts": 50,
            "draft_tokens": 150,
            "accepted": 72,
            "generation": 200,
            "preemptions": 3,
        },
        (MODEL, "1"): {
            "drafts": 80,
            "draft_tokens": 240,
            "accepted": 110,
            "generation": 400,
            "preemptions": 0,
        },
        ("other", "0"): {"drafts": 999, "draft_tokens": 2997, "accepted": 2000, "generation": 5000},
    },
    per_position={(MODEL, "0"): [36, 24, 12], (MODEL, "1"): [45, 40, 25], ("other", "0"): [900, 800, 300]},
)
# MODEL deltas: drafts 40 + 60 = 100; draft tokens 120 + 180 = 300; accepted 60 + 80 = 140;
# per position: (30 + 30, 20 + 30, 10 + 20) = (60, 50, 30); generation 150 + 310 = 460; preemptions 2.


def test_delta_sums_engines_and_ignores_other_models() -> None:
    delta = spec_decode_delta(BEFORE, AFTER, MODEL)
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (100, 300, 140)
    assert delta.acceptance_rate == pytest.approx(140 / 300)
    assert delta.mean_acceptance_length == pytest.approx(1 + 140 / 100)
    assert delta.acceptance_rate_per_position == pytest.approx({"0": 0.6, "1": 0.5, "2": 0.3})
    assert list(delta.acceptance_rate_per_position) == ["0", "1", "2"]
    assert delta.accepted_per_position == {"0": 60, "1": 50, "2": 30}


def test_other_model_alone() -> None:
    delta = spec_decode_delta(BEFORE, AFTER, "other")
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (994, 2982, 1999)
    assert delta.acceptance_rate_per_position == pytest.approx(
        {"0": 899 / 994, "1": 800 / 994, "2": 300 / 994}
    )


def test_counter_delta_either_spelling() -> None:
    for name in ("vllm:generation_tokens_total", "vllm:generation_tokens"):
        assert counter_delta(BEFORE, AFTER, name, MODEL) == 460
    assert counter_delta(BEFORE, AFTER, "vllm:num_preemptions_total", MODEL) == 2


def test_untyped_text_keeps_total_in_family_names_and_still_works() -> None:
    before = BEFORE.replace("# TYPE", "# IGNORED")  # not a TYPE line: families are untyped
    assert "vllm:spec_decode_num_drafts_total" in {f.name for f in text_string_to_metric_families(before)}
    assert "vllm:spec_decode_num_drafts" in {f.name for f in text_string_to_metric_families(BEFORE)}
    untyped_before = exposition(
        {(MODEL, "0"): {"drafts": 10, "draft_tokens": 30, "accepted": 12, "generation": 50}}, typed=False
    )
    untyped_after = exposition(
        {(MODEL, "0"): {"drafts": 14, "draft_tokens": 42, "accepted": 20, "generation": 66}}, typed=False
    )
    delta = spec_decode_delta(untyped_before, untyped_after, MODEL)
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (4, 12, 8)
    assert delta.mean_acceptance_length == pytest.approx(3.0)
    assert delta.acceptance_rate_per_position == {}  # this text has no per-position counter
    assert counter_delta(untyped_before, untyped_after, "vllm:generation_tokens_total", MODEL) == 16


def test_missing_per_position_counter_gives_empty_map() -> None:
    before = exposition({(MODEL, "0"): {"drafts": 1, "draft_tokens": 3, "accepted": 1}})
    after = exposition({(MODEL, "0"): {"drafts": 5, "draft_tokens": 15, "accepted": 9}})
    delta = spec_decode_delta(before, after, MODEL)
    assert delta.acceptance_rate_per_position == {}
    assert delta.acceptance_rate == pytest.approx(8 / 12)
    assert delta.mean_acceptance_length == pytest.approx(3.0)


def test_no_drafts_gives_none_ratios() -> None:
    same = exposition(
        {(MODEL, "0"): {"drafts": 7, "draft_tokens": 21, "accepted": 3}},
        per_position={(MODEL, "0"): [2, 1, 0]},
    )
    delta = spec_decode_delta(same, same, MODEL)
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (0, 0, 0)
    assert delta.acceptance_rate is None
    assert delta.mean_acceptance_length is None
    assert delta.acceptance_rate_per_position == {"0": None, "1": None, "2": None}


def test_created_samples_are_not_values() -> None:
    # Position 2 appears only in AFTER, with its own _created timestamp: were _created a value, the
    # per-position delta would be about 1.7e9.
    before = exposition(
        {(MODEL, "0"): {"drafts": 2, "draft_tokens": 6, "accepted": 1}}, per_position={(MODEL, "0"): [1, 0]}
    )
    after = exposition(
        {(MODEL, "0"): {"drafts": 6, "draft_tokens": 18, "accepted": 9}},
        per_position={(MODEL, "0"): [4, 3, 2]},
    )
    delta = spec_decode_delta(before, after, MODEL)
    assert delta.accepted_per_position == {"0": 3, "1": 3, "2": 2}
    snapshot = parse(after)
    assert not any(name.endswith("_created") for name in snapshot.values)
    assert snapshot.summed("vllm:spec_decode_num_drafts_total", MODEL) == {None: 6.0}


def test_counter_reset_raises_even_when_the_sum_grew() -> None:
    # Engine 0 restarted (12 -> 3) while engine 1 grew more: the sum rose, the window is still invalid.
    before = exposition(
        {
            (MODEL, "0"): {"drafts": 12, "draft_tokens": 36, "accepted": 5},
            (MODEL, "1"): {"drafts": 0, "draft_tokens": 0, "accepted": 0},
        }
    )
    after = exposition(
        {
            (MODEL, "0"): {"drafts": 3, "draft_tokens": 9, "accepted": 1},
            (MODEL, "1"): {"drafts": 40, "draft_tokens": 120, "accepted": 50},
        }
    )
    with pytest.raises(CounterReset, match=r'spec_decode_num_drafts_total\{engine="0".*went down from 12'):
        spec_decode_delta(before, after, MODEL)
    with pytest.raises(CounterReset):
        spec_decode_delta(AFTER, BEFORE, MODEL)
    with pytest.raises(CounterReset, match="generation_tokens"):
        counter_delta(AFTER, BEFORE, "vllm:generation_tokens_total", MODEL)


def test_recreated_or_vanished_series_is_a_reset() -> None:
    values = {"drafts": 2, "draft_tokens": 6, "accepted": 1}
    later = {"drafts": 9, "draft_tokens": 27, "accepted": 4}
    with pytest.raises(CounterReset, match="re-created"):
        spec_decode_delta(
            exposition({(MODEL, "0"): values}),
            exposition({(MODEL, "0"): later}, created=1_800_000_000.0),
            MODEL,
        )
    two = exposition({(MODEL, "0"): values, (MODEL, "1"): values})
    with pytest.raises(CounterReset, match=r'engine="1".*not in'):
        spec_decode_delta(two, exposition({(MODEL, "0"): later}), MODEL)


def test_unknown_model_lists_present_names() -> None:
    with pytest.raises(MetricsError, match=r"'nope'; model names present: other, tiny-draft-k3"):
        spec_decode_delta(BEFORE, AFTER, "nope")


def test_plain_server_has_no_spec_counters() -> None:
    plain = exposition({("tiny-plain", "0"): {"generation": 5, "preemptions": 0}})
    assert not has_spec_decode(plain, "tiny-plain")
    assert has_spec_decode(BEFORE, MODEL)
    with pytest.raises(MetricsError, match="no vllm:spec_decode_num_drafts_total"):
        spec_decode_delta(plain, plain, "tiny-plain")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('vllm:a_total{model_name="m"} 1\nvllm:b{model_name="m" 2\n', "at line 2"),
        ('vllm:a_total{model_name="m"} 1\nvllm:c{model_name="m"} many\n', "at line 2: 'vllm:c"),
        ("<html><body>Not Found</body></html>\n", "at line 1"),
        ("", "contains no vllm: metrics"),
        ("process_cpu_seconds_total 3.5\n", "contains no vllm: metrics"),
    ],
)
def test_unparsable_text_names_the_problem(text: str, expected: str) -> None:
    with pytest.raises(MetricsError, match=expected) as info:
        parse(text, source="snap.txt")
    assert str(info.value).startswith("snap.txt: ")


def test_gauges_mean_kv_and_summed_counts() -> None:
    text = exposition(
        {
            (MODEL, "0"): {"preemptions": 2},
            (MODEL, "1"): {"preemptions": 5},
            ("other", "0"): {"preemptions": 99},
        },
        gauge_values={
            (MODEL, "0"): {
                "vllm:kv_cache_usage_perc": 0.2,
                "vllm:num_requests_running": 3,
                "vllm:num_requests_waiting": 1,
            },
            (MODEL, "1"): {
                "vllm:kv_cache_usage_perc": 0.6,
                "vllm:num_requests_running": 4,
                "vllm:num_requests_waiting": 0,
            },
            ("other", "0"): {"vllm:kv_cache_usage_perc": 1.0, "vllm:num_requests_running": 50},
        },
    )
    assert gauges(text, MODEL) == {
        "kv_cache_usage": pytest.approx(0.4),
        "running": 7,
        "waiting": 1,
        "preemptions_total": 7,
    }
    old = exposition(
        {(MODEL, "0"): {"generation": 1}}, gauge_values={(MODEL, "0"): {"vllm:gpu_cache_usage_perc": 0.25}}
    )
    assert gauges(old, MODEL) == {
        "kv_cache_usage": 0.25,
        "running": None,
        "waiting": None,
        "preemptions_total": None,
    }


# --- a real before/after pair, captured from the embedded engine (see tests/data/metrics/README.md) ----


def real_pair() -> tuple[str, str, dict]:
    facts = json.loads((DATA / "draft-k3.requests.json").read_text())
    return (DATA / "draft-k3.before.txt").read_text(), (DATA / "draft-k3.after.txt").read_text(), facts


def assert_engine_pair_consistent(
    before: str, after: str, model: str, k: int, usages: list[dict]
) -> SpecDelta:
    """A before/after pair scraped around real requests (their `usage`: prompt and completion tokens) on a
    k-token drafter: the speculation counters agree with each other and the token counters with the usages."""
    delta = spec_decode_delta(before, after, model)
    assert delta.drafts > 0
    assert delta.draft_tokens == k * delta.drafts
    assert 0 <= delta.accepted_tokens <= delta.draft_tokens
    assert sum(delta.accepted_per_position.values()) == delta.accepted_tokens
    assert list(delta.acceptance_rate_per_position) == [str(i) for i in range(k)]
    generated = counter_delta(before, after, "vllm:generation_tokens_total", model)
    assert generated == sum(u["completion_tokens"] for u in usages)
    prompt = counter_delta(before, after, "vllm:prompt_tokens_total", model)
    assert prompt == sum(u["prompt_tokens"] for u in usages)
    return delta


def test_real_snapshots_are_consistent() -> None:
    before, after, facts = real_pair()
    model, k = facts["model"], facts["k"]
    delta = assert_engine_pair_consistent(before, after, model, k, facts["requests"])
    assert 1.0 <= delta.mean_acceptance_length <= 1 + k
    assert gauges(after, model) == {"kv_cache_usage": 0.0, "running": 0, "waiting": 0, "preemptions_total": 0}


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "metrics-delta", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_cli_prints_exactly_the_six_keys() -> None:
    before, after, facts = real_pair()
    done = run_cli(DATA / "draft-k3.before.txt", DATA / "draft-k3.after.txt", "--model", facts["model"])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert list(out) == list(SPEC_DELTA_KEYS)
    assert out == spec_decode_delta(before, after, facts["model"]).to_json()
    assert len(done.stdout.strip().splitlines()) == 1


def test_cli_nulls_and_empty_positions(tmp_path: Path) -> None:
    same = tmp_path / "same.txt"
    same.write_text(exposition({(MODEL, "0"): {"drafts": 7, "draft_tokens": 21, "accepted": 3}}))
    done = run_cli(same, same, "--model", MODEL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "drafts": 0,
        "draft_tokens": 0,
        "accepted_tokens": 0,
        "acceptance_rate": None,
        "mean_acceptance_length": None,
        "acceptance_rate_per_position": {},
    }


def test_cli_errors(tmp_path: Path) -> None:
    good = DATA / "draft-k3.before.txt"
    missing = tmp_path / "absent.txt"
    done = run_cli(missing, good, "--model", MODEL)
    assert done.returncode == 2 and f"{missing}: cannot read" in done.stderr and not done.stdout

    garbage = tmp_path / "garbage.txt"
    garbage.write_text('vllm:x{model_name="m"} 1\nvllm:y{model_name="m"} one\n')
    done = run_cli(good, garbage, "--model", MODEL)
    assert done.returncode == 2 and f"{garbage}: not a Prometheus text exposition at line 2" in done.stderr

    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    done = run_cli(binary, good, "--model", MODEL)
    assert done.returncode == 2 and "not UTF-8" in done.stderr

    done = run_cli(good, good, "--model", "llama-70b")
    assert done.returncode == 2 and "'llama-70b'; model names present: tiny-draft-k3" in done.stderr

    reset_before, reset_after = tmp_path / "b.txt", tmp_path / "a.txt"
    reset_before.write_text(AFTER)
    reset_after.write_text(BEFORE)
    done = run_cli(reset_before, reset_after, "--model", MODEL)
    assert (
        done.returncode == 2 and "went down" in done.stderr and "restarted" in done.stderr and not done.stdout
    )


# --- scraping and the gauge sampler, against a real local HTTP server --------------------------------


class MetricsServer:
    """A tiny HTTP server whose /metrics answers from a list of (status, text), cycling through it."""

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        self.answers, self.hits = answers, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, text = outer.answers[outer.hits % len(outer.answers)]
                outer.hits += 1
                body = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> MetricsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metrics_server() -> Iterator[MetricsServer]:
    busy = exposition(
        {(MODEL, "0"): {"preemptions": 4}},
        gauge_values={
            (MODEL, "0"): {
                "vllm:kv_cache_usage_perc": 0.5,
                "vllm:num_requests_running": 2,
                "vllm:num_requests_waiting": 1,
            }
        },
    )
    with MetricsServer(
        [
            (200, busy),
            (500, "engine overloaded"),
            (200, f'vllm:num_requests_running{{model_name="{MODEL}" 2\n'),
        ]
    ) as server:
        yield server


def test_scrape_returns_text_and_names_url_on_failure(metrics_server: MetricsServer) -> None:
    assert "vllm:num_requests_running" in scrape(metrics_server.url)
    with pytest.raises(MetricsError, match=rf"scrape {metrics_server.url}: HTTP 500"):
        scrape(metrics_server.url)
    closed = "http://127.0.0.1:9/metrics"  # discard port: nothing listens
    with pytest.raises(MetricsError, match=rf"scrape {closed}: ConnectError"):
        scrape(closed, timeout_s=2)


def test_sampler_skips_and_counts_failed_scrapes(metrics_server: MetricsServer) -> None:
    async def run() -> tuple[GaugeSampler, float]:
        t0 = time.perf_counter()
        # A generous scrape timeout: a scrape that timed out would shift the server's answer cycle.
        async with GaugeSampler(metrics_server.url, MODEL, t0=t0, interval_s=0.05, timeout_s=30) as sampler:
            while sampler.frame().height < 3 and time.perf_counter() - t0 < 60:
                await asyncio.sleep(0.05)
        return sampler, time.perf_counter() - t0

    sampler, elapsed = asyncio.run(run())
    frame = sampler.frame()
    assert list(frame.schema) == list(GAUGE_SCHEMA)
    # Answers cycle ok, HTTP 500, unparsable: after N scrapes, ceil(N/3) rows and the rest counted.
    assert frame.height >= 3
    assert sampler.failures - 2 * frame.height in (-2, -1, 0)
    assert any("HTTP 500" in e for e in sampler.errors)
    assert any("not a Prometheus text" in e for e in sampler.errors)
    assert frame["kv_cache_usage"].to_list() == [0.5] * frame.height
    assert set(frame["running"].to_list()) == {2} and set(frame["preemptions_total"].to_list()) == {4}
    times = frame["t_s"].to_list()
    assert times == sorted(times) and 0 <= times[0] < times[-1] <= elapsed


# --- the real engine ------------------------------------------------------------------------------------


@pytest.mark.engine
def test_real_engine_deltas_and_gauges(engines) -> None:
    """Two short chat requests on the draft-model (k=3) engine, scraped before and after, with the gauge
    sampler running meanwhile. SPECGAUGE_WRITE_METRICS_FIXTURES=1 saves the pair as tests/data/metrics/."""
    deployment = engines.get("draft-k3")
    model, k = deployment.served_model_name, deployment.variant.k
    prompts = ["Write a Python function that adds two numbers.", "def fibonacci(n):"]
    max_tokens = 512

    async def run() -> tuple[str, str, list[dict], GaugeSampler]:
        async with httpx.AsyncClient(timeout=120, headers=deployment.headers()) as client:
            before = (await client.get(deployment.metrics_url)).text
            t0 = time.perf_counter()
            async with GaugeSampler(deployment.metrics_url, model, t0=t0, interval_s=0.05) as sampler:
                # The first scrape lands before the requests start, so the window's samples do not hinge on
                # how long the first one took on a busy host (CI of 2026-12-05 got one row, taken after both
                # 48-token answers had finished); ignore_eos makes each answer a known length.
                while not sampler.frame().height and time.perf_counter() - t0 < 30:
                    await asyncio.sleep(0.02)
                answers = await asyncio.gather(
                    *[
                        client.post(
                            f"{deployment.base_url}/v1/chat/completions",
                            json={
                                "model": model,
                                "messages": [{"role": "user", "content": p}],
                                "max_tokens": max_tokens,
                                "temperature": 0,
                                "ignore_eos": True,
                            },
                        )
                        for p in prompts
                    ]
                )
            after = (await client.get(deployment.metrics_url)).text
        usages = [a.raise_for_status().json()["usage"] for a in answers]
        return before, after, usages, sampler

    before, after, usages, sampler = asyncio.run(run())
    assert_engine_pair_consistent(before, after, model, k, usages)
    with pytest.raises(CounterReset):
        spec_decode_delta(after, before, model)

    frame = sampler.frame()
    assert sampler.failures == 0, sampler.errors
    assert frame.height >= 2
    assert frame["kv_cache_usage"].is_between(0, 1).all()
    assert frame["running"].max() >= 1  # the requests took most of a second; sampled every 0.05 s
    assert frame["preemptions_total"].null_count() == 0

    if os.environ.get("SPECGAUGE_WRITE_METRICS_FIXTURES") == "1":
        DATA.mkdir(parents=True, exist_ok=True)
        (DATA / "draft-k3.before.txt").write_text(before)
        (DATA / "draft-k3.after.txt").write_text(after)
        facts = {
            "model": model,
            "k": k,
            "engine_version": deployment.engine_version,
            "requests": [
                {
                    "prompt": p,
                    "max_tokens": max_tokens,
                    "prompt_tokens": u["prompt_tokens"],
                    "completion_tokens": u["completion_tokens"],
                }
                for p, u in zip(prompts, usages, strict=True)
            ],
        }
        (DATA / "draft-k3.requests.json").write_text(json.dumps(facts, indent=2) + "\n")
