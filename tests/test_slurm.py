"""The SLURM launcher against the real single-node SLURM (tests/services/slurm.sh) over the real sshd
(tests/services/sshd.sh): the embedded engine as a SLURM job, gated and measured through an SSH tunnel;
a dying job reported with its log; nothing left in squeue after a cancelled or crashed run."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from stand_ins.cluster import (
    CPU_ENGINE_ARGS,
    CPU_ENGINE_ENV,
    ENGINE_PYTHON,
    REPO,
    ensure_services,
    live_job_ids,
    ssh_config,
)

from experiments.plan import CellPlan
from experiments.spec import SLO, LoadSpec, Sampling, SlurmLaunchSpec, TargetSpec, Variant, parse_spec
from specgauge.errors import EngineDied, InputError, SpecError
from specgauge.provenance import sha256_file
from tasks.health import wait_ready
from tasks.launch import deployed, ledger, reap_leftovers
from tasks.launch.cluster import resolve_cluster
from tasks.launch.config import ClusterConfig
from tasks.launch.local import free_port
from tasks.launch.overlay import build_overlay
from tasks.launch.slurm import SlurmLauncher
from tasks.launch.slurm_script import add_mounts, render_prefix, render_script

SLEEPER = "bash -c 'exec sleep 600' sleeper"  # a job that runs until cancelled, ignoring the engine's args
ENGINE = f"{ENGINE_PYTHON} -m vllm.entrypoints.openai.api_server"
TARGET = TargetSpec(model=str(REPO / "models" / "tiny-target"), served_model_name="tiny", max_model_len=1024)
ENGINE_TARGET = TARGET.model_copy(update={"extra_args": CPU_ENGINE_ARGS, "env": CPU_ENGINE_ENV})
PLAIN = Variant(name="plain")


# -- rendering and settings (no cluster needed) ---------------------------------------------------------
def test_script_quotes_every_value_that_reaches_the_shell() -> None:
    cluster = ClusterConfig(
        partition="debug",
        account="proj-1",
        time_limit="00:30:00",
        gpus_per_node=4,
        memory="200G",
        extra_sbatch=("--exclusive",),
        setup=("module load cuda",),
    )
    script = render_script(
        deployment_id="demo-1.plain.r0",
        job_name="specgauge-demo-1.plain.r0",
        run_dir="/scratch/u/specgauge/runs/demo-1.plain.r0.x",
        cluster=cluster,
        engine_command=["python", "-m", "vllm", "--speculative-config", '{"k": 3}', "$(reboot)"],
        env={"A_VAR": "it's $HOME; rm -rf /"},
    )
    lines = script.splitlines()
    for option in (
        "--partition=debug",
        "--account=proj-1",
        "--time=00:30:00",
        "--gpus-per-node=4",
        "--mem=200G",
    ):
        assert f"#SBATCH {option}" in lines
    assert "#SBATCH --exclusive" in lines and "module load cuda" in lines
    assert "export A_VAR='it'\"'\"'s $HOME; rm -rf /'" in lines
    assert lines[-1] == "exec python -m vllm --speculative-config '{\"k\": 3}' '$(reboot)'"
    assert "$" not in script.split("#SBATCH --job-name")[1].split("\n")[0]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("partition", "debug; rm -rf /", "only letters"),
        ("time_limit", "1 hour", "not a SLURM time"),
        ("memory", "lots", "--mem"),
        ("extra_sbatch", ("--exclusive --wrap=x",), "not an sbatch option"),
        ("remote_dir", "my dir", "paths may hold"),
        ("container_prefix", "srun --image={image}", "unknown placeholder"),
        ("env", {"BAD-NAME": "x"}, "environment variable name"),
    ],
)
def test_cluster_settings_are_validated(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterConfig(**{field: value})  # type: ignore[arg-type]


def test_spec_section_overrides_the_cluster_block_and_errors_name_the_field() -> None:
    block = ClusterConfig(partition="normal", account="a01", env={"X": "1"}, time_limit="02:00:00")
    spec = SlurmLaunchSpec(partition="debug", env={"Y": "2"})
    merged = resolve_cluster(spec, block)
    assert (merged.partition, merged.account, merged.time_limit) == ("debug", "a01", "02:00:00")
    assert merged.env == {"X": "1", "Y": "2"}
    demo = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    demo["launcher"] = {"kind": "slurm", "cluster": "alps", "partition": "debug", "time_limit": "00:20:00"}
    assert parse_spec(demo, "x.yaml").launcher.kind == "slurm"
    demo["launcher"]["time_limit"] = "twenty minutes"
    with pytest.raises(SpecError, match=r"x.yaml: launcher.time_limit: .*not a SLURM time"):
        parse_spec(demo, "x.yaml")
    demo["launcher"] = {"kind": "slurm", "partiton": "debug"}
    with pytest.raises(SpecError, match=r"launcher.partiton: unknown field"):
        parse_spec(demo, "x.yaml")


def test_container_prefix_and_environment_mounts() -> None:
    template = "srun --environment={environment} --container-mounts={mounts} --container-writable"
    assert render_prefix(template, mounts=[], environment=None) == "srun --container-writable"
    assert (
        render_prefix(template, mounts=["/o/a.py:/v/a.py", "/o/b.py:/v/b.py"], environment="/s/env.toml")
        == "srun --environment=/s/env.toml --container-mounts=/o/a.py:/v/a.py,/o/b.py:/v/b.py --container-writable"
    )
    toml = '# image for GH200\nimage = "/img/vllm-{arch}.sqsh"\nmounts = ["/capstor"]\n\n[env]\nA = "1"\n'
    merged = add_mounts(toml, ["/o/a.py:/v/a.py"], "env.toml")
    assert "# image for GH200" in merged
    assert tomllib.loads(merged)["mounts"] == ["/o/a.py:/v/a.py", "/capstor"]
    no_mounts = add_mounts('image = "x"\n\n[env]\nA = "1"\n', ["/o:/v"], "env.toml")
    assert tomllib.loads(no_mounts)["mounts"] == ["/o:/v"] and tomllib.loads(no_mounts)["env"] == {"A": "1"}
    with pytest.raises(InputError, match=r"env\.toml: invalid TOML"):
        add_mounts("mounts = [", ["/o:/v"], "env.toml")


# -- on the test cluster ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster_services() -> None:
    ensure_services("sshd", "slurm")


def launcher(tmp_path: Path, engine: str = SLEEPER, **changes: object) -> SlurmLauncher:
    settings: dict[str, object] = {
        "name": "test",
        "partition": "debug",
        "remote_dir": str(tmp_path / "cluster-home"),
        "engine_command": engine,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "port": free_port(),
        "poll_s": 0.5,
        "cancel_wait_s": 30,
    }
    spec_fields = {k: changes.pop(k) for k in list(changes) if k in ("overlay",)}
    settings.update(changes)
    return SlurmLauncher(SlurmLaunchSpec(**spec_fields), cluster=ClusterConfig(**settings), ssh=ssh_config())


@pytest.fixture
def no_leftover_jobs(cluster_services: None) -> Iterator[None]:
    before = live_job_ids()
    yield
    leftover = live_job_ids() - before
    assert not leftover, f"jobs left in squeue: {leftover}"


@pytest.mark.slurm
@pytest.mark.engine
@pytest.mark.timeout(900)  # an engine start (ready timeout 600 s) and a cell
def test_engine_runs_as_a_slurm_job_gated_and_measured_through_the_tunnel(
    engine_lock: None, no_leftover_jobs: None, tmp_path: Path
) -> None:
    from tasks.cell import run_cell
    from workloads.schema import load_corpus

    slurm = launcher(tmp_path, ENGINE)
    deployment = slurm.launch(
        ENGINE_TARGET, PLAIN, deployment_id="slurmtest.plain.r0", directory=tmp_path / "dep"
    )
    try:
        assert deployment.job_id and deployment.job_id in live_job_ids()
        assert deployment.base_url.startswith("http://127.0.0.1:")  # the tunnel, not the node's port
        assert deployment.extra["tunnel"] and deployment.extra["port"] != int(
            deployment.base_url.rsplit(":", 1)[1]
        )
        entry = next(e for e in ledger.entries() if e["id"] == deployment.id)
        assert entry["job_id"] == deployment.job_id and entry["remote"]["host"] == "127.0.0.1"
        waited = wait_ready(deployment, slurm, timeout_s=600, poll_s=1)
        facts = slurm.collect_facts(deployment)
        print(f"engine job {deployment.job_id} ready after {waited:.1f} s; facts {facts}")
        assert facts.get("kv_cache_tokens", 0) > 0
        outcome = run_cell(
            deployment,
            CellPlan("plain.r0.chat.c1", "chat", "closed", 1, None, "workloads/smoke.jsonl"),
            campaign_id="slurmtest",
            repeat=0,
            corpus=load_corpus(REPO / "workloads" / "smoke.jsonl"),
            sampling=Sampling(max_tokens=16),
            load=LoadSpec(
                concurrencies=(1,), requests=2, warmup=0, allow_short_cells=True, request_timeout_s=120
            ),
            slo=SLO(),
            cells_dir=tmp_path / "cells",
        )
        assert outcome.status == "ok", outcome.summary.error
        assert outcome.summary.requests.ok == 2 and (outcome.summary.completion_tokens or 0) > 0
        meta = json.loads((outcome.path / "meta.json").read_text())
        assert meta["deployment"]["job_id"] == deployment.job_id and meta["deployment"]["launcher"] == "slurm"
    finally:
        slurm.teardown(deployment)
    assert deployment.job_id not in live_job_ids()
    assert slurm.alive(deployment) is False
    assert not any(e["id"] == deployment.id for e in ledger.entries())
    saved = json.loads((tmp_path / "dep" / "deployment.json").read_text())
    assert saved["teardown"].startswith(f"cancelled job {deployment.job_id}") and saved["status"] == "stopped"
    assert "KV cache size" in (tmp_path / "dep" / "engine.log").read_text()  # the job log, copied home
    assert (
        "--enforce-eager" in (tmp_path / "dep" / "job.sbatch").read_text()
    )  # the CPU engine settings reached it


@pytest.mark.slurm
@pytest.mark.engine
@pytest.mark.timeout(900)  # should end in seconds; a gate that waits its 600 s fails on its own message
def test_a_dying_engine_ends_the_gate_at_once_with_its_log(
    engine_lock: None, no_leftover_jobs: None, tmp_path: Path
) -> None:
    slurm = launcher(tmp_path, ENGINE)
    bogus = TargetSpec(model="/nonexistent/specgauge-model", served_model_name="bogus")
    deployment = slurm.launch(bogus, PLAIN, deployment_id="slurmtest.bogus.r0", directory=tmp_path / "dep")
    started = time.monotonic()
    try:
        with pytest.raises(EngineDied) as died:
            wait_ready(deployment, slurm, timeout_s=600, poll_s=0.5)
        print(f"engine died; the gate ended after {time.monotonic() - started:.1f} s (of a 600 s timeout)")
    finally:
        slurm.teardown(deployment)
    assert f"job {deployment.job_id}: FAILED" in died.value.log_tail
    assert "/nonexistent/specgauge-model" in died.value.log_tail  # the engine's own complaint
    assert deployment.status == "failed"


@pytest.mark.slurm
@pytest.mark.parametrize(
    "engine",
    [
        "/nonexistent/bin/python -m vllm",  # fails at once: usually seen by launch
        "bash -c 'sleep 3; exec /nonexistent/bin/python' engine",  # fails once running: seen by the gate
    ],
    ids=["at-once", "after-start"],
)
def test_a_job_that_fails_before_serving_is_reported_by_launch_or_the_gate(
    no_leftover_jobs: None, tmp_path: Path, engine: str
) -> None:
    # The job prints where it runs before it execs the engine, so squeue may still say RUNNING with that
    # line in the log when launch looks (launch returns; the gate then sees the job end), or the job may be
    # over already (launch raises). Either way: EngineDied naming the end and the engine's own complaint.
    slurm = launcher(tmp_path, engine)
    launched = None
    with pytest.raises(EngineDied) as died:
        launched = slurm.launch(
            TARGET, PLAIN, deployment_id="slurmtest.nopython.r0", directory=tmp_path / "dep"
        )
        try:
            wait_ready(launched, slurm, timeout_s=120, poll_s=0.5)
        finally:
            slurm.teardown(launched)
    where = "launch" if launched is None else "gate"
    print(f"reported by the {where}: {died.value}")
    assert "FAILED" in f"{died.value} {died.value.log_tail}"
    assert "/nonexistent/bin/python" in died.value.log_tail
    assert not any(e["id"] == "slurmtest.nopython.r0" for e in ledger.entries())


@pytest.mark.slurm
def test_cancelled_campaign_leaves_nothing_in_squeue(no_leftover_jobs: None, tmp_path: Path) -> None:
    slurm = launcher(tmp_path)
    job_id = None
    with (
        pytest.raises(KeyboardInterrupt),
        deployed(
            slurm, TARGET, PLAIN, deployment_id="slurmtest.cancel.r0", directory=tmp_path / "dep"
        ) as deployment,
    ):
        job_id = deployment.job_id
        assert job_id in live_job_ids()
        raise KeyboardInterrupt  # Ctrl-C in the middle of a campaign
    assert job_id not in live_job_ids()


@pytest.mark.slurm
def test_a_crashed_run_is_reaped_from_the_ledger(no_leftover_jobs: None, home: Path, tmp_path: Path) -> None:
    # `home`: a ledger of this test's own, since reaping this process's entries would also stop the
    # session's shared engines.
    slurm = launcher(tmp_path)
    deployment = slurm.launch(TARGET, PLAIN, deployment_id="slurmtest.crash.r0", directory=tmp_path / "dep")
    # "Crash": the launching process's connection and memory are gone, no teardown ran.
    slurm.shell.close()
    assert deployment.job_id in live_job_ids()
    done = reap_leftovers(include_own=True)  # the "crashed" run is this process: its own entries count
    mine = [d for d in done if d["id"] == deployment.id]
    assert mine and mine[0]["outcome"].startswith(f"cancelled job {deployment.job_id}")
    assert deployment.job_id not in live_job_ids()
    assert not any(e["id"] == deployment.id for e in ledger.entries())


@pytest.mark.slurm
def test_overlay_is_uploaded_mounted_and_recorded(no_leftover_jobs: None, tmp_path: Path) -> None:
    overlay = build_overlay(
        REPO / ".engine-venv" / "lib" / "python3.11" / "site-packages",
        tmp_path / "overlay",
        ["apertus-image-token-id"],
    )
    # No containers here: an `env` prefix stands in for pyxis and shows which mounts the job was given.
    slurm = launcher(
        tmp_path,
        "bash -c 'echo MOUNTS=$SPECGAUGE_MOUNTS; exec sleep 600' sleeper",
        container_prefix="env SPECGAUGE_MOUNTS={mounts}",
        overlay=str(tmp_path / "overlay"),
    )
    deployment = slurm.launch(TARGET, PLAIN, deployment_id="slurmtest.overlay.r0", directory=tmp_path / "dep")
    try:
        recorded = deployment.extra["overlays"]
        patch = REPO / "patches" / "apertus-image-token-id.patch"
        assert recorded["patches"] == [{"name": "apertus-image-token-id", "sha256": sha256_file(patch)}]
        (mount,) = recorded["mounts"]
        source, target = mount.split(":")
        assert target == "/usr/local/lib/python3.12/dist-packages/vllm/v1/spec_decode/llm_base_proposer.py"
        assert sha256_file(source) == overlay.files[0]["sha256"]  # uploaded (same host: readable here)
        for _ in range(20):
            if "MOUNTS=" in slurm.log_tail(deployment):
                break
            time.sleep(0.5)
        assert f"MOUNTS={mount}" in slurm.log_tail(deployment)
    finally:
        slurm.teardown(deployment)
    saved = json.loads((tmp_path / "dep" / "deployment.json").read_text())
    assert saved["extra"]["overlays"]["patches"][0]["name"] == "apertus-image-token-id"


def test_overlay_without_a_container_is_refused(tmp_path: Path) -> None:
    build_overlay(REPO / ".engine-venv" / "lib" / "python3.11" / "site-packages", tmp_path / "ov")
    slurm = SlurmLauncher(
        SlurmLaunchSpec(overlay=str(tmp_path / "ov")),
        cluster=ClusterConfig(remote_dir=str(tmp_path / "remote")),
    )  # no SSH: commands would run here (the login node), but it fails before any sbatch
    with pytest.raises(InputError, match="an overlay needs a container"):
        slurm.launch(TARGET, PLAIN, deployment_id="slurmtest.nocontainer.r0", directory=tmp_path / "dep")


@pytest.mark.slurm
@pytest.mark.server
def test_settings_and_key_come_from_saved_blocks(cluster_services: None, tmp_path: Path) -> None:
    """Blocks saved to a real Prefect API, named in the spec, reach the cluster; the key stays a secret."""
    from prefect.testing.utilities import prefect_test_harness
    from stand_ins.cluster import SSHD_DIR

    from blocks import resolve_launcher_config
    from blocks.cluster_ssh import ClusterSSHBlock
    from blocks.slurm_cluster import SlurmClusterBlock

    key_text = (SSHD_DIR / "client_ed25519").read_text()
    with prefect_test_harness(server_startup_timeout=60):
        plain = ssh_config()
        ClusterSSHBlock(
            host=plain.host,
            port=plain.port,
            user=plain.user,
            private_key=key_text,
            known_hosts=str(plain.known_hosts),
        ).save("test-login", overwrite=True)
        SlurmClusterBlock(
            partition="debug", remote_dir=str(tmp_path / "remote"), ssh_block="test-login"
        ).save("test-cluster", overwrite=True)
        spec = SlurmLaunchSpec(cluster="test-cluster", time_limit="00:10:00")
        slurm = SlurmLauncher.from_spec(spec, resolve_launcher_config(spec))
        assert (slurm.cluster.partition, slurm.cluster.time_limit) == ("debug", "00:10:00")
        assert slurm.ssh is not None and slurm.ssh.block == "test-login"
        assert slurm.ssh.private_key is not None and key_text.splitlines()[1] not in repr(slurm.ssh)
        assert slurm.shell.run("squeue --version").stdout.startswith("slurm")
        slurm.shell.close()
        with pytest.raises(InputError, match="no SlurmClusterBlock named 'absent'"):
            resolve_launcher_config(SlurmLaunchSpec(cluster="absent"))
