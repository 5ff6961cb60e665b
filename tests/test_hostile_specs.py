"""Hostile spec files (issue 34, findings 5, 6 and 7): a spec cannot make loading hang, mislead it, make it
raise a traceback, or make it echo another file; a flow run from a deployment reads specs only from its
folders.

Through the real CLI in a subprocess (`python -m cli campaign plan|run FILE`, SPECGAUGE_HOME a tmp dir) where
the finding was seen there, with a timeout so that a hang fails the test instead of stalling it; the spec
models and the flow's path check in process. What each test saw is recorded for docs/reliability.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.context import _deployment_id
from reliability_support import REPO

from experiments.spec import load_spec
from specgauge.errors import SpecError
from specgauge.settings import get_settings

pytest_plugins = ["reliability_support"]

CLI = [sys.executable, "-m", "cli"]
HANG = "specs made to hang (alias bomb, huge counts) or to mislead (bools, duplicate keys)"
SILENT = "silent wrongs (every launch failed, bad port, a foreign file as spec)"
TRACEBACK = "inputs that raised a traceback"


def run_cli(home: Path, *args: str, timeout: float = 20) -> tuple[subprocess.CompletedProcess[str], float]:
    """The CLI's result and its wall time; a run past `timeout` fails the test (a hang, not a refusal)."""
    env = {**os.environ, "SPECGAUGE_HOME": str(home)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*CLI, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"`specgauge {' '.join(args)}` still running after {timeout:.0f} s: the input made it hang"
        )
    return done, time.monotonic() - started


def demo_text(**changes: Any) -> str:
    spec = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    spec.pop("profile", None)
    spec.update(changes)
    return yaml.safe_dump(spec, sort_keys=False)


def alias_bomb(depth: int) -> str:
    """Billion laughs: each anchor's list names the one before nine times (9^depth values once expanded)."""
    lines = ["name: bomb", 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


def refusal(path: Path, text: str) -> str:
    """The SpecError loading `text` as a spec file gives (the test fails when it loads)."""
    path.write_text(text)
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    return str(raised.value)


# -- finding 5: made to hang --------------------------------------------------------------------------------
def test_an_alias_bomb_is_refused_in_moments_naming_the_line(tmp_path: Path, observe) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb(9))
    done, took = run_cli(tmp_path / "home", "campaign", "plan", str(bomb))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith(f"error: {bomb}:") and "not an experiment spec" in lines[0]
    assert "lol" not in done.stderr  # the file's values are not echoed
    assert took < 10, f"took {took:.1f} s"
    # A few anchors and aliases, as a person writes them, still load.
    shared = yaml.safe_load(demo_text())
    text = yaml.safe_dump(shared, sort_keys=False).replace(
        "request_timeout_s: 120", "request_timeout_s: &t 120"
    )
    text = text.replace("  ready_timeout_s: 600", "  ready_timeout_s: *t")
    (tmp_path / "anchored.yaml").write_text(text)
    assert load_spec(tmp_path / "anchored.yaml").launcher.ready_timeout_s == 120
    observe(
        HANG,
        done="`specgauge campaign plan` of an 11-line alias bomb (9 levels: 9^9 values once expanded), "
        "20 s timeout",
        expected="refused at once: exit 2, one line naming file and line, before anything walks the aliases",
        observed=f"exit {done.returncode} after {took:.1f} s: "
        f"{lines[0].removeprefix(f'error: {tmp_path}/')!r}",
        records_lost=0,
        leaked=0,
    )


HUGE: list[tuple[str, dict[str, Any], str]] = [
    ("repeats", {"repeats": 100_000_000}, "repeats"),
    ("a concurrency", {"load": {"concurrencies": [1, 10**9]}}, "load.concurrencies[1]"),
    ("requests per cell", {"load": {"concurrencies": [1], "requests": 10**9}}, "load.requests"),
    ("an infinite rate", {"load": {"rates": [float("inf")]}}, "load.rates[0]"),
    ("a rate of 1e9/s", {"load": {"rates": [1e9]}}, "load.rates[0]"),
    (
        "a request timeout of .inf",
        {"load": {"concurrencies": [1], "request_timeout_s": float("inf")}},
        "load.request_timeout_s",
    ),
]


def test_huge_counts_sizes_and_rates_are_refused_naming_line_and_field(tmp_path: Path, observe) -> None:
    refused = []
    for what, change, field in HUGE:
        message = refusal(tmp_path / "huge.yaml", demo_text(**change))
        line = message.splitlines()[0]
        assert line.startswith(f"{tmp_path / 'huge.yaml'}:") and f": {field}" in line, (what, message)
        refused.append(what)
    variants = yaml.safe_load(demo_text())["variants"]
    big_k = [{"name": "ngram", "method": "ngram", "k": 1000}, variants[0]]
    assert ": variants[0].k: " in refusal(tmp_path / "k.yaml", demo_text(variants=big_k))
    refused.append("k = 1000")
    # Every field within its bound, the whole too large: refused before the plan is expanded.
    many = demo_text(
        repeats=100, load={"concurrencies": list(range(1, 1001)), "requests": 8, "allow_short_cells": True}
    )
    (tmp_path / "many.yaml").write_text(many)
    sized, took_many = run_cli(tmp_path / "home", "campaign", "plan", str(tmp_path / "many.yaml"))
    assert sized.returncode == 2 and "too large to plan" in sized.stderr, sized.stderr[-2000:]
    refused.append("1,000 concurrencies x 100 repeats")
    (tmp_path / "repeats.yaml").write_text(demo_text(repeats=100_000_000))
    done, took = run_cli(tmp_path / "home", "campaign", "plan", str(tmp_path / "repeats.yaml"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert ": repeats: " in done.stderr and took < 10
    observe(
        HANG,
        done=f"specs with {', '.join(refused)}; `campaign plan` of repeats: 100000000 and of a campaign of "
        "1,000 concurrencies x 100 repeats x 5 variants",
        expected="each refused with its line and field (the whole campaign's size before it is planned), "
        "exit 2 in seconds",
        observed=f"{len(refused)} of {len(HUGE) + 2} refused naming line and field; repeats: 100000000 exit "
        f"{done.returncode} in {took:.1f} s; the large campaign exit {sized.returncode} in {took_many:.1f} s "
        f"({sized.stderr.strip().split(': ', 2)[-1][:150]})",
        records_lost=0,
        leaked=0,
    )


def test_booleans_are_not_counts_and_duplicate_keys_are_refused(tmp_path: Path, observe) -> None:
    path = tmp_path / "spec.yaml"
    seen = []
    for text, field in (
        (demo_text().replace("repeats: 2", "repeats: true"), "repeats"),
        (demo_text().replace("  - 4\n", "  - true\n"), "load.concurrencies[1]"),
        (demo_text().replace("  temperature: 0.0", "  temperature: false"), "sampling.temperature"),
    ):
        message = refusal(path, text)
        assert f": {field}: " in message and "not true/false" in message, message
        seen.append(message.splitlines()[0].removeprefix(f"{path}"))
    dup = demo_text() + "repeats: 3\n"
    message = refusal(path, dup)
    first = dup.splitlines().index("repeats: 2") + 1
    last = len(dup.splitlines())
    expected = f"{path}:{last}: repeats: given twice (lines {first} and {last}): YAML would silently keep"
    assert message == f"{expected} the last"
    nested = demo_text().replace(
        "  requests_per_slot: 4\n", "  requests_per_slot: 4\n  requests_per_slot: 5\n"
    )
    assert ": load.requests_per_slot: given twice" in refusal(path, nested)
    # Whole numbers written as whole numbers stay what they were.
    assert load_spec(REPO / "experiments" / "demo.yaml").repeats == 2
    observe(
        HANG,
        done="specs with repeats: true, a concurrency true, temperature: false, and a key given twice (top "
        "level "
        "and nested)",
        expected="each refused naming line and field (both lines for a duplicate), not read as 1, 0 or the "
        "last",
        observed="; ".join([*seen, message.removeprefix(str(path))]),
        records_lost=0,
        leaked=0,
    )


# -- finding 7: a foreign file as a spec --------------------------------------------------------------------
def test_a_foreign_file_is_one_line_that_never_echoes_its_contents(tmp_path: Path, observe) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(Path("/etc/passwd").read_text())
    secrets = tmp_path / "secrets.conf"
    secrets.write_text(
        "MemTotal:       16318412 kB\nprod token ghp_canary0123456789: yes\npassword: hunter2\n"
    )
    spec_with_junk = tmp_path / "junk.yaml"
    spec_with_junk.write_text(demo_text() + "my password is hunter2 and ghp_canary0123456789: 1\n")
    outputs = {}
    for path in (passwd, secrets, spec_with_junk):
        done, _ = run_cli(tmp_path / "home", "campaign", "run", str(path))
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert "ghp_canary" not in done.stderr and "hunter2" not in done.stderr and "root:" not in done.stderr
        outputs[path.name] = done.stderr.strip()
    for name in ("passwd", "secrets.conf"):
        assert len(outputs[name].splitlines()) == 1 and "not an experiment spec" in outputs[name]
    assert "<a key that is not a field name>: unknown field" in outputs["junk.yaml"]
    observe(
        SILENT,
        done="`specgauge campaign run` of a copy of /etc/passwd, of a `key: value` file holding a token "
        "and a password, and of a spec with one junk line as a key",
        expected="exit 2; one line saying the file is not a spec, no line of it echoed; a spec's junk key "
        "not shown",
        observed="; ".join(
            o.removeprefix("error: ").replace(str(tmp_path) + "/", "") for o in outputs.values()
        ),
        records_lost=0,
        leaked=0,
    )


def test_a_flow_from_a_deployment_reads_specs_only_under_its_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, observe
) -> None:
    from experiments.loader import check_spec_path, flow_spec_path
    from flows.campaign import CampaignRequest, campaign

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text(Path("/etc/passwd").read_text())
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "mine.yaml").write_text(demo_text())
    (allowed / "link.yaml").symlink_to(outside / "passwd")
    monkeypatch.setenv("SPECGAUGE_SPEC_DIRS", str(allowed))
    get_settings.cache_clear()

    # A run from a deployment: the flow engine sets this for it and its subflows (prefect/flow_engine.py).
    token = _deployment_id.set(uuid.uuid4())
    try:
        refused = []
        for path in (outside / "passwd", allowed / "link.yaml", "experiments/../../../../etc/passwd"):
            with pytest.raises(SpecError, match="is not under") as raised:
                campaign.fn(CampaignRequest(spec_path=str(path)))
            assert "root:" not in str(raised.value)
            refused.append(str(raised.value))
        assert flow_spec_path(str(allowed / "mine.yaml")) == str(allowed / "mine.yaml")
        assert flow_spec_path("experiments/demo.yaml") == "experiments/demo.yaml"
    finally:
        _deployment_id.reset(token)
    # The user's own shell (the CLI, a script): any file they name.
    assert flow_spec_path(str(outside / "passwd")) == str(outside / "passwd")
    assert check_spec_path("experiments/demo.yaml") == REPO / "experiments" / "demo.yaml"
    observe(
        SILENT,
        done="the campaign flow, as a deployment's run, given a copy of /etc/passwd, a symlink to it inside "
        "an "
        "allowed folder, and experiments/../../../../etc/passwd",
        expected="each refused before the file is read, one message naming the allowed folders; specs under "
        "them and any path outside a deployment still accepted",
        observed=f"{len(refused)} of 3 refused: {refused[0].replace(str(tmp_path) + '/', '')[:160]}",
        records_lost=0,
        leaked=0,
    )


def test_a_flow_from_a_deployment_reads_and_writes_only_under_its_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other path parameters of the deployed flows: warehouse files, raw trees and report folders only
    under SPECGAUGE_HOME; training inputs and heads only under the repo, HOME or SPECGAUGE_SPEC_DIRS."""
    from flows.adapt import AdaptationRequest, confirm_adaptation
    from flows.analyze import AnalysisRequest, analyze
    from flows.ingest import ingest
    from flows.simulate import SimulationRequest, simulate
    from flows.train_drafter import TrainRequest, train_drafter_flow
    from specgauge.errors import InputError

    home = tmp_path / "home"
    monkeypatch.setenv("SPECGAUGE_HOME", str(home))
    get_settings.cache_clear()
    outside = tmp_path / "outside"
    calls = {
        "analyze reports_dir": lambda: analyze.fn(AnalysisRequest(reports_dir=str(outside))),
        "analyze db": lambda: analyze.fn(AnalysisRequest(db="/etc/passwd")),
        "ingest raw_dir": lambda: ingest.fn(raw_dir=str(outside)),
        "simulate db": lambda: simulate.fn(SimulationRequest(campaign_id="c", db=str(outside / "w.duckdb"))),
        "train jsonl": lambda: train_drafter_flow.fn(TrainRequest(jsonl=["/etc/passwd"])),
        "adapt new_head": lambda: confirm_adaptation.fn(
            AdaptationRequest(spec_path="experiments/adapt.yaml", new_head="/etc", target_stratum="code")
        ),
    }
    token = _deployment_id.set(uuid.uuid4())
    try:
        for what, call in calls.items():
            with pytest.raises(InputError, match="is not under") as raised:
                call()
            assert "root:" not in str(raised.value), what
    finally:
        _deployment_id.reset(token)
    assert not outside.exists()  # nothing was written there


# -- finding 6: a traceback instead of one line -------------------------------------------------------------
def test_a_spec_nested_thousands_deep_is_one_error_line(tmp_path: Path, observe) -> None:
    results = []
    for name, text in (
        ("flow.yaml", "name: deep\ntarget: " + "[" * 5000 + "]" * 5000 + "\n"),
        (
            "block.yaml",
            "name: deep\n" + "".join(f"{' ' * i}k{i}:\n" for i in range(1000)) + " " * 1000 + "x\n",
        ),
    ):
        path = tmp_path / name
        path.write_text(text)
        done, _ = run_cli(tmp_path / "home", "campaign", "plan", str(path))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and "Traceback" not in done.stderr and len(lines) == 1, done.stderr[
            -2000:
        ]
        assert lines[0].startswith(f"error: {path}:") and "nested deeper than" in lines[0]
        results.append(lines[0].removeprefix(f"error: {tmp_path}/"))
    observe(
        TRACEBACK,
        done="`specgauge campaign plan` of a spec nested 5,000 deep (flow style) and 1,000 deep (block "
        "style)",
        expected="one `error:` line naming the file and line, exit 2",
        observed="; ".join(results),
        records_lost=0,
        leaked=0,
    )
