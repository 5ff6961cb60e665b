"""The `sml` launcher, driven over the real sshd against tests/stand_ins/sml (a stand-in that prints and
writes what the real `sml advanced` does and submits to the local SLURM with sbatch), for both flag
generations. The real `sml` is not exercised here (docs/cluster.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from stand_ins.cluster import (
    CPU_ENGINE_ARGS,
    CPU_ENGINE_ENV,
    ENGINE_PYTHON,
    REPO,
    STAND_INS,
    ensure_services,
    live_job_ids,
    ssh_config,
)

from experiments.spec import SmlLaunchSpec, TargetSpec, Variant
from specgauge.errors import InputError, LaunchError
from tasks.health import wait_ready
from tasks.launch import ledger
from tasks.launch.config import ClusterConfig
from tasks.launch.local import free_port
from tasks.launch.sml import (
    SmlLauncher,
    check_generation,
    framework_args,
    head_ip,
    parse_submission,
    sml_command,
    unique_served_name,
)

SLEEPER = "bash -c 'exec sleep 600' sleeper"
TARGET = TargetSpec(model=str(REPO / "models" / "tiny-target"), served_model_name="tiny", max_model_len=1024)
PLAIN = Variant(name="plain")
NGRAM = Variant(name="ngram-k3", method="ngram", k=3)
MOUNT = {"current": "/capstor/opentela-share:/opentelabin", "legacy": "/capstor/ocf-share:/ocfbin"}


def environment_toml(directory: Path, generation: str) -> Path:
    """An environment TOML as model-launch ships them, for one generation, with the {arch} placeholder."""
    path = directory / f"vllm-{generation}.toml"
    path.write_text(
        f'image = "/capstor/images/vllm_apertus-{{arch}}.sqsh"\n\nmounts = [\n  "{MOUNT[generation]}",\n'
        '  "/capstor",\n]\n\nworkdir = "/workspace/"\n\n[env]\nNCCL_DEBUG = "WARN"\n'
    )
    return path


# -- command building and parsing (no cluster needed) ---------------------------------------------------
def test_flags_of_each_generation() -> None:
    cluster = ClusterConfig(partition="normal", account="a01", sml_system="clariden", time_limit="02:00:00")
    args = framework_args(TARGET, NGRAM)
    current = sml_command(cluster, environment="/s/env.toml", args=args, served="u/o/n", generation="current")
    legacy = sml_command(cluster, environment="/s/env.toml", args=args, served="u/o/n", generation="legacy")
    assert current[:2] == ["sml", "advanced"]
    for flag in ("--system", "--framework", "--environment", "--replicas", "--nodes-per-replica"):
        assert flag in current and flag not in legacy
    for flag in ("--firecrest-system", "--serving-framework", "--slurm-environment", "--slurm-replicas"):
        assert flag in legacy and flag not in current
    for words in (current, legacy):
        assert words[words.index("--partition") + 1] == "normal" and words[-1] == "--no-tui"
        assert words[words.index("--served-model-name") + 1] == "u/o/n"
    # sml sets the served name and injects --port 8080 itself: neither is in the framework args.
    assert "--served-model-name" not in args and "--port" not in args
    assert args[args.index("--speculative-config") + 1] == (
        '{"num_speculative_tokens":3,"method":"ngram","prompt_lookup_min":1,"prompt_lookup_max":4}'
    )


def test_served_names_are_three_segments_and_unique() -> None:
    first = unique_served_name("alice", "specgauge", TARGET, NGRAM)
    second = unique_served_name("alice", "specgauge", TARGET, NGRAM)
    assert first != second
    for name in (first, second):
        user, org, rest = name.split("/")
        assert (user, org) == ("alice", "specgauge") and rest.startswith("tiny-ngram-k3-")
    assert unique_served_name("bob", "x", TARGET, PLAIN, stamp="20261130T120000000Z") == (
        "bob/x/tiny-plain-20261130T120000000Z"
    )
    with pytest.raises(InputError, match="user segment"):
        unique_served_name("a/b", "x", TARGET, PLAIN)


def test_output_and_log_parsing() -> None:
    out = "Job submitted: 4242\nServed model name: alice/specgauge/tiny\nLogs: ~/.sml/logs/4242\nTail: ...\n"
    assert parse_submission(out) == ("4242", "alice/specgauge/tiny", "~/.sml/logs/4242")
    with pytest.raises(LaunchError, match="no 'Job submitted"):
        parse_submission("Traceback ...")
    log = "Node 0: nid001\nNode 1: nid002\nReplica 0 head IP: 10.1.2.3\nReplica 1 head IP: 10.1.2.4\n"
    assert head_ip(log) == "10.1.2.3" and head_ip(log, 1) == "10.1.2.4" and head_ip("Node 0: x\n") is None


def test_generation_mismatch_with_the_environment_toml_is_said(tmp_path: Path) -> None:
    legacy_toml = environment_toml(tmp_path, "legacy")
    with pytest.raises(InputError) as caught:
        check_generation(legacy_toml.read_text(), str(legacy_toml), "current")
    message = str(caught.value)
    assert message.startswith(f"{legacy_toml}:4: mounts: mounts /ocfbin")
    assert "sml_flags=current" in message and "die on the node" in message
    check_generation(legacy_toml.read_text(), str(legacy_toml), "legacy")  # matching pair: fine
    current_toml = environment_toml(tmp_path, "current")
    with pytest.raises(InputError, match="mounts /opentelabin"):
        check_generation(current_toml.read_text(), str(current_toml), "legacy")


# -- against the stand-in on the test cluster -------------------------------------------------------
@pytest.fixture(scope="module")
def cluster_services() -> None:
    ensure_services("sshd", "slurm")


@pytest.fixture
def no_leftover_jobs(cluster_services: None) -> Iterator[None]:
    before = live_job_ids()
    yield
    assert not live_job_ids() - before, "jobs left in squeue"


def sml_launcher(
    tmp_path: Path, generation: str, *, engine: str = SLEEPER, flags: str | None = None
) -> SmlLauncher:
    port = free_port()
    cluster = ClusterConfig(
        name="standin",
        partition="debug",
        remote_dir=str(tmp_path / "cluster-home" / "specgauge"),
        environment_toml=str(environment_toml(tmp_path, generation)),
        arch="amd64",
        sml_path=str(STAND_INS / "sml"),
        sml_flags=flags or generation,  # type: ignore[arg-type]
        sml_env={
            "HOME": str(tmp_path / "cluster-home"),  # the stand-in writes ~/.sml/logs/<id>/ there
            "SML_STANDIN_GENERATION": generation,
            "SML_STANDIN_ENGINE": engine,
            "SML_STANDIN_PORT": str(port),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            **CPU_ENGINE_ENV,  # the job inherits sml's environment
        },
        port=port,
        poll_s=0.5,
        cancel_wait_s=30,
    )
    return SmlLauncher(SmlLaunchSpec(), cluster=cluster, ssh=ssh_config())


@pytest.mark.slurm
@pytest.mark.engine
@pytest.mark.timeout(900)  # an engine start (ready timeout 600 s)
def test_current_sml_serves_the_engine_gated_through_the_tunnel(
    engine_lock: None, no_leftover_jobs: None, tmp_path: Path
) -> None:
    sml = sml_launcher(tmp_path, "current", engine=f"{ENGINE_PYTHON} -m vllm.entrypoints.openai.api_server")
    engine_target = TARGET.model_copy(update={"extra_args": CPU_ENGINE_ARGS})
    deployment = sml.launch(
        engine_target, NGRAM, deployment_id="smltest.ngram.r0", directory=tmp_path / "dep"
    )
    try:
        user, org, name = deployment.served_model_name.split("/")  # parsed from `Served model name:`
        assert (user, org) == (ssh_config().user, "specgauge") and name.startswith("tiny-ngram-k3-")
        assert deployment.extra["sml_flags"] == "current" and deployment.extra["head_ip"]
        assert next(e for e in ledger.entries() if e["id"] == deployment.id)["job_id"] == deployment.job_id
        # {arch} was resolved before upload; the stand-in (like pyxis) would have killed the job otherwise.
        uploaded = Path(deployment.extra["environment_toml"]).read_text()
        assert "vllm_apertus-amd64.sqsh" in uploaded and "{arch}" not in uploaded
        waited = wait_ready(deployment, sml, timeout_s=600, poll_s=1)
        print(f"sml job {deployment.job_id} ready after {waited:.1f} s as {deployment.served_model_name}")
        metrics = httpx.get(deployment.metrics_url, timeout=10).text
        assert "vllm:spec_decode_num_drafts_total" in metrics  # /metrics of the head, through the tunnel
        assert sml.collect_facts(deployment).get("kv_cache_tokens", 0) > 0
    finally:
        sml.teardown(deployment)
    assert deployment.job_id not in live_job_ids()
    saved = json.loads((tmp_path / "dep" / "deployment.json").read_text())
    assert saved["extra"]["sml_flags"] == "current" and saved["teardown"].startswith("cancelled job")
    assert "Replica 0 head IP:" in (tmp_path / "dep" / "sml-log.out").read_text()
    assert "KV cache size" in (tmp_path / "dep" / "replica_0.out").read_text()


@pytest.mark.slurm
def test_legacy_sml_is_driven_with_legacy_flags(no_leftover_jobs: None, tmp_path: Path) -> None:
    sml = sml_launcher(tmp_path, "legacy")
    deployment = sml.launch(TARGET, PLAIN, deployment_id="smltest.legacy.r0", directory=tmp_path / "dep")
    try:
        assert sml.alive(deployment) is True
        assert deployment.extra["sml_flags"] == "legacy"
        command = (tmp_path / "dep" / "sml-command.txt").read_text()
        assert "--serving-framework vllm --slurm-environment" in command and "--framework " not in command
        log_out = Path(deployment.extra["remote_log"]).read_text()
        assert (
            "sml stand-in (legacy)" in log_out
            and f"Replica 0 head IP: {deployment.extra['head_ip']}" in log_out
        )
    finally:
        sml.teardown(deployment)
    assert sml.alive(deployment) is False


@pytest.mark.slurm
def test_wrong_generation_for_the_installed_sml_is_said_and_nothing_submitted(
    no_leftover_jobs: None, tmp_path: Path
) -> None:
    before = live_job_ids()
    # A legacy sml on the cluster, a launcher configured for current flags (with a current TOML).
    sml = sml_launcher(tmp_path, "legacy", flags="current")
    sml.cluster = sml.cluster.model_copy(
        update={"environment_toml": str(environment_toml(tmp_path, "current"))}
    )
    with pytest.raises(LaunchError, match="does not know the current flags") as caught:
        sml.launch(TARGET, PLAIN, deployment_id="smltest.wrongflags.r0", directory=tmp_path / "dep")
    assert "set sml_flags to legacy" in str(caught.value)
    # A current launcher handed a legacy TOML: refused before sml runs.
    sml = sml_launcher(tmp_path, "legacy", flags="current")
    with pytest.raises(InputError, match="mounts /ocfbin"):
        sml.launch(TARGET, PLAIN, deployment_id="smltest.wrongtoml.r0", directory=tmp_path / "dep2")
    assert live_job_ids() == before
    assert not any(e["id"].startswith("smltest.wrong") for e in ledger.entries())


@pytest.mark.slurm
def test_a_job_that_dies_on_the_node_is_reported_with_smls_log(
    no_leftover_jobs: None, tmp_path: Path
) -> None:
    sml = sml_launcher(tmp_path, "current")
    # What an unresolved {arch} does to a real job (pyxis): simulate a TOML the launcher did not resolve.
    sml.cluster = sml.cluster.model_copy(update={"arch": "{arch}"})
    with pytest.raises(LaunchError) as caught:
        sml.launch(TARGET, PLAIN, deployment_id="smltest.dies.r0", directory=tmp_path / "dep")
    assert "FAILED" in str(caught.value) and "still contains {arch}" in caught.value.log_tail
