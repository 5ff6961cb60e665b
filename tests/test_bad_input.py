"""Bad input: each gets a clear error naming the input, and nothing partial is written.

Through the `specgauge campaign run` command where the input enters there (corpora, specs, labels, a draft
with another vocabulary): exit code 2, one message naming file, line and field, and nothing under the raw
directory or in the ledger. Prompts longer than the model's context against the real engine. Names with
shell metacharacters: refused by the spec, and quoted by the cluster launchers (their rendered commands
are run through bash here). What each test saw is recorded for docs/reliability.md (`observe`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
import yaml
from reliability_support import REPO, corpus, ledger_ids, write_spec

from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, Sampling, SmlLaunchSpec, TargetSpec, Variant, parse_spec
from specgauge.errors import InputError, MetricsError, ReadinessTimeout, SpecError
from tasks.cell import prompt_fit_problems, run_cell
from tasks.health import wait_ready
from tasks.launch.command import vllm_args
from tasks.launch.config import ClusterConfig, EndpointConfig
from tasks.launch.endpoint import EndpointLauncher
from tasks.launch.local import LocalLauncher
from tasks.launch.slurm_script import render_script
from tasks.launch.sml import SmlLauncher, framework_args
from tasks.load.client import StreamingClient
from tasks.metrics.prometheus import parse
from workloads.schema import Prompt, load_corpus

pytest_plugins = ["reliability_support"]

CLI = [sys.executable, "-m", "cli"]


def demo_spec(**changes: Any) -> dict[str, Any]:
    spec = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    spec.pop("profile", None)  # names a variant; tests here change the variants
    spec.update(changes)
    return spec


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECGAUGE_HOME": str(home)}
    return subprocess.run([*CLI, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def nothing_written(home: Path) -> list[str]:
    """What a refused campaign left: raw artifacts, ledger entries (both should be absent)."""
    raw = home / "raw"
    left = [str(p.relative_to(home)) for p in raw.rglob("*")] if raw.exists() else []
    ledger = home / "ledger"
    return left + ([str(p.relative_to(home)) for p in ledger.glob("*")] if ledger.exists() else [])


# -- corpora ----------------------------------------------------------------------------------------------
CORPUS_LINES: dict[str, tuple[bytes, str]] = {
    "malformed JSONL": (b'{"id": "a", "workload": "chat", "messages": [', ":1: (json): invalid JSON"),
    "wrong types": (
        b'{"id": 7, "workload": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "8"}',
        ":2: id: must be a string, got int",
    ),
    "duplicate ids": (
        b'{"id": "p", "workload": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}\n'
        b'{"id": "p", "workload": "chat", "messages": [{"role": "user", "content": "yo"}], "max_tokens": 8}',
        ":4: id: duplicate id 'p' (first on line 3)",
    ),
    "empty messages": (
        b'{"id": "e", "workload": "chat", "messages": [{"role": "user", "content": "  "}], "max_tokens": 8}',
        ":5: messages[0].content: must not be empty",
    ),
    "non-UTF-8 bytes": (
        b'{"id": "u", "workload": "chat", "messages": [{"role": "user", "content": "caf\xe9"}], "max_tokens": 8}',
        ":6: (encoding): not UTF-8",
    ),
}


def test_a_bad_corpus_is_refused_before_anything_is_written(tmp_path: Path, observe) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(line for line, _ in CORPUS_LINES.values()) + b"\n")
    spec = write_spec(tmp_path / "s.yaml", demo_spec(name="rel-bad-corpus", workloads=[{"file": str(bad)}]))
    home = tmp_path / "home"
    done = run_cli(home, "campaign", "run", str(spec))
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    for row, (_, expected) in CORPUS_LINES.items():
        found = [line for line in lines if f"{bad}{expected}" in line]
        assert found, (row, expected, done.stderr)
        assert nothing_written(home) == []
        observe(
            row,
            done=f"a corpus line with {row} in a spec's workload, `specgauge campaign run`",
            expected="refused before anything starts: exit 2, FILE:LINE: field: message; nothing written",
            observed=f"exit {done.returncode}: `{found[0].removeprefix('error: ').strip().replace(str(tmp_path) + '/', '')[:150]}`; raw dir and "
            "ledger empty; no engine started",
            records_lost=0,
            leaked=0,
        )


# -- specs ------------------------------------------------------------------------------------------------
SPEC_CASES: list[tuple[str, Any, str]] = [
    ("unknown top-level field", lambda d: d.update(repeets=2), "repeets: unknown field (check its spelling)"),
    (
        "unknown nested field",
        lambda d: d["load"].update(concurency=[1]),
        "load.concurency: unknown field (check its spelling)",
    ),
    ("wrong type", lambda d: d.update(repeats="two"), "repeats: Input should be a valid integer"),
    ("out of range", lambda d: d["load"].update(requests=0), "load.requests: Input should be greater than 0"),
    ("missing field", lambda d: d.pop("target"), "target: Field required"),
    ("no plain baseline", lambda d: d.update(variants=d["variants"][1:]), "needs a plain variant"),
]


def test_invalid_or_unknown_spec_fields_are_refused_naming_file_and_field(tmp_path: Path, observe) -> None:
    seen = []
    for what, mutate, expected in SPEC_CASES:
        data = demo_spec(name="rel-bad-spec")
        mutate(data)
        spec = write_spec(tmp_path / f"{what.replace(' ', '-')}.yaml", data)
        home = tmp_path / f"home-{len(seen)}"
        done = run_cli(home, "campaign", "run", str(spec))
        assert done.returncode == 2 and f"error: {spec}:" in done.stderr and expected in done.stderr, (
            what,
            done.stderr,
        )
        assert "Traceback" not in done.stderr and nothing_written(home) == []
        seen.append(done.stderr.strip().removeprefix("error: ").replace(str(tmp_path) + "/", ""))
    # Files that are not specs at all.
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: caf\xe9\n")
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nvariants: [\n")
    for path, expected in (
        (binary, "not UTF-8"),
        (listing, "expected a mapping at the top level, got list"),
        (broken, ":3: invalid YAML"),
        (tmp_path / "missing.yaml", "cannot read"),
    ):
        done = run_cli(tmp_path / "home-files", "campaign", "run", str(path))
        assert done.returncode == 2 and str(path) in done.stderr and expected in done.stderr, done.stderr
        seen.append(done.stderr.strip().removeprefix("error: ").replace(str(tmp_path) + "/", ""))
    assert nothing_written(tmp_path / "home-files") == []
    observe(
        "invalid or unknown fields in experiment specs",
        done=f"{len(seen)} bad specs through `specgauge campaign run`: unknown fields (top level and nested), "
        "a wrong type, a value out of range, a missing section, no plain baseline, non-UTF-8 bytes, "
        "a list instead of a mapping, broken YAML, a missing file",
        expected="exit 2 with one message naming the file and the field (or line); nothing written",
        observed="all exit 2, nothing written; e.g. " + "; ".join(f"`{m[:70]}`" for m in seen[:3]),
        records_lost=0,
        leaked=0,
    )


def test_unknown_speculative_method(tmp_path: Path, observe) -> None:
    data = demo_spec(name="rel-medusa")
    data["variants"][1]["method"] = "medusa"
    spec = write_spec(tmp_path / "m.yaml", data)
    done = run_cli(tmp_path / "home", "campaign", "run", str(spec))
    expected = "variants[1].method: Input should be 'none', 'ngram', 'draft_model', 'eagle3', 'suffix', 'dspark', 'dflash' or 'mtp'"
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert nothing_written(tmp_path / "home") == []
    observe(
        "unknown speculative method",
        done="a variant with `method: medusa`, `specgauge campaign run`",
        expected="exit 2 naming the field and the methods known; nothing written",
        observed=f"exit {done.returncode}: `{done.stderr.strip().removeprefix('error: ').replace(str(spec), spec.name)}`",
        records_lost=0,
        leaked=0,
    )


def test_plan_and_run_report_a_bad_variant_alike_with_file_line_and_field(tmp_path: Path) -> None:
    # Both commands go through the CLI's one error boundary: the same lines, exit 2, no traceback. A file
    # whose only variant fails is not also told that it has no variants (a knock-on of the failed item).
    text = (REPO / "experiments" / "demo.yaml").read_text()
    assert "    method: ngram\n" in text
    misspelt = write_text(
        tmp_path / "misspelt.yaml", text.replace("    method: ngram\n", "    method: ngramm\n")
    )
    line = text.splitlines().index("    method: ngram") + 1
    data = demo_spec(name="rel-one-variant")
    data["variants"] = [{"name": "plain", "method": "nonee"}]
    data["load"]["concurency"] = [1]
    only = write_spec(tmp_path / "only.yaml", data)
    expected = {
        misspelt: [f"{misspelt}:{line}: variants[1].method: Input should be 'none', 'ngram'"],
        only: [f"{only}:", "variants[0].method: Input should be", "load.concurency: unknown field"],
    }
    for spec, messages in expected.items():
        outputs = []
        for command in ("plan", "run"):
            done = run_cli(tmp_path / "home", "campaign", command, str(spec))
            assert done.returncode == 2, (command, done.stderr)
            assert "Traceback" not in done.stderr and done.stderr.startswith("error: "), (
                command,
                done.stderr,
            )
            assert all(m in done.stderr for m in messages), (command, done.stderr)
            assert "at least 1 item" not in done.stderr, (command, done.stderr)
            outputs.append(done.stderr)
        assert outputs[0] == outputs[1]
    only_lines = outputs[0].removeprefix("error: ").splitlines()
    assert len(only_lines) == 2 and all(re.match(rf"{re.escape(str(only))}:\d+: ", x) for x in only_lines)
    assert nothing_written(tmp_path / "home") == []


def write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_every_command_reports_project_errors_the_same_way(tmp_path: Path) -> None:
    # One line `error: <message>`, exit 2, no traceback: from the spec, the warehouse, metrics, the gate,
    # the analysis and the profile commands alike (typer's CliRunner runs the real app in-process).
    from typer.testing import CliRunner

    from cli.app import app

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    nowhere = tmp_path / "nothing.duckdb"
    cases = {
        "campaign plan": ["campaign", "plan", str(tmp_path / "missing.yaml")],
        "sql": ["sql", "SELECT 1", "--db", str(nowhere)],
        "warehouse info": ["warehouse", "info", "--db", str(nowhere)],
        "analyze": ["analyze", "--db", str(nowhere)],
        "metrics-delta": ["metrics-delta", str(tmp_path / "a.txt"), str(empty), "--model", "m"],
        "gate": ["gate", str(tmp_path / "a"), str(tmp_path / "b"), "--control", str(tmp_path / "a")],
        "capture compare": ["capture", "compare", str(tmp_path / "a"), str(tmp_path / "b")],
        "report": ["report"],
    }
    runner = CliRunner()
    for name, args in cases.items():
        done = runner.invoke(app, args)
        assert done.exit_code == 2, (name, done.output, done.exception)
        assert done.stderr.startswith("error: ") and "Traceback" not in done.output, (name, done.stderr)
        assert not isinstance(done.exception, Exception) or isinstance(done.exception, SystemExit), name


IMPOSSIBLE: list[tuple[dict[str, Any], str]] = [
    ({"name": "x", "method": "ngram", "k": 0}, "method 'ngram' needs k (num_speculative_tokens) > 0, got 0"),
    ({"name": "x", "method": "draft_model", "k": -2, "draft_model": "d"}, "> 0, got -2"),
    ({"name": "x", "method": "ngram"}, "needs k (num_speculative_tokens) > 0, got None"),
    ({"name": "x", "method": "draft_model", "k": 3}, "method 'draft_model' needs draft_model"),
    ({"name": "x", "method": "eagle3", "k": 3}, "method 'eagle3' needs eagle_head"),
    (
        {"name": "x", "method": "ngram", "k": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
        "prompt_lookup_min (5) must not exceed prompt_lookup_max (2)",
    ),
    ({"name": "x", "method": "none", "k": 3}, "method 'none' (plain) takes no speculative settings, got k"),
    (
        {"name": "x", "method": "draft_model", "k": 3, "draft_model": "d", "draft_tensor_parallel_size": 0},
        "variants[1].draft_tensor_parallel_size: Input should be greater than 0",
    ),
]


def test_impossible_speculative_settings(observe) -> None:
    messages = []
    for variant, expected in IMPOSSIBLE:
        data = demo_spec(name="rel-k")
        data["variants"] = [{"name": "plain"}, variant]
        with pytest.raises(SpecError) as raised:
            parse_spec(data, "experiments/x.yaml")
        assert expected in str(raised.value) and str(raised.value).startswith(
            "experiments/x.yaml: variants[1]"
        )
        messages.append(str(raised.value))
    observe(
        "impossible speculative settings (k <= 0, ...)",
        done=f"{len(IMPOSSIBLE)} variants: k 0, k -2, k missing, draft_model without a draft, eagle3 without a "
        "head, prompt_lookup_min > max, plain with k, draft TP 0",
        expected="SpecError naming the file and the variant field",
        observed=f"all {len(messages)} refused; e.g. `{messages[0]}`",
        records_lost=0,
        leaked=0,
    )


def test_a_draft_with_another_vocabulary_is_refused_before_any_launch(tmp_path: Path, observe) -> None:
    odd = tmp_path / "odd-draft"
    odd.mkdir()
    config = json.loads((REPO / "models" / "tiny-draft" / "config.json").read_text())
    target_vocab = json.loads((REPO / "models" / "tiny-target" / "config.json").read_text())["vocab_size"]
    config["vocab_size"] = target_vocab + 1000
    (odd / "config.json").write_text(json.dumps(config))
    data = demo_spec(name="rel-vocab")
    data["variants"] = [
        {"name": "plain"},
        {"name": "draft-odd", "method": "draft_model", "k": 3, "draft_model": str(odd)},
    ]
    spec = write_spec(tmp_path / "v.yaml", data)
    home = tmp_path / "home"
    started = time.monotonic()
    done = run_cli(home, "campaign", "run", str(spec))
    seconds = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert f"variant 'draft-odd': draft model {odd} has vocab_size {target_vocab + 1000}" in done.stderr
    assert f"has {target_vocab}: a draft must share the target's tokenizer" in done.stderr
    assert nothing_written(home) == [] and "Traceback" not in done.stderr
    # The launcher refuses it too, before it starts anything or creates the deployment's directory.
    launcher = LocalLauncher()
    with pytest.raises(InputError, match="vocab_size"):
        launcher.launch(
            TargetSpec(model="models/tiny-target"),
            Variant(name="draft-odd", method="draft_model", k=3, draft_model=str(odd)),
            deployment_id="rel.vocab.l1",
            directory=tmp_path / "dep",
        )
    assert not (tmp_path / "dep").exists() and "rel.vocab.l1" not in ledger_ids()
    observe(
        "draft model with another vocabulary",
        done=f"a draft_model variant whose config.json has vocab_size {target_vocab + 1000} "
        f"(target {target_vocab}), `specgauge campaign run`; and the local launcher directly",
        expected="refused before the campaign writes or launches anything (no engine start wasted)",
        observed=f"exit {done.returncode} after {seconds:.1f} s: "
        f"`{done.stderr.strip()[7:].replace(str(tmp_path) + '/', '').replace(str(REPO) + '/', '')[:150]}`; nothing "
        "written, no engine started; the launcher raises InputError before creating anything",
        records_lost=0,
        leaked=0,
    )


# -- shell metacharacters ---------------------------------------------------------------------------------
HOSTILE = "x; touch {canary} #"


def test_names_with_shell_metacharacters_are_refused_and_values_quoted(tmp_path: Path, observe) -> None:
    canary = tmp_path / "canary"
    hostile = HOSTILE.format(canary=canary)
    refused = []
    for mutate, field in (
        (lambda d: d["variants"][0].update(name=hostile), "variants[0].name"),
        (lambda d: d["target"].update(served_model_name="tiny$(reboot)"), "target.served_model_name"),
        (lambda d: d.update(name="demo`id`"), "name"),
        (lambda d: d.update(launcher={"kind": "slurm", "partition": "debug;id"}), "launcher.partition"),
        (lambda d: d.update(launcher={"kind": "sml", "served_org": "o rg"}), "launcher.served_org"),
    ):
        data = demo_spec()
        mutate(data)
        with pytest.raises(SpecError, match=r"may only contain|only letters") as raised:
            parse_spec(data, "x.yaml")
        assert f"x.yaml: {field}: " in str(raised.value)
        refused.append(field)
    home = tmp_path / "home"
    labelled = run_cli(home, "campaign", "run", "experiments/demo.yaml", "--label", hostile)
    assert labelled.returncode == 2 and f"label {hostile!r} may only contain" in labelled.stderr
    assert nothing_written(home) == []
    refused.append("--label")

    # What the spec does not restrict (paths, extra engine arguments, environment values) reaches cluster
    # shells quoted: the rendered batch script, run by bash, hands every value over verbatim.
    target = TargetSpec(
        model=f"/models/$(touch {canary})/m",
        served_model_name="tiny",
        env={"HOSTILE": f"it's $(touch {canary})"},
    )
    variant = Variant(name="plain", extra_args=("--chat-template", f"`touch {canary}`; {hostile}"))
    argv_printer = [
        sys.executable,
        "-c",
        "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['HOSTILE']]))",
    ]
    args = vllm_args(target, variant, served_model_name="tiny-plain", host="0.0.0.0", port=8080)
    script = render_script(
        deployment_id="rel-quote.plain.r0",
        job_name="specgauge-rel-quote.plain.r0",
        run_dir=str(tmp_path / "run"),
        cluster=ClusterConfig(),
        engine_command=[*argv_printer, *args],
        env=dict(target.env),
    )
    (tmp_path / "run").mkdir()
    ran = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env={"SLURM_JOB_ID": "1", "PATH": "/usr/bin:/bin"},
    )
    received, env_value = json.loads(ran.stdout.strip().splitlines()[-1])
    assert received == args and env_value == target.env["HOSTILE"], ran.stderr
    assert not canary.exists()

    # The sml launcher: its command line, run by the login node's shell, reaches `sml` verbatim; a stand-in
    # sml records its argv and refuses, so nothing is submitted.
    fake_sml = tmp_path / "bin" / "sml"
    fake_sml.parent.mkdir()
    fake_sml.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\nsys.exit(3)\n"
    )
    fake_sml.chmod(0o755)
    toml = tmp_path / "env.toml"
    toml.write_text('image = "/images/vllm.sqsh"\n')
    sml = SmlLauncher(
        SmlLaunchSpec(environment_toml=str(toml)),
        cluster=ClusterConfig(sml_path=str(fake_sml), remote_dir=str(tmp_path / "sml-home")),
    )
    with pytest.raises(Exception, match=r"sml advanced failed \(exit 3\)"):
        sml.launch(target, variant, deployment_id="rel-quote.plain.r0", directory=tmp_path / "sml-dep")
    words = json.loads((tmp_path / "argv.json").read_text())
    forwarded = shlex.split(words[words.index("--framework-args") + 1])
    assert forwarded == framework_args(target, variant)
    assert not canary.exists() and "rel-quote.plain.r0" not in ledger_ids()
    observe(
        "names with shell metacharacters",
        done=f"`{hostile}`-like values as variant name, served name, experiment name, partition, served_org and "
        "campaign label; and unrestricted values (model path, extra engine args, env value) with $(...) and "
        "backticks through the SLURM batch script (run by bash) and the sml command line (run by the shell)",
        expected="names refused by the spec naming the field; other values quoted: they arrive verbatim and "
        "nothing they contain runs",
        observed=f"{len(refused)} names refused ({', '.join(refused)}); the script's engine received "
        f"{len(received)} arguments verbatim, sml received --framework-args that split back to the "
        f"{len(forwarded)} vLLM arguments; canary file never created",
        records_lost=0,
        leaked=0,
    )


# -- /metrics text and endpoints --------------------------------------------------------------------------
def test_a_bad_metrics_text_names_the_source_and_line(observe) -> None:
    cases = {
        "html": "<html>502 upstream hiccup</html>\n",
        "truncated": 'vllm:generation_tokens_total{model_name="m",engine="0"} 12\nvllm:num_requests_running{mo',
        "binary": "\x00\x01\x02 vllm:x 1\n",
        "other exporter": "process_cpu_seconds_total 3.5\n",
    }
    messages = {}
    for name, text in cases.items():
        with pytest.raises(MetricsError) as raised:
            parse(text, source="http://node:8080/metrics")
        assert str(raised.value).startswith("http://node:8080/metrics: ")
        messages[name] = str(raised.value)
    assert "at line 2" in messages["truncated"] and "contains no vllm: metrics" in messages["other exporter"]
    observe(
        "bad /metrics text",
        done="HTML, a truncated exposition, binary bytes and another exporter's text given to the parser",
        expected="MetricsError naming the source and the offending line; a cell with such a text is "
        "recorded failed (see the /metrics garbage fault)",
        observed="; ".join(f"{k}: `{v[:90]}`" for k, v in messages.items()),
        records_lost=0,
        leaked=0,
    )


def test_an_unreachable_endpoint_is_named(tmp_path: Path, observe) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        launcher = EndpointLauncher(config=EndpointConfig(base_url=f"{url}/v1", served_model_name="tiny"))
        deployment = launcher.launch(
            TargetSpec(model="m"),
            Variant(name="plain"),
            deployment_id="rel.unreachable.l1",
            directory=tmp_path,
        )
        with pytest.raises(ReadinessTimeout) as raised:
            wait_ready(deployment, launcher, timeout_s=2, poll_s=0.5)
        launcher.teardown(deployment)

        async def one() -> Any:
            async with StreamingClient(url, "tiny", timeout_s=2) as client:
                p = Prompt(
                    id="p0", workload="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                return await client.send(
                    p, Sampling(), index=0, phase="measured", t0=time.perf_counter(), queued_s=0
                )

        record = asyncio.run(one())
    message = str(raised.value)
    assert url in message and "ConnectError" in message and "not ready after 2 s" in message
    assert record.error_class == "connect" and not record.ok and record.prompt_id == "p0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deployment.json"]  # nothing else written
    observe(
        "unreachable endpoint",
        done="the endpoint launcher and the client pointed at a port that refuses connections",
        expected="the readiness check ends with ReadinessTimeout naming the URL and the last failure; a request "
        "is recorded failed as `connect`; nothing else written",
        observed=f"`{message.splitlines()[0][:150]}`; request record: {record.error_class} ({record.error[:60]})",
        records_lost=0,
        leaked=0,
    )


# -- prompts longer than the context, on the real engine ---------------------------------------------------
def _tokens(deployment, text: str) -> int:
    answer = httpx.post(
        f"{deployment.base_url}/tokenize",
        json={"model": deployment.served_model_name, "messages": [{"role": "user", "content": text}]},
        timeout=30,
    ).json()
    return int(answer["count"])


@pytest.mark.engine
def test_prompts_longer_than_the_context_on_the_real_engine(engines, tmp_path: Path, observe) -> None:
    deployment = engines.get("plain")
    limit = deployment.max_model_len
    assert limit == 2048
    line = "def add(a, b):\n    return a + b\n"
    per_line = _tokens(deployment, line * 50) / 50
    too_long = line * int(limit * 1.3 / per_line)
    almost = line * int((limit - 100) / per_line)  # fits, but not with 200 tokens of answer
    work = load_corpus(
        corpus(
            tmp_path / "long.jsonl",
            [
                ("fits", "code", "def add(a, b):", 16),
                ("too-long", "code", too_long, 16),
                ("answer-cut", "code", almost, 200),
            ],
        )
    )
    prompts = {p.id: p for p in work.prompts}

    # Sent anyway, the engine refuses the request: a failed, classified record naming the prompt.
    async def send() -> Any:
        async with StreamingClient(deployment.base_url, deployment.served_model_name, timeout_s=60) as client:
            return await client.send(
                prompts["too-long"], Sampling(), index=0, phase="measured", t0=time.perf_counter(), queued_s=0
            )

    record = asyncio.run(send())
    assert not record.ok and record.error_class == "http_status" and record.http_status == 400
    assert record.prompt_id == "too-long" and "maximum context length" in record.error

    # The cell checks first (the server's /tokenize) and refuses to measure prompts that cannot run as asked.
    problems, skipped = prompt_fit_problems(deployment, list(prompts.values()), Sampling())
    assert skipped is None and len(problems) == 2
    outcome = run_cell(
        deployment,
        CellPlan("plain.r0.code.c1", "code", "closed", 1, None, "long.jsonl"),
        campaign_id="rel-long",
        repeat=0,
        corpus=work,
        sampling=Sampling(),
        load=LoadSpec(concurrencies=(1,), requests=3, warmup=0, allow_short_cells=True, request_timeout_s=60),
        slo=SLO(),
        cells_dir=tmp_path / "cells",
    )
    error = outcome.summary.error
    rows = pl.read_parquet(outcome.path / "requests.parquet").height
    assert outcome.status == "failed" and rows == 0
    assert "2 of 3 prompts do not fit the model's context" in error
    assert "prompt 'too-long'" in error and "exceed max_model_len 2048 (the server refuses it)" in error
    assert "prompt 'answer-cut'" in error and "max_tokens 200" in error and "would cut its answer" in error
    assert "'fits'" not in error
    assert all((outcome.path / f).exists() for f in ("meta.json", "summary.json", "requests.parquet"))
    observe(
        "prompt longer than the model's context",
        done=f"on the real engine (max_model_len {limit}): a prompt of {_tokens(deployment, too_long)} tokens, "
        f"one of {_tokens(deployment, almost)} tokens with max_tokens 200, one that fits",
        expected="sent anyway, the request fails classified (http_status 400) naming the prompt id; the cell "
        "checks every prompt first (the server's /tokenize) and is recorded failed naming the misfits, "
        "before any request",
        observed=f"record: prompt_id {record.prompt_id}, {record.error_class} {record.http_status}, "
        f"`{record.error[:90]}...`; cell {outcome.status} with 0 requests sent: `{error[:220]}...`",
        records_lost=0,
        leaked=0,
    )
