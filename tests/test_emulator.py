"""The emulator itself: vLLM-shaped responses, /metrics that agree with what it streamed, its faults."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_client import prompt, send_all

from emulator import EmulatorConfig, EmulatorThread
from emulator.config import config_from_args
from emulator.launch import config_args

pytestmark = pytest.mark.timing  # millisecond assertions: see tests/conftest.py

MODEL = "emulated"


def samples(text: str, model: str = MODEL) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels without model_name): value} for one model."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model_name") != model:
                continue
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def total(snapshot: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in snapshot.items() if n == name and want <= set(lab))


def test_metrics_agree_with_what_was_streamed(emulator):
    emulator.configure(k=3, acceptance=[0.8, 0.6, 0.3], step_ms=1, ttft_ms=5, engines=2)
    records, _ = send_all(emulator.url, [prompt(f"def f{i}():", max_tokens=30 + i) for i in range(12)])
    assert all(r.ok and r.tokens_exact for r in records)
    m = samples(emulator.metrics())
    tokens = sum(r.completion_tokens for r in records)
    steps = sum(r.chunks - 1 for r in records)  # every chunk after the prefill's token is one draft
    accepted = sum(n - 1 for r in records for n in r.chunk_tokens[1:])
    assert total(m, "vllm:generation_tokens_total") == tokens
    assert total(m, "vllm:prompt_tokens_total") == sum(r.prompt_tokens for r in records)
    assert total(m, "vllm:spec_decode_num_drafts_total") == steps
    assert total(m, "vllm:spec_decode_num_draft_tokens_total") == 3 * steps
    assert (
        total(m, "vllm:spec_decode_num_accepted_tokens_total")
        == accepted
        == tokens - sum(r.chunks for r in records)
    )
    per_pos = Counter(pos for r in records for n in r.chunk_tokens[1:] for pos in range(n - 1))
    for pos in range(3):
        assert (
            total(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == per_pos[pos]
        )
    # acceptance falls with position, as configured
    assert per_pos[0] > per_pos[1] > per_pos[2] > 0
    # split over two engine labels, both used
    assert {lab for (n, lab) in m if n == "vllm:generation_tokens_total"} == {
        (("engine", "0"),),
        (("engine", "1"),),
    }
    assert total(m, "vllm:request_success_total") == 12


def test_decoy_model_and_gauges(emulator):
    emulator.configure(decoy_model="other-model", max_running=2, ttft_ms=1500, kv_tokens=1000)
    assert samples(emulator.metrics(), "other-model")  # another model's samples, to be filtered out
    workers = [
        threading.Thread(target=send_all, args=(emulator.url, [prompt(f"q{i}")]), kwargs={"timeout_s": 10})
        for i in range(4)
    ]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 5
    while emulator.stats()["active"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    m = samples(emulator.metrics())
    assert total(m, "vllm:num_requests_running") == 2 and total(m, "vllm:num_requests_waiting") == 2
    assert 0 < total(m, "vllm:kv_cache_usage_perc") <= 1
    assert total(m, "vllm:num_preemptions_total") == 0
    for w in workers:
        w.join(30)
    assert emulator.stats()["finished"] == 4


def test_restart_resets_counters_and_garbage_metrics(emulator):
    send_all(emulator.url, [prompt()])
    before = total(samples(emulator.metrics()), "vllm:generation_tokens_total")
    emulator.restart()
    after = total(samples(emulator.metrics()), "vllm:generation_tokens_total")
    assert before == 12 and after == 0  # a counter went down: what a scraper must flag
    emulator.configure(metrics_fault="garbage")
    text = emulator.metrics()
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text))


def test_vllm_shaped_endpoints(emulator):
    url = emulator.url
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == MODEL
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "return_token_ids": True,
    }
    whole = httpx.post(f"{url}/v1/chat/completions", json=body).json()
    assert whole["usage"]["completion_tokens"] == 5 and len(whole["choices"][0]["token_ids"]) == 5
    assert whole["choices"][0]["finish_reason"] == "length"
    comp = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3}).json()
    assert comp["object"] == "text_completion" and comp["usage"]["completion_tokens"] == 3
    wrong = httpx.post(f"{url}/v1/chat/completions", json={**body, "model": "x"})
    assert wrong.status_code == 404 and "does not exist" in wrong.json()["error"]["message"]
    assert httpx.post(f"{url}/v1/chat/completions", content=b"{nope").status_code == 400
    assert httpx.get(f"{url}/nowhere").status_code == 404
    header = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-emulator-fault": "error"})
    assert header.status_code == 503
    lines = []
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=stream_body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and '"usage"' in lines[-2] and '"role":"assistant"' in lines[0]


def test_fail_fraction_and_first_burst(emulator):
    emulator.configure(fail_first=3, step_ms=1)
    records, _ = send_all(emulator.url, [prompt()] * 5)
    assert [r.ok for r in records] == [False, False, False, True, True]
    emulator.configure(fail_fraction=0.5, seed=4, step_ms=1)
    records, _ = send_all(emulator.url, [prompt(max_tokens=2)] * 40)
    failed = sum(not r.ok for r in records)
    assert all(r.error_class == "http_status" for r in records if not r.ok)
    assert 10 <= failed <= 30


def test_server_side_timing_follows_the_injection(emulator):
    emulator.configure(ttft_ms=40, step_ms=7)
    send_all(emulator.url, [prompt(max_tokens=10)] * 3)
    for t in emulator.trace():
        # deadlines are absolute, so a busy machine makes a write late but never early
        assert 0.040 <= t["first"] - t["admitted"] <= 0.040 + 0.015
        assert 0.040 + 9 * 0.007 <= t["last"] - t["admitted"] <= 0.040 + 9 * 0.007 + 0.015
        assert t["tokens"] == 10 and t["chunks"] == 10


@pytest.mark.parametrize("spin_ms", [0.0, 2.0])
def test_server_side_timing_follows_the_injection_with_or_without_polling(emulator, spin_ms):
    """Polling (spin_ms) wakes the emulator early, never writes early, and streams the same responses."""
    emulator.configure(ttft_ms=30, step_ms=5, spin_ms=spin_ms)
    records, _ = send_all(emulator.url, [prompt(max_tokens=8)] * 6)
    assert all(r.ok and r.completion_tokens == 8 for r in records)
    for t in emulator.trace():
        assert 0.030 <= t["first"] - t["admitted"] <= 0.030 + 0.015
        assert 0.030 + 7 * 0.005 <= t["last"] - t["admitted"] <= 0.030 + 7 * 0.005 + 0.015


def test_config_round_trip_and_validation():
    config = EmulatorConfig(port=0, k=2, acceptance=(0.9, 0.4), trace=True, fault="cut", token_ids="ignored")
    assert config_from_args(config_args(config)) == config
    with pytest.raises(ValueError, match="fault"):
        EmulatorConfig(fault="explode")
    with pytest.raises(ValueError, match="spin_ms"):
        EmulatorConfig(spin_ms=-1)
    with pytest.raises(ValueError, match="token_ids"):
        EmulatorConfig(token_ids="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown field"):
        config.updated({"ttft": 3})


def test_in_process_thread_and_cli_help():
    with EmulatorThread(EmulatorConfig(port=0, step_ms=1)) as emu:
        records, _ = send_all(emu.url, [prompt()])
        assert records[0].ok
    out = subprocess.run(
        [sys.executable, "-m", "emulator", "--help"], capture_output=True, text=True, check=True
    )
    assert "--ttft-ms" in out.stdout and "x-emulator-fault" in out.stdout
    from typer.testing import CliRunner

    from cli.app import app

    result = CliRunner().invoke(app, ["emulator", "--help"])
    assert result.exit_code == 0 and "--step-ms" in result.output
