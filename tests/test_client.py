"""The streaming client against the emulator (known timing, every fault) and against the real engine."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvloop

from experiments.spec import Sampling
from tasks.load.client import StreamingClient, render_completion_prompt
from tasks.load.records import RequestRecord, records_frame
from workloads.schema import Prompt

pytestmark = pytest.mark.timing  # millisecond assertions: see tests/conftest.py

MODEL = "emulated"


def prompt(text: str = "def add(a, b):", max_tokens: int = 12, pid: str = "p0") -> Prompt:
    return Prompt(
        id=pid, workload="code", messages=[{"role": "user", "content": text}], max_tokens=max_tokens
    )


def send_all(
    url: str, prompts: list[Prompt], sampling: Sampling | None = None, model: str = MODEL, **client_args
) -> tuple[list[RequestRecord], StreamingClient]:
    """Send prompts one after another through one client; return records and the client."""

    async def main() -> tuple[list[RequestRecord], StreamingClient]:
        async with StreamingClient(url, model, **client_args) as client:
            t0 = time.perf_counter()
            records = []
            for i, p in enumerate(prompts):
                queued = time.perf_counter() - t0
                records.append(
                    await client.send(
                        p, sampling or Sampling(), index=i, phase="measured", t0=t0, queued_s=queued
                    )
                )
            return records, client

    return uvloop.run(main())


def one(url: str, p: Prompt | None = None, **client_args) -> RequestRecord:
    return send_all(url, [p or prompt()], **client_args)[0][0]


# -- timing against known injected values ------------------------------------------------------------------
def test_ttft_e2e_tpot_match_injected_timing(emulator):
    emulator.configure(ttft_ms=80, step_ms=10)
    records, _ = send_all(emulator.url, [prompt(max_tokens=12)] * 3)
    trace = emulator.trace()  # the emulator's own write times, same clock (CLOCK_MONOTONIC)
    assert len(trace) == 3
    for r, server in zip(records, trace, strict=True):
        assert r.ok, r.error
        assert r.completion_tokens == 12 and r.chunks == 12 and r.finish_reason == "length"
        # TTFT is the injected 80 ms plus transport: never less, and close to what the server did
        server_ttft = server["first"] - server["received"]
        assert 0.080 <= server_ttft < r.ttft_s < server_ttft + 0.02, (r.ttft_s, server_ttft)
        # E2E ends at the last token chunk; TPOT excludes TTFT: (E2E - TTFT) / 11, the server's step time.
        # Counting TTFT in it would add 80 / 11 = 7 ms.
        assert r.e2e_s == pytest.approx(r.chunk_offsets_s[-1]) and r.ttft_s == pytest.approx(
            r.chunk_offsets_s[0]
        )
        assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 11)
        assert r.tpot_s == pytest.approx((server["last"] - server["first"]) / 11, abs=0.0003)
        assert r.tpot_s == pytest.approx(0.010, abs=0.002)
        assert r.first_token_s == pytest.approx(r.sent_s + r.ttft_s)
        assert r.client_queue_s == pytest.approx(r.sent_s - r.queued_s) and 0 <= r.client_queue_s < 0.05


def test_speculative_chunks_exact_token_counts_and_tpot(emulator):
    emulator.configure(ttft_ms=30, step_ms=8, k=3, acceptance=[0.9, 0.7, 0.5])
    records, client = send_all(emulator.url, [prompt(max_tokens=40, pid=f"p{i}") for i in range(4)])
    trace = emulator.trace()
    assert client.token_ids_supported is True
    multi = 0
    for r, server in zip(records, trace, strict=True):
        assert r.ok and r.tokens_exact
        assert sum(r.chunk_tokens) == r.completion_tokens == 40 == server["tokens"]
        assert r.chunks == server["chunks"]
        assert all(1 <= n <= 4 for n in r.chunk_tokens) and r.chunk_tokens[0] == 1
        multi += sum(n > 1 for n in r.chunk_tokens)
        # one chunk per step: TPOT = (chunks - 1) steps over 39 tokens, well below the step time
        assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 39)
        assert r.tpot_s == pytest.approx((server["last"] - server["first"]) / 39, abs=0.0001)
        assert r.tpot_s < 0.008 * 0.75
        # vLLM's per-request acceptance block: one verify step per chunk after the prefill's, and the
        # histogram's accepted drafts are exactly the chunks' extra tokens
        assert r.spec_steps == r.chunks - 1 and r.spec_draft_tokens == 3 * r.spec_steps
        assert r.spec_acceptance_histogram is not None and len(r.spec_acceptance_histogram) == 4
        assert r.spec_accepted_tokens == sum(n - 1 for n in r.chunk_tokens[1:]) == 40 - r.chunks
    assert multi > 0
    frame = records_frame(records)
    assert frame["spec_accepted_tokens"].sum() == sum(r.spec_accepted_tokens or 0 for r in records) > 0


def test_acceptance_fields_stay_null_without_speculation_or_with_a_malformed_block(emulator):
    from tasks.load.client import _spec_decode

    emulator.configure(k=0, step_ms=2)
    plain = one(emulator.url)
    assert plain.ok and plain.spec_steps is None and plain.spec_acceptance_histogram is None
    record = RequestRecord(
        index=0, prompt_id="p", workload="w", phase="measured", endpoint="chat", queued_s=0
    )
    block = {"num_spec_steps": 3, "num_draft_tokens": 9, "num_accepted_draft_tokens": 4}
    _spec_decode(record, {**block, "acceptance_histogram": [1, 1, 0, 1]})  # 1 + 3 = 4 accepted: whole
    assert (record.spec_steps, record.spec_accepted_tokens) == (3, 4)
    broken = RequestRecord(
        index=0, prompt_id="p", workload="w", phase="measured", endpoint="chat", queued_s=0
    )
    _spec_decode(broken, {**block, "acceptance_histogram": [0, 1, 0, 1]})  # 2 steps, 4 accepted: not whole
    assert broken.spec_steps is None and broken.spec_accepted_tokens is None


def test_tokens_per_chunk_derived_when_server_ignores_token_ids(emulator):
    emulator.configure(k=3, acceptance=[0.8], token_ids="ignored", step_ms=2)
    records, client = send_all(emulator.url, [prompt(max_tokens=30)] * 2)
    for r in records:
        assert r.ok and not r.tokens_exact
        assert sum(r.chunk_tokens) == r.completion_tokens == 30
        assert max(r.chunk_tokens) - min(r.chunk_tokens) <= 1  # usage spread evenly over the chunks
        assert r.chunks < 30  # several tokens a chunk, so a chunk is not a token
    assert client.token_ids_supported is True  # accepted (not refused), just not answered


def test_server_refusing_token_ids_gets_one_retry_then_never_asked_again(emulator):
    emulator.configure(token_ids="rejected", step_ms=2)
    records, client = send_all(emulator.url, [prompt()] * 3)
    assert all(r.ok and not r.tokens_exact for r in records), [r.error for r in records]
    assert client.token_ids_supported is False
    stats = emulator.stats()
    assert stats["http_errors"] == 1 and stats["completions"] == 4  # 1 refused + 3 served


def test_role_only_chunk_does_not_end_ttft(emulator):
    emulator.configure(role_chunk="immediate", ttft_ms=60, step_ms=2)
    r = one(emulator.url)
    assert r.ok and r.ttft_s >= 0.0595


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "tool_calls"])
def test_reasoning_and_tool_call_deltas_are_tokens(emulator, field):
    emulator.configure(delta_field=field, ttft_ms=40, step_ms=2)
    r = one(emulator.url, keep_text=True)
    assert r.ok and r.chunks == 12 and 0.0395 <= r.ttft_s < 0.09
    assert r.text  # the text of those deltas is kept too


def test_completions_endpoint_and_kept_text_and_ids(emulator):
    emulator.configure(k=2, acceptance=[0.8], step_ms=2)
    p = Prompt(
        id="c",
        workload="w",
        max_tokens=16,
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "def f():"}],
    )
    assert render_completion_prompt(p) == "sys\n\ndef f():"
    r = one(emulator.url, p, endpoint="completions", keep_text=True, keep_token_ids=True)
    assert r.ok and r.endpoint == "completions" and r.tokens_exact
    assert len(r.token_ids) == r.completion_tokens == 16
    assert r.prompt_tokens == 3  # the emulator counts words of the rendered prompt
    chat = one(emulator.url, p, keep_text=True, keep_token_ids=True)
    assert chat.token_ids == r.token_ids and chat.text == r.text  # same text, same emulated tokens


def test_text_and_ids_not_kept_by_default(emulator):
    r = one(emulator.url)
    assert r.ok and r.text is None and r.token_ids is None


def test_sampling_fields_in_the_request_body():
    client = StreamingClient("http://127.0.0.1:9/v1", "m")
    p = prompt(max_tokens=33)
    body = client.payload(
        p, Sampling(temperature=0.7, top_p=0.9, top_k=20, seed=5, ignore_eos=True), token_ids=True
    )
    assert body["max_tokens"] == 33 and body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["top_k"] == 20 and body["seed"] == 5 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True and body["messages"] == p.chat_messages()
    plain = client.payload(p, Sampling(top_k=-1, seed=None, max_tokens=7), token_ids=False)
    assert plain["max_tokens"] == 7
    assert not {"top_k", "seed", "ignore_eos", "return_token_ids"} & plain.keys()
    assert client.origin.base_path == ""  # a trailing /v1 is not doubled


def test_api_key_sent_as_bearer_and_never_shown(emulator):
    emulator.configure(api_key="s3cret-key")
    assert one(emulator.url, api_key="s3cret-key").ok
    refused = one(emulator.url)
    assert not refused.ok and refused.error_class == "http_status" and refused.http_status == 401
    client = StreamingClient(emulator.url, MODEL, api_key="s3cret-key")
    assert "s3cret" not in repr(client)


# -- every fault gives a failed record with its reason -----------------------------------------------------
@pytest.mark.parametrize(
    ("fault", "error_class", "status"),
    [
        ("error", "http_status", 503),
        ("cut", "stream_cut", 200),
        ("truncate", "stream_cut", 200),
        ("error_event", "stream_cut", 200),
        ("no_usage", "no_usage", 200),
        ("bad_json", "protocol", 200),
        ("stall", "timeout", 200),
    ],
)
def test_fault_gives_classified_failure(emulator, fault, error_class, status):
    emulator.configure(step_ms=2, stall_s=30)
    p = prompt(f"def f(): pass [[fault:{fault}]]", max_tokens=10)
    records, _ = send_all(emulator.url, [p, prompt()], timeout_s=0.5)
    failed, after = records
    assert not failed.ok and failed.error_class == error_class, failed.error
    assert failed.http_status == status and failed.error
    assert failed.ended_s is not None and failed.sent_s is not None
    assert failed.tpot_s is None
    assert after.ok, after.error  # the client (and its connection pool) carries on


def test_connect_failure_is_classified():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        r = one(f"http://127.0.0.1:{port}", timeout_s=2)
    assert not r.ok and r.error_class == "connect" and "cannot connect" in r.error


def test_wrong_model_is_http_status(emulator):
    r = one(emulator.url, model="nope")
    assert not r.ok and r.error_class == "http_status" and r.http_status == 404 and "nope" in r.error


def test_cancelled_send_returns_a_record(emulator):
    emulator.configure(ttft_ms=2000)

    async def main() -> RequestRecord:
        async with StreamingClient(emulator.url, MODEL) as client:
            t0 = time.perf_counter()
            task = asyncio.create_task(
                client.send(prompt(), Sampling(), index=3, phase="warmup", t0=t0, queued_s=0.0)
            )
            await asyncio.sleep(0.2)
            task.cancel()
            return await task

    r = uvloop.run(main())
    assert not r.ok and r.error_class == "cancelled" and r.index == 3 and r.phase == "warmup"
    assert r.sent_s is not None and r.ttft_s is None
    time.sleep(0.1)
    assert emulator.stats()["aborted"] == 1  # the connection was closed, the server stopped generating


def test_records_fit_the_parquet_schema(emulator):
    records, _ = send_all(
        emulator.url, [prompt(), prompt("x [[fault:cut]]")], keep_text=True, keep_token_ids=True
    )
    frame = records_frame(records)
    assert frame.height == 2 and frame["ok"].to_list() == [True, False]


# -- the real engine ---------------------------------------------------------------------------------------
@pytest.mark.engine
def test_real_engine_speculative_chunks_carry_several_exact_tokens(engines):
    """On the real engine with speculation, a chunk carries the accepted drafts and the bonus token: the
    client counts every token exactly. The pool's draft-model engine (the campaign's n-gram cells check the
    same through each cell's tokens-per-chunk against acceptance cross-check)."""
    deployment = engines.get("draft-k3")
    text = "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor i in range(10):\n"
    prompts = [prompt(text, max_tokens=48, pid=f"loop{i}") for i in range(3)]
    records, client = send_all(
        deployment.base_url,
        prompts,
        Sampling(temperature=0.0, ignore_eos=True),
        model=deployment.served_model_name,
        keep_token_ids=True,
        keep_text=True,
        timeout_s=120,
    )
    assert client.token_ids_supported is True
    for r in records:
        assert r.ok, r.error
        assert r.tokens_exact and sum(r.chunk_tokens) == r.completion_tokens == 48
        assert len(r.token_ids) == 48 and r.text
        # a tiny model on the CPU can stream a whole answer within one read of a busy client, so these may
        # coincide (TPOT 0): the client stamps bytes when it reads them, never invents spacing
        assert r.ttft_s > 0 and r.tpot_s >= 0 and r.e2e_s >= r.ttft_s
    # speculation on a looping continuation: some chunks carry accepted drafts plus the bonus token
    assert max(n for r in records for n in r.chunk_tokens) >= 2
    assert sum(r.chunks for r in records) < sum(r.completion_tokens for r in records)
    # vLLM 0.32's per-request acceptance (--per-request-spec-decode-metrics summary, tasks/launch/command.py):
    # every verify step after the prefill's token emits its accepted drafts plus one
    for r in records:
        assert r.spec_steps and r.spec_draft_tokens == 3 * r.spec_steps, r
        assert r.spec_accepted_tokens + r.spec_steps == r.completion_tokens - 1, r
    assert sum(r.spec_accepted_tokens for r in records) > 0
