"""Issue 34 finding 3 (secrets in clear): one canary secret planted in every input that can carry one, real
campaigns run through the CLI to the warehouse, an error path that prints the endpoint URL, the alerts
command; then every byte under SPECGAUGE_HOME, the Prefect database and everything the commands printed is
searched for the canary. It must be nowhere, while each secret was really used where it must be (the
engine got its token and --api-key, the client sent the key the emulator demanded, the endpoint behind a
URL with a password saw the basic-auth header), so the test cannot pass by planting secrets nobody reads."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import cli_run
from reliability_support import corpus, emulator_spec, write_spec
from stand_ins.gateway import Gateway

pytest_plugins = ["reliability_support"]

REPO = Path(__file__).resolve().parent.parent
ROW = "secrets in endpoint URLs, engine env and engine flags"
# Not shaped like a known token (hf_, sk-...): the rule must catch it by where it stands, not by its look.
CANARY = "cnry" + uuid.uuid4().hex
URL_PASSWORD = f"{CANARY}url"
HF_TOKEN = f"{CANARY}hf"
ENGINE_KEY = f"{CANARY}key"
WEBHOOK_SECRET = f"{CANARY}hook"
BLOCK_KEY = f"{CANARY}block"


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


# -- the rule (specgauge.redact), unit by unit ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://bench:pw0rd@10.0.0.5:8000/v1", "http://REDACTED@10.0.0.5:8000/v1"),
        (
            "not ready at https://u:p@h.example/x after 2 s",
            "not ready at https://REDACTED@h.example/x after 2 s",
        ),
        ("vllm serve m --api-key k3y --port 1", "vllm serve m --api-key REDACTED --port 1"),
        ("vllm serve m --api-key=k3y", "vllm serve m --api-key=REDACTED"),
        ("--hf-token 'a b' --tokenizer t", "--hf-token 'REDACTED' --tokenizer t"),
        ("export HF_TOKEN=abc123", "export HF_TOKEN=REDACTED"),
        ("export HF_TOKEN='abc 123'", "export HF_TOKEN='REDACTED'"),
        ("{'HF_TOKEN': 'abc', 'PATH': '/bin'}", "{'HF_TOKEN': 'REDACTED', 'PATH': '/bin'}"),
        ('{"api_key": "abc"}', '{"api_key": "REDACTED"}'),
        ("X-Api-Key: abc", "X-Api-Key: REDACTED"),
        ("Authorization: Bearer abcdef123456", "Authorization: Bearer REDACTED"),
        ("GET /hook?token=abc&x=1", "GET /hook?token=REDACTED&x=1"),
        ("used hf_" + "a" * 24 + " to pull", "used REDACTED to pull"),
        ("key sk-" + "b" * 20, "key REDACTED"),
        # not secrets: these stay as they are
        (
            "--tokenizer models/t --max-num-batched-tokens 512",
            "--tokenizer models/t --max-num-batched-tokens 512",
        ),
        ("--num-speculative-tokens 3 max_tokens=8", "--num-speculative-tokens 3 max_tokens=8"),
        ("the api key expired; token counts differ", "the api key expired; token counts differ"),
        ("--api-key --port 8000", "--api-key --port 8000"),  # no value here: nothing to hide
        ("mail bench@example.org", "mail bench@example.org"),
        # a file named like a secret word is a path, not an assignment (the spec loader's errors name files)
        ("/tmp/etc/passwd: not an experiment spec", "/tmp/etc/passwd: not an experiment spec"),
        ("", ""),
    ],
)
def test_redact_text(text: str, expected: str) -> None:
    from specgauge.redact import redact_text

    assert redact_text(text) == expected
    assert redact_text(expected) == expected  # idempotent: a redacted text is left as it is


def test_redact_args_keeps_the_shape() -> None:
    from specgauge.redact import REDACTED, redact_args

    args = [
        "--model",
        "m",
        "--api-key",
        "k",
        "--hf-token=t",
        "--tokenizer",
        "tok",
        "--max-num-batched-tokens",
        "8",
    ]
    out, replaced = redact_args(args)
    assert out == (
        "--model",
        "m",
        "--api-key",
        REDACTED,
        f"--hf-token={REDACTED}",
        "--tokenizer",
        "tok",
        "--max-num-batched-tokens",
        "8",
    )
    assert replaced == ["--api-key", "--hf-token"]
    assert redact_args(["--api-key", "--port", "1"])[0] == ("--api-key", "--port", "1")
    assert redact_args(["ghp_" + "c" * 30])[0] == (REDACTED,)


def test_redact_data_nested() -> None:
    from pydantic import SecretStr

    from specgauge.redact import REDACTED, redact_data, redact_env

    data = {
        "target": {
            "env": {"HF_TOKEN": "t", "VLLM_CPU_KVCACHE_SPACE": "4"},
            "extra_args": ["--api-key", "k", "--dtype", "float32"],
        },
        "launcher": {"base_url": "http://u:p@h:1", "api_key": SecretStr("s"), "ready_timeout_s": 30},
        "variants": [{"name": "plain", "extra_args": ("--api-key=k",)}],
        "authenticated": True,
        "max_tokens": 8,
        "tokenizer": "models/t",
    }
    out = redact_data(data)
    assert out["target"]["env"] == {"HF_TOKEN": REDACTED, "VLLM_CPU_KVCACHE_SPACE": "4"}
    assert out["target"]["extra_args"] == ["--api-key", REDACTED, "--dtype", "float32"]
    assert out["launcher"] == {
        "base_url": f"http://{REDACTED}@h:1",
        "api_key": REDACTED,
        "ready_timeout_s": 30,
    }
    assert out["variants"] == [{"name": "plain", "extra_args": (f"--api-key={REDACTED}",)}]
    assert (out["authenticated"], out["max_tokens"], out["tokenizer"]) == (True, 8, "models/t")
    assert data["target"]["env"]["HF_TOKEN"] == "t", "the input is not changed: the run keeps the real value"
    assert redact_env({"OPENAI_API_KEY": "x", "HOME": "/root"}) == {
        "OPENAI_API_KEY": REDACTED,
        "HOME": "/root",
    }


def test_redact_webhook_shows_the_host_only() -> None:
    from specgauge.redact import redact_webhook

    assert redact_webhook("https://hooks.slack.com/services/T0/B0/XYZ") == "https://hooks.slack.com/REDACTED"
    assert redact_webhook("http://u:p@10.0.0.1:9000") == "http://10.0.0.1:9000/REDACTED"
    assert redact_webhook("https://alerts.example.org") == "https://alerts.example.org"
    assert redact_webhook("not a url") == "REDACTED"


def test_the_log_filter_redacts_message_and_arguments() -> None:
    import logging

    from specgauge.redact import RedactingFilter

    record = logging.LogRecord(
        "specgauge.x", logging.INFO, __file__, 1, "at %s with --api-key %s", ("http://u:p@h", "k"), None
    )
    assert RedactingFilter().filter(record) is True
    assert record.getMessage() == "at http://REDACTED@h with --api-key REDACTED"
    try:
        raise ValueError("HF_TOKEN=abc")
    except ValueError:
        import sys as _sys

        failed = logging.LogRecord("specgauge.x", logging.ERROR, __file__, 1, "failed", None, _sys.exc_info())
    RedactingFilter().filter(failed)
    assert "HF_TOKEN=REDACTED" in failed.exc_text and "abc" not in failed.exc_text


def test_configuration_documents_are_written_redacted_and_measurements_are_not(tmp_path: Path) -> None:
    from artifacts.documents import CaptureMeta, DeploymentFacts
    from artifacts.store import write_json
    from warehouse.kinds.campaigns import campaign_frames
    from warehouse.kinds.deployments import deployment_frames

    old = {  # as written before redaction: the warehouse must not copy the secrets either
        "id": "c.plain.r0.l1",
        "launcher": "local",
        "variant": {"name": "plain", "extra_args": ["--api-key", "vk"]},
        "base_url": "http://u:pw@h:1",
        "command": ["python", "-m", "vllm", "--api-key", "ek", "--port", "1"],
        "status": "ready",
        "extra": {"HF_TOKEN": "ht", "port": 1},
        "teardown": "stopped http://u:pw@h:1",
    }
    facts = DeploymentFacts.model_validate(old)
    write_json(tmp_path / "deployment.json", facts)
    written = (tmp_path / "deployment.json").read_text()
    for secret in ("pw", '"vk"', '"ek"', '"ht"'):
        assert secret not in written
    assert facts.base_url == "http://u:pw@h:1", "the object in memory keeps the real value"
    row = deployment_frames(
        "x", "c", "c.plain.r0.l1", {"deployment.json": json.dumps(old).encode()}, "0" * 64
    )
    text = json.dumps(row["deployments"][0], default=str)
    for secret in ("pw", '"vk"', '"ek"', '"ht"'):
        assert secret not in text, secret
    campaign = {
        "campaign_id": "c",
        "spec": {
            "name": "c",
            "target": {"model": "m", "env": {"HF_TOKEN": "ht"}, "extra_args": ["--api-key", "ek"]},
        },
        "created_utc": "2026-12-02T00:00:00+00:00",
    }
    rows = campaign_frames("x", "c", {"campaign.json": json.dumps(campaign).encode()}, "0" * 64)
    spec_column = rows["campaigns"][0]["spec"]
    assert '"ht"' not in spec_column and '"ek"' not in spec_column and "REDACTED" in spec_column
    measured = CaptureMeta(capture_id="c1", prompt_ids=["password=hunter2"])
    assert measured.model_dump()["prompt_ids"] == ["password=hunter2"], "measurement data is not redacted"


def test_an_endpoint_password_leaves_the_url_and_becomes_basic_auth(tmp_path: Path) -> None:
    from experiments.spec import TargetSpec, Variant
    from tasks.launch.command import engine_api_key
    from tasks.launch.config import EndpointConfig
    from tasks.launch.endpoint import EndpointLauncher

    launcher = EndpointLauncher(config=EndpointConfig(base_url="http://bench:p%40ss@127.0.0.1:9/v1"))
    deployment = launcher.launch(
        TargetSpec(model="m", served_model_name="s"),
        Variant(name="plain"),
        deployment_id="e.r0",
        directory=tmp_path,
    )
    assert (
        deployment.base_url == "http://127.0.0.1:9" and deployment.metrics_url == "http://127.0.0.1:9/metrics"
    )
    assert deployment.headers() == {"Authorization": "Basic " + base64.b64encode(b"bench:p@ss").decode()}
    assert "p%40ss" not in (tmp_path / "deployment.json").read_text()
    assert "p@ss" not in repr(deployment)
    key = engine_api_key(["python", "-m", "vllm", "--api-key", "k1"], {"VLLM_API_KEY": "k2"})
    assert key is not None and key.get_secret_value() == "k1"
    assert engine_api_key(["python"], {"VLLM_API_KEY": "k2"}).get_secret_value() == "k2"  # type: ignore[union-attr]
    assert engine_api_key(["python"], {}) is None


def test_the_alert_webhook_is_handed_on_in_the_environment() -> None:
    from flows.alerts import ALERT_WEBHOOK_ENV, alerts_command

    url = "https://hooks.example.org/services/SECRET"
    argv, env = alerts_command(url, {"PATH": "/bin"})
    assert not any("SECRET" in arg for arg in argv), argv
    assert env[ALERT_WEBHOOK_ENV] == url and env["PATH"] == "/bin"


def test_prefect_stores_flow_parameters_redacted() -> None:
    from prefect import flow

    import flows  # noqa: F401  (installs the redaction of stored parameters)

    @flow
    def takes(spec: dict) -> dict:
        return spec

    stored = takes.serialize_parameters(
        {"spec": {"target": {"env": {"HF_TOKEN": "t"}}, "url": "http://u:p@h"}}
    )
    assert stored == {"spec": {"target": {"env": {"HF_TOKEN": "REDACTED"}}, "url": "http://REDACTED@h"}}


# -- the canary -----------------------------------------------------------------------------------------------
# The engine for the local launcher: vLLM's command line in, the emulator out, demanding the --api-key it was
# given (so every request must carry it). It writes digests, never the secrets, of what it got to PROOF.
ENGINE = """#!{python}
import hashlib, json, os, sys
sys.path.insert(0, {repo!r})
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1] if name in args else None
digest = lambda v: hashlib.sha256(v.encode()).hexdigest() if v else None
with open({proof!r}, "a") as fh:
    fh.write(json.dumps({{"api_key": digest(opt("--api-key")), "hf_token": digest(os.environ.get("HF_TOKEN"))}}) + "\\n")
from emulator.launch import main
main(["--host", opt("--host"), "--port", opt("--port"), "--model", opt("--served-model-name"),
      *(["--api-key", opt("--api-key")] if opt("--api-key") else [])])
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The canary engine as the local launcher's engine python; yields the file of its proofs."""
    from specgauge.settings import get_settings

    proof = tmp_path / "engine-proof.jsonl"  # outside SPECGAUGE_HOME: digests only
    path = tmp_path / "canary-engine"
    path.write_text(ENGINE.format(python=sys.executable, repo=str(REPO), proof=str(proof)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SPECGAUGE_ENGINE_PYTHON", str(path))
    get_settings.cache_clear()
    yield proof
    get_settings.cache_clear()


def _files_holding(root: Path, needle: bytes) -> tuple[int, int, list[str]]:
    """(files read, bytes read, files holding `needle`) under root, recursively, as bytes."""
    files = size = 0
    found: list[str] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        files, size = files + 1, size + len(data)
        if needle in data:
            found.append(str(path))
    return files, size, found


def _tables_holding(db: Path, needle: str) -> list[str]:
    """table.column of the SQLite database that hold `needle` (to say where a leak is)."""
    found = []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for column in [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]:
                query = f'SELECT count(*) FROM "{table}" WHERE CAST("{column}" AS TEXT) LIKE ?'
                if con.execute(query, (f"%{needle}%",)).fetchone()[0]:
                    found.append(f"{table}.{column}")
    return found


def _prefect_database_dir() -> Path:
    """The folder of the Prefect API database the session's test server writes (SQLite and its WAL)."""
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    url = str(PREFECT_SERVER_DATABASE_CONNECTION_URL.value())
    assert url.startswith("sqlite"), url
    return Path(url.split(":///", 1)[1]).parent


@pytest.mark.server  # a real Prefect API
@pytest.mark.timeout(600)  # four CLI runs: about 3 minutes on 2 busy cores
def test_the_canary_is_nowhere(prefect_api, emulator, engine, home, tmp_path, observe) -> None:
    from blocks.endpoint import EndpointBlock

    env = {**os.environ, "PREFECT_API_URL": prefect_api, "SPECGAUGE_HOME": str(home)}
    work = corpus(tmp_path / "w.jsonl", [("c-0", "chat", "hello there", 8), ("c-1", "chat", "hi", 8)])
    printed: list[str] = []

    def run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        done = cli_run({**env, **extra_env}, *args, timeout=240)
        printed.extend([done.stdout, done.stderr])
        return done

    def cells_ok(name: str) -> int:
        """Cells of campaign `name` whose latest summary says ok (the secret worked: else 401s)."""
        summaries = sorted((home / "raw").glob(f"{name}-*/cells/*/summary.json"))
        assert summaries, f"campaign {name} wrote no cell"
        return sum(json.loads(p.read_text())["status"] == "ok" for p in summaries)

    # 1. the local launcher: HF_TOKEN in target.env, --api-key in extra_args (the engine then demands it)
    local = emulator_spec(
        "canary-local",
        work,
        target={
            "model": "models/tiny-target",
            "served_model_name": "tiny",
            "env": {"HF_TOKEN": HF_TOKEN},
            "extra_args": ["--api-key", ENGINE_KEY],
        },
    )
    done = run("campaign", "run", str(write_spec(tmp_path / "local.yaml", local)), "--no-gate")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    local_ok = cells_ok("canary-local")
    assert local_ok >= 1, "no cell passed: the client did not send the engine's --api-key"
    proofs = [json.loads(line) for line in engine.read_text().splitlines()]
    assert proofs and all(
        p == {"api_key": _digest(ENGINE_KEY), "hf_token": _digest(HF_TOKEN)} for p in proofs
    ), "the engine did not get its key and token"

    # 2. the endpoint launcher, a password in the base URL's userinfo
    basic = "Basic " + base64.b64encode(f"bench:{URL_PASSWORD}".encode()).decode()
    endpoint_target = {"model": "models/tiny-target", "served_model_name": "emulated"}
    # a real server behind basic auth: requests without the URL's password (readiness, /metrics, the load)
    # are refused and listed
    with Gateway(emulator.url, authorization=basic, metrics=True) as proxy:
        url = f"http://bench:{URL_PASSWORD}@127.0.0.1:{proxy.port}"
        spec = emulator_spec(
            "canary-endpoint",
            work,
            target=endpoint_target,
            launcher={"kind": "endpoint", "base_url": url, "metrics_url": f"{url}/metrics"},
        )
        done = run(
            "campaign", "run", str(write_spec(tmp_path / "endpoint.yaml", spec)), "--no-gate", "--no-analyze"
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert proxy.authorized > 0, "the URL's password never reached the server"
        assert not proxy.refused, f"requests without the URL's basic auth: {proxy.refused[:5]}"
        endpoint_ok = cells_ok("canary-endpoint")
        assert endpoint_ok >= 1
        seen_basic = proxy.authorized

    # 3. an error path that names the URL: an endpoint with a password where nothing listens
    dead_port = _free_port()
    dead = f"http://bench:{URL_PASSWORD}@127.0.0.1:{dead_port}"
    spec = emulator_spec(
        "canary-dead",
        work,
        target=endpoint_target,
        launcher={"kind": "endpoint", "base_url": dead, "ready_timeout_s": 2},
    )
    done = run("campaign", "run", str(write_spec(tmp_path / "dead.yaml", spec)), "--no-gate", "--no-analyze")
    launches = list((home / "raw").glob("canary-dead-*/deployments/*/deployment.json"))
    assert launches and all(json.loads(p.read_text())["status"] == "failed" for p in launches)
    assert f"127.0.0.1:{dead_port}" in done.stdout + done.stderr, "the error did not name the endpoint"

    # 4. a SecretStr API key in an EndpointBlock (the emulator demands it)
    emulator.configure(api_key=BLOCK_KEY)
    block_name = f"canary-{uuid.uuid4().hex[:8]}"
    EndpointBlock(base_url=emulator.url, api_key=BLOCK_KEY, served_model_name="emulated").save(block_name)
    spec = emulator_spec(
        "canary-block", work, target=endpoint_target, launcher={"kind": "endpoint", "block": block_name}
    )
    done = run("campaign", "run", str(write_spec(tmp_path / "block.yaml", spec)), "--no-gate", "--no-analyze")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    block_ok = cells_ok("canary-block")
    assert block_ok >= 1, "no cell passed: the block's key was not sent"

    # 5. the alerts' webhook, a secret in its userinfo and in its path (as Slack's hooks carry one)
    hook = f"https://alerts:{WEBHOOK_SECRET}@hooks.example.org/services/{WEBHOOK_SECRET}"
    done = run("prefect", "alerts", SPECGAUGE_ALERT_WEBHOOK=hook)  # as `prefect deploy` hands it on
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "hooks.example.org" in done.stdout, "alerts should still say where they go"

    # the warehouse has the campaigns: the run went through to the end
    from warehouse.db import reader

    with reader() as con:
        campaigns = con.execute(
            "SELECT count(*) FROM campaigns WHERE campaign_id LIKE 'canary-%'"
        ).fetchone()[0]
        urls = [r[0] for r in con.execute("SELECT base_url FROM deployments").fetchall()]
    assert campaigns >= 3 and any("127.0.0.1" in (u or "") for u in urls)

    # the search: every file of the home (raw tree, warehouse, ledger, engine logs, Prefect's home), the
    # Prefect API database, and every byte the commands printed
    needle = CANARY.encode()
    home_files, home_bytes, in_home = _files_holding(home, needle)
    db_files, db_bytes, in_db = _files_holding(_prefect_database_dir(), needle)
    in_printed = [
        text[max(0, text.find(CANARY) - 200) : text.find(CANARY) + 60] for text in printed if CANARY in text
    ]
    printed_bytes = sum(len(t.encode()) for t in printed)
    assert home_files > 20 and db_files >= 1
    leaks = len(in_home) + len(in_db) + len(in_printed)
    observe(
        ROW,
        done="one canary planted in an endpoint URL's password, target.env HF_TOKEN, extra_args --api-key, an "
        "EndpointBlock's SecretStr api_key and an alert webhook URL; three campaigns run through the CLI to "
        "the warehouse, one launch that fails naming the URL, `prefect alerts`",
        expected="the canary nowhere: not in a file under SPECGAUGE_HOME, not in the Prefect database, not in "
        "what the commands printed; each secret still used where it must be",
        observed=f"grepped {home_files} files ({home_bytes} bytes) under SPECGAUGE_HOME, {db_files} files "
        f"({db_bytes} bytes) of the Prefect database, {printed_bytes} bytes printed: matches found: {leaks}; "
        f"the engine got its --api-key and HF_TOKEN in {len(proofs)} launch(es) and {local_ok} cell(s) passed "
        f"its key check; the endpoint saw the URL's basic auth on {seen_basic} requests ({endpoint_ok} cell(s) "
        f"ok); {block_ok} cell(s) passed the emulator's check of the block's key",
        leaked=leaks,
    )
    assert not in_home, f"canary in files under SPECGAUGE_HOME: {in_home}"
    db = _prefect_database_dir() / "prefect-test.db"
    assert not in_db, f"canary in the Prefect database: {in_db} ({_tables_holding(db, CANARY)})"
    assert not in_printed, f"canary printed: {in_printed}"
