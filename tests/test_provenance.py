"""Provenance of everything that can change a result (issue 33, item 5): the target's content hash and its
cache, the engine's package lock stored once per hash, overlays and hardware in deployment.json, the
warehouse's columns, and the validity reason when two arms of one comparison differ in any of them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from analysis_fixtures import PlantedBuilder, profile
from warehouse_fixtures import aa_spec

from analysis.data import CampaignData, load_campaign
from analysis.validity import provenance_mismatches, validity_table
from artifacts import layout
from artifacts.documents import DeploymentFacts, ProvenanceFacts
from experiments.plan import DeploymentPlan
from tasks.launch import provenance as launch_provenance
from tasks.launch.base import Deployment
from warehouse.db import reader
from warehouse.ingest import ingest_raw
from warehouse.kinds.provenance import provenance_columns

REPO = Path(__file__).resolve().parent.parent
TINY_TARGET = REPO / "models" / "tiny-target"
PLAIN_TPOT = 0.020


@pytest.fixture
def target_copy(tmp_path: Path) -> Path:
    """A copy of the tiny target (17 MB) that a test may change."""
    return Path(shutil.copytree(TINY_TARGET, tmp_path / "tiny-target"))


def test_target_digest_is_stable_cached_and_changes_when_a_weight_file_changes(
    target_copy: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = launch_provenance.target_digest(target_copy, cache)
    assert first["rehashed"] == first["files"] >= 3 and len(first["sha256"]) == 64
    again = launch_provenance.target_digest(target_copy, cache)
    # the cache answered: same digest, no file read again
    assert again["sha256"] == first["sha256"] and again["rehashed"] == 0
    # without the cache the same bytes give the same digest: the cache stores, it does not decide
    assert launch_provenance.target_digest(target_copy, None)["sha256"] == first["sha256"]
    # a copy elsewhere is the same model
    assert (
        launch_provenance.target_digest(shutil.copytree(target_copy, tmp_path / "elsewhere"), cache)["sha256"]
        == first["sha256"]
    )

    # a training card is not the model's identity: editing it changes nothing
    (target_copy / "README.md").write_text("edited card\n")
    assert launch_provenance.target_digest(target_copy, cache)["sha256"] == first["sha256"]

    # one byte of the weights, same size: a new mtime makes the cache re-read that file only
    weights = target_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    changed = launch_provenance.target_digest(target_copy, cache)
    assert changed["sha256"] != first["sha256"] and changed["rehashed"] == 1
    assert changed["bytes"] == first["bytes"]

    # a tokenizer change is a change of model too
    tokenizer = target_copy / "tokenizer_config.json"
    tokenizer.write_text(tokenizer.read_text() + " ")
    assert launch_provenance.target_digest(target_copy, cache)["sha256"] != changed["sha256"]


def test_a_target_that_cannot_be_hashed_is_recorded_absent_with_its_reason(tmp_path: Path) -> None:
    hub = launch_provenance.target_record("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", tmp_path)
    assert hub.get("sha256") is None and "not a local folder" in hub["absent"]
    empty = tmp_path / "no-weights"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    record = launch_provenance.target_record(str(empty), empty, tmp_path)
    assert record.get("sha256") is None and "no weight files" in record["absent"]


def test_hardware_and_overlays_are_recorded_and_absence_is_not_emptiness() -> None:
    hardware = launch_provenance.hardware_record()
    assert hardware["cpus"] == os.cpu_count() and hardware["cpu_model"]
    if shutil.which("nvidia-smi") is None:  # this machine: recorded as absent, with why, never as []
        assert hardware["gpus"] is None and hardware["gpus_absent"] == "nvidia-smi not on PATH"
    else:
        assert hardware["gpus"] or hardware["gpus_absent"]
    none = launch_provenance.overlay_record(None)
    assert none == {"sha256": launch_provenance.EMPTY_SHA256, "patches": [], "files": []}
    patch = {"patches": [{"name": "cpu-synthetic-acceptance", "sha256": "ab" * 32}], "files": []}
    assert launch_provenance.overlay_record(patch)["sha256"] not in (launch_provenance.EMPTY_SHA256, None)


def test_a_cluster_or_endpoint_engine_records_what_it_can_and_why_the_rest_is_absent() -> None:
    staged = {"patches": [{"name": "cpu-synthetic-acceptance", "sha256": "cd" * 32}], "files": []}
    cluster = ProvenanceFacts.model_validate(
        launch_provenance.remote_provenance("/scratch/llama-70b", "on slurm node n1", staged)
    )
    assert (
        cluster.overlays.sha256 == launch_provenance.overlay_record(staged)["sha256"]
    )  # the overlay it staged is known
    assert (
        cluster.target.sha256 is None and cluster.environment.sha256 is None and cluster.hardware.cpus is None
    )
    for part in (cluster.target, cluster.environment, cluster.hardware):
        assert "on slurm node n1: not readable from the orchestrator" in (part.absent or "")
    endpoint = ProvenanceFacts.model_validate(
        launch_provenance.remote_provenance(
            "served", "behind the endpoint http://h:8000", None, overlays_known=False
        )
    )
    assert endpoint.overlays.sha256 is None and endpoint.overlays.absent  # unknowable, not "none applied"
    assert provenance_columns(endpoint) == dict.fromkeys(
        ("target_digest", "env_digest", "overlays_digest", "hardware")
    )


def test_pip_freeze_is_hashed_and_its_text_stored_once_per_hash(tmp_path: Path) -> None:
    campaign = tmp_path / "raw" / "c1"
    first_dir = layout.deployment_dir(campaign, "c1.plain.r0.l1")
    second_dir = layout.deployment_dir(campaign, "c1.ngram.r0.l1")
    first = launch_provenance.environment_record(sys.executable, first_dir)  # this venv's real package lock
    second = launch_provenance.environment_record(sys.executable, second_dir)
    assert first["sha256"] == second["sha256"] and first["packages"] > 10
    stored = list((campaign / layout.ENVIRONMENTS).iterdir())
    assert [p.name for p in stored] == [f"{first['sha256']}.txt"]  # one file for both deployments
    text = stored[0].read_text()
    assert "duckdb==" in text and f"pandera=={importlib.metadata.version('pandera')}" in text
    # an executable with no environment beside it (the tests' stand-in engine) is absent with the reason,
    # never an empty lock
    broken = launch_provenance.environment_record(tmp_path / "bin" / "standin", first_dir)
    assert broken.get("sha256") is None and "no lib/python3*/site-packages" in broken["absent"]


# ------------------------------------------------------------------------------------- planted campaigns


@dataclass
class ProvenanceBuilder(PlantedBuilder):
    """Plants provenance into every deployment: the real tiny target's digest, this machine's hardware,
    no overlay, and a package lock per variant (`locks`: variant -> pip freeze text, default the first)."""

    locks: dict[str, str] = field(default_factory=dict)
    default_lock: str = ""

    def deployment(self, slot: DeploymentPlan, launch: int = 1) -> Deployment:
        deployment = super().deployment(slot, launch)
        text = self.locks.get(slot.variant.name, self.default_lock)
        deployment.provenance = {
            "target": {"path": "models/tiny-target", **launch_provenance.target_digest(TINY_TARGET, None)},
            "environment": {
                "python": "/opt/engine/bin/python",
                "sha256": launch_provenance.store_environment(text, deployment.directory),
                "packages": len(text.splitlines()),
            },
            "overlays": launch_provenance.overlay_record(None),
            "hardware": launch_provenance.hardware_record(),
        }
        return deployment


@pytest.fixture(scope="module")
def lock_text() -> str:
    return launch_provenance.freeze_text(sys.executable)


def _plant(variant: str, repeat: int, workload: str, load: str):
    if variant == "ngram-k3":
        return profile(PLAIN_TPOT / 1.5, 0.5, tokens_per_chunk=2.0)
    return profile(PLAIN_TPOT, None)  # plain and the A/A arm serve alike


def _build(root: Path, name: str, locks: dict[str, str], default: str) -> tuple[Path, ProvenanceBuilder]:
    spec = aa_spec(name, repeats=2)
    builder = ProvenanceBuilder(root / "raw", spec=spec, plant=_plant, locks=locks, default_lock=default)
    return builder.build(root / "w.duckdb", gates=False), builder


def test_provenance_reaches_deployments_v_cells_and_environments_once_per_hash(
    tmp_path: Path, lock_text: str
) -> None:
    other = lock_text.replace("duckdb==", "duckdb==0.0.1+other\n# was duckdb==", 1)
    db, builder = _build(tmp_path, "prov-same", {"ngram-k3": other}, lock_text)
    # a second campaign with the same locks: the warehouse keeps each lock once
    _, second = _build(tmp_path, "prov-again", {"ngram-k3": other}, lock_text)
    report = ingest_raw(tmp_path / "raw", db)
    assert report.ok, report.as_dict()
    with reader(db) as con:
        envs = con.execute("SELECT env_digest, packages, freeze_text FROM environments ORDER BY 1").fetchall()
        cells = con.execute(
            "SELECT DISTINCT variant, target_digest, env_digest, overlays_digest, hardware FROM v_cells "
            "WHERE campaign_id = ? ORDER BY variant",
            [builder.campaign_id],
        ).fetchall()
    assert len(envs) == 2 and {e[2] for e in envs} == {lock_text, other}  # 2 locks, 12 deployments
    digests = {variant: env for variant, _, env, _, _ in cells}
    assert digests["plain"] == digests["plain-aa"] != digests["ngram-k3"]
    target = launch_provenance.target_digest(TINY_TARGET, None)["sha256"]
    assert {c[1] for c in cells} == {target} and {c[3] for c in cells} == {launch_provenance.EMPTY_SHA256}
    hardware = json.loads(cells[0][4])
    assert hardware["cpus"] == os.cpu_count() and "gpus" in hardware
    # the raw document carries it, and reads back through its model
    path = next((builder.campaign_dir / layout.DEPLOYMENTS).glob("*/deployment.json"))
    facts = DeploymentFacts.model_validate_json(path.read_text())
    assert facts.provenance is not None and facts.provenance.target.sha256 == target
    assert second.campaign_id != builder.campaign_id

    # a lock whose bytes are not what its name says is quarantined, naming the file
    forged = builder.campaign_dir / layout.ENVIRONMENTS / f"{'0' * 64}.txt"
    forged.write_text("torch==9.9\n")
    report = ingest_raw(tmp_path / "raw", db)
    with reader(db) as con:
        quarantined = con.execute("SELECT kind, artifact_key, reason FROM quarantine").fetchall()
        assert con.execute("SELECT count(*) FROM environments").fetchone()[0] == 2
    assert [(k, key) for k, key, _ in quarantined] == [("environments", "0" * 64)]
    assert "its sha256 is not its name" in quarantined[0][2]


def test_an_env_digest_difference_between_plain_and_the_variant_is_a_validity_reason(
    tmp_path: Path, lock_text: str
) -> None:
    same_db, same = _build(tmp_path / "same", "prov-equal", {}, lock_text)
    other = lock_text + "planted-package==1.0\n"
    differ_db, differ = _build(tmp_path / "differ", "prov-differ", {"ngram-k3": other}, lock_text)

    with reader(same_db) as con:
        equal = load_campaign(con, same.campaign_id)
    with reader(differ_db) as con:
        mismatched = load_campaign(con, differ.campaign_id)
    assert provenance_mismatches(equal) == []
    assert provenance_mismatches(mismatched) == [("ngram-k3", "plain", "env_digest", [0, 1])]

    before = validity_table(equal).row(0, named=True)
    after = validity_table(mismatched).row(0, named=True)
    assert "env_digest" not in before["reasons"]
    reason = "inconclusive: ngram-k3 and plain ran with a different env_digest (the engine's package lock) in r0, r1"
    assert reason in after["reasons"]
    assert after["verdict"] != "valid" and after["valid"] is False

    # With A/A arms shown to agree (planted: 0.999 and 1.001 over the two repeats), the equal campaign is
    # valid and the one whose arms ran different packages is inconclusive, for that reason alone.
    def agreeing(data: CampaignData) -> CampaignData:
        ratios = pl.Series("throughput_speedup", [0.999, 1.001][: data.aa.height])
        return replace(data, aa=data.aa.sort("repeat").with_columns(ratios))

    valid = validity_table(agreeing(equal)).row(0, named=True)
    assert valid["verdict"] == "valid", valid["reasons"]
    flagged = validity_table(agreeing(mismatched)).row(0, named=True)
    assert flagged["verdict"] == "inconclusive" and flagged["reasons"].startswith(reason)


def _recorded(provenance: dict[str, Any] | None) -> None:
    assert provenance is not None
    assert len(provenance["target"]["sha256"]) == 64 and provenance["target"]["files"] >= 3
    assert len(provenance["environment"]["sha256"]) == 64 and provenance["environment"]["packages"] > 50
    assert provenance["overlays"]["sha256"] and isinstance(provenance["overlays"]["patches"], list)
    hardware = provenance["hardware"]
    assert hardware["cpu_model"] and hardware["cpus"] >= 1
    assert hardware.get("gpus") or hardware.get("gpus_absent")  # a GPU list, or why there is none


@pytest.mark.engine
def test_the_real_engines_deployments_carry_all_four(demo_campaign: dict) -> None:
    directory = Path(demo_campaign["directory"])
    documents = sorted((directory / layout.DEPLOYMENTS).glob("*/deployment.json"))
    assert documents
    locks = set()
    for path in documents:
        facts = json.loads(path.read_text())
        if facts["status"] == "failed":
            continue
        _recorded(facts["provenance"])
        lock = facts["provenance"]["environment"]["sha256"]
        locks.add(lock)
        text = (directory / layout.ENVIRONMENTS / f"{lock}.txt").read_text()
        assert "vllm" in text.lower()  # the engine's own venv, not the orchestrator's
    assert len(locks) == 1  # one engine venv: one lock, stored once
    cell_meta = next((directory / layout.CELLS).glob("*/meta.json"))
    _recorded(json.loads(cell_meta.read_text())["deployment"]["provenance"])  # every cell copies it
    with reader() as con:
        rows = con.execute(
            "SELECT count(*), count(target_digest), count(env_digest), count(overlays_digest), count(hardware) "
            "FROM v_cells WHERE campaign_id = ?",
            [demo_campaign["campaign_id"]],
        ).fetchone()
        stored = con.execute("SELECT count(*) FROM environments WHERE env_digest = ?", [next(iter(locks))])
        assert stored.fetchone()[0] == 1
    assert rows[0] > 0 and len(set(rows)) == 1  # every cell has all four
