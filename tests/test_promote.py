"""Promoting a decision (tasks.promote): the deploy files are what the launchers render (the engine command of
tasks.launch.command, the SLURM launcher's job script, the sml launcher's command), no secret is written, the
promotion is written once, a refusal writes no files, and the nightly regression finds the latest approved
variant. No engine, server or cluster: the launchers' renderers are pure."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from artifacts import layout
from artifacts.documents import DecisionDocument, PromotionDocument
from artifacts.store import read_document
from experiments.plan import resolve_repo_path
from experiments.spec import ExperimentSpec, TargetSpec, Variant
from specgauge.errors import InputError
from tasks import promote
from tasks.launch.cluster import resolve_cluster
from tasks.launch.command import ENGINE_MODULE, served_name, vllm_args
from tasks.launch.config import ClusterConfig
from tasks.launch.local import resolve_local
from tasks.launch.slurm import SlurmLauncher
from tasks.launch.slurm_script import render_prefix
from tasks.launch.sml import framework_args, sml_command

SCHEDULE = [[1, 2, 3], [3, 256, 0]]
TARGET = {
    "model": "models/twin-target",
    "served_model_name": "twin",
    "max_model_len": 2048,
    "dtype": "float32",
}
EAGLE = {
    "name": "recommended",
    "method": "eagle3",
    "k": 3,
    "eagle_head": "models/twin-eagle3",
    "k_schedule": SCHEDULE,
}
NGRAM = {
    "name": "recommended",
    "method": "ngram",
    "k": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
    "k_schedule": [[1, 8, 4], [9, 256, 2]],
}
SLURM_LAUNCHER = {
    "kind": "slurm",
    "cluster": "clariden",
    "partition": "debug",
    "time_limit": "00:45:00",
    "env": {"VLLM_LOGGING_LEVEL": "INFO", "WANDB_API_KEY": "wandb-secret-value"},
}
CLUSTER = ClusterConfig(
    account="a-infra01",
    gpus_per_node=4,
    remote_dir="~/scratch/specgauge",
    container_prefix="srun --environment={environment}",
    environment_toml="envs/vllm.toml",
    served_org="infra",
)
HF_TOKEN = "hf_abcdefghijklmnopqrstuvwx"
API_KEY = "sk-0123456789abcdef0123"


def spec_of(variant: dict[str, Any], launcher: dict[str, Any] | None = None, **target: Any) -> ExperimentSpec:
    """A verification campaign's spec: plain and the recommended variant."""
    return ExperimentSpec.model_validate(
        {
            "name": "decision-verify",
            "target": {**TARGET, **target},
            "variants": [{"name": "plain"}, variant],
            "workloads": [{"file": "workloads/smoke.jsonl", "strata": ["code"]}],
            "load": {"concurrencies": [1, 4, 16]},
            "launcher": launcher or {"kind": "local"},
        }
    )


def decision_of(
    variant: dict[str, Any] | None, decision_id: str = "code-0123456789", **target: Any
) -> DecisionDocument:
    """A decision as analysis.verification writes one: the drafter in speculative_config resolved against the repo."""
    config = Variant.model_validate(variant).speculative_config() if variant else None
    if config and "model" in config:
        config["model"] = str(resolve_repo_path(config["model"]))
    return DecisionDocument(
        decision_id=decision_id,
        campaign_id="decision-verify-20261201T000000Z",
        source_campaign_id="decision-20261130T000000Z",
        workload="code",
        family=f"{variant['method']} {variant.get('eagle_head', '')}".strip() if variant else "none",
        method=variant["method"] if variant else "none",
        schedule=(variant or {}).get("k_schedule", [[1, 256, 0]]),
        speculative_config=config,
        variant=variant,
        target={**TARGET, **target},
        verification_spec="var/specs/decision-verify-code.yaml",
        fixed_k=3,
        tolerance=0.05,
        confidence=0.95,
        loads=[],
        outcome="confirmed",
        summary="eagle3 on code: CONFIRMED by launch",
    )


def exec_words(text: str) -> list[str]:
    """The words of a script's `exec` line (the engine command)."""
    line = next(line for line in text.splitlines() if line.startswith("exec "))
    return shlex.split(line)[1:]


def speculative_config_in(words: list[str]) -> Any:
    return json.loads(words[words.index("--speculative-config") + 1])


def comment_free(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def check_shell_syntax(text: str, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- the files --------------------------------------------------------------------------------------------
def test_eagle3_schedule_files_are_what_the_launchers_render(tmp_path: Path) -> None:
    spec = spec_of(EAGLE, SLURM_LAUNCHER)
    decision = decision_of(EAGLE)
    files = promote.deploy_files(decision, spec, cluster=CLUSTER)
    assert list(files) == [
        "speculative-config.json",
        "vllm-serve.sh",
        "variant.yaml",
        "slurm.sbatch",
        "sml.txt",
    ]
    variant, target = Variant.model_validate(EAGLE), TargetSpec.model_validate(TARGET)

    # vllm-serve.sh: tasks.launch.command's arguments, paths as a cluster launcher passes them (as written)
    serve = exec_words(files["vllm-serve.sh"])
    assert serve[:3] == ["python", "-m", ENGINE_MODULE]
    expected = vllm_args(
        target,
        variant,
        served_model_name=served_name(target, variant),
        host="0.0.0.0",
        port=8000,
        measure=False,
    )
    assert serve[3:] == expected == promote.serve_args(files)
    assert (
        "--served-model-name" in serve and serve[serve.index("--served-model-name") + 1] == "twin-recommended"
    )
    check_shell_syntax(files["vllm-serve.sh"], tmp_path, "vllm-serve.sh")

    # speculative-config.json: the config the engine is given, schedule included
    config = json.loads(files["speculative-config.json"])
    assert config == speculative_config_in(serve) == variant.speculative_config()
    assert config["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert config["method"] == "eagle3" and config["model"] == "models/twin-eagle3"

    # variant.yaml: a spec variant entry that round-trips the schedule
    entry = yaml.safe_load(files["variant.yaml"])
    assert Variant.model_validate(entry) == variant
    assert entry["k_schedule"] == SCHEDULE and entry["name"] == "recommended"

    # slurm.sbatch: the SLURM launcher's script; the spec's section over the cluster block, as the launcher does
    script = files["slurm.sbatch"]
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for option in ("--partition=debug", "--account=a-infra01", "--time=00:45:00", "--gpus-per-node=4"):
        assert f"#SBATCH {option}" in lines
    assert "#SBATCH --job-name=specgauge-code-0123456789" in lines
    assert "#SBATCH --output=scratch/specgauge/promoted/code-0123456789/log-%j.out" in lines
    assert "export VLLM_LOGGING_LEVEL=INFO" in lines and "export PYTHONUNBUFFERED=1" in lines
    assert (
        "WANDB_API_KEY" in script and "wandb-secret-value" not in script
    )  # named in a comment, not exported
    launcher = SlurmLauncher(spec.launcher, cluster=CLUSTER)
    prefix = shlex.split(
        render_prefix(launcher.cluster.container_prefix, mounts=[], environment="envs/vllm.toml")
    )
    assert prefix == ["srun", "--environment=envs/vllm.toml"]
    assert exec_words(script) == [*prefix, *launcher.engine_command(target, variant)]
    assert speculative_config_in(exec_words(script)) == config
    check_shell_syntax(script, tmp_path, "slurm.sbatch")

    # sml.txt: sml_command with the sml launcher's arguments; the served name's user is the login node's
    sml = files["sml.txt"]
    command = comment_free(sml)
    assert len(command) == 1 and '"$(id -un)"/infra/twin-recommended-code-0123456789' in command[0]
    words = shlex.split(command[0])
    served = "$(id -un)/infra/twin-recommended-code-0123456789"
    cluster = resolve_cluster(spec.launcher, CLUSTER)
    assert words == sml_command(
        cluster,
        environment="envs/vllm.toml",
        args=framework_args(target, variant),
        served=served,
        generation="current",
    )
    forwarded = shlex.split(words[words.index("--framework-args") + 1])
    assert forwarded == framework_args(target, variant) and speculative_config_in(forwarded) == config
    check_shell_syntax(sml, tmp_path, "sml.sh")


def test_ngram_schedule_on_the_sml_launcher_speaks_its_flag_generation(tmp_path: Path) -> None:
    launcher = {
        "kind": "sml",
        "sml_flags": "legacy",
        "environment_toml": "envs/legacy.toml",
        "served_org": "team",
    }
    spec = spec_of(NGRAM, launcher)
    files = promote.deploy_files(decision_of(NGRAM), spec)
    variant, target = Variant.model_validate(NGRAM), TargetSpec.model_validate(TARGET)

    config = json.loads(files["speculative-config.json"])
    assert config == {
        "num_speculative_tokens": 4,
        "method": "ngram",
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
        "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 256, 2]],
    }
    assert speculative_config_in(exec_words(files["vllm-serve.sh"])) == config
    entry = yaml.safe_load(files["variant.yaml"])
    assert Variant.model_validate(entry) == variant and entry["k_schedule"] == NGRAM["k_schedule"]

    words = shlex.split(comment_free(files["sml.txt"])[0])
    assert words == sml_command(
        resolve_cluster(spec.launcher, ClusterConfig()),
        environment="envs/legacy.toml",
        args=framework_args(target, variant),
        served="$(id -un)/team/twin-recommended-code-0123456789",
        generation="legacy",
    )
    assert "--serving-framework" in words and "--framework" not in words
    # no block was read: the files say that the launchers' defaults fill in the rest
    assert "no cluster block: the sml launcher's defaults" in files["sml.txt"]
    assert "no cluster block: the slurm launcher's defaults" in files["slurm.sbatch"]
    assert "#SBATCH --time=01:00:00" in files["slurm.sbatch"].splitlines()  # ClusterConfig's default
    check_shell_syntax(files["slurm.sbatch"], tmp_path, "slurm.sbatch")


def test_a_local_spec_serves_the_local_launchers_paths_and_says_the_cluster_files_take_defaults() -> None:
    spec = spec_of(EAGLE)
    files = promote.deploy_files(decision_of(EAGLE), spec)
    variant, target = Variant.model_validate(EAGLE), TargetSpec.model_validate(TARGET)
    serve = exec_words(files["vllm-serve.sh"])[3:]
    assert serve == vllm_args(
        target,
        variant,
        served_model_name="twin-recommended",
        host="0.0.0.0",
        port=8000,
        resolve=resolve_local,
        measure=False,  # the deployed command leaves out the measurement flag
    )
    config = json.loads(files["speculative-config.json"])
    assert config["model"] == resolve_local("models/twin-eagle3") and Path(config["model"]).is_absolute()
    for name in ("slurm.sbatch", "sml.txt"):
        assert "the spec's launcher is local: rendered with the" in files[name]
    assert "ENVIRONMENT.toml" in comment_free(files["sml.txt"])[0]


def test_nothing_secret_is_written() -> None:
    variant = {**EAGLE, "extra_args": ["--api-key", API_KEY, "--max-num-seqs", "64"]}
    spec = spec_of(variant, SLURM_LAUNCHER, env={"HF_TOKEN": HF_TOKEN}, extra_args=[f"--hf-token={HF_TOKEN}"])
    decision = decision_of(variant, env={"HF_TOKEN": HF_TOKEN}, extra_args=[f"--hf-token={HF_TOKEN}"])
    files = promote.deploy_files(decision, spec, cluster=CLUSTER)
    for name, text in files.items():
        for secret in (HF_TOKEN, API_KEY, "wandb-secret-value"):
            assert secret not in text, (name, secret)
    serve = exec_words(files["vllm-serve.sh"])
    assert serve[serve.index("--api-key") + 1] == promote.REDACTED
    assert f"--hf-token={promote.REDACTED}" in serve
    assert serve[serve.index("--max-num-seqs") + 1] == "64"  # what is not secret is kept
    assert "set HF_TOKEN" in files["vllm-serve.sh"]  # the name only, so the team knows to set it
    assert "export HF_TOKEN" not in files["slurm.sbatch"]


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (["--tokenizer", "models/tok", "--max-num-batched-tokens", "512"], True),
        (["--ssl-keyfile", "/etc/key.pem", "--enable-prefix-caching"], True),
        (["--api-key", "plain-words"], False),
        (["--password=hunter2"], False),
        (["--some-flag", "sk-abcdefghijklmnopqrstu"], False),
    ],
)
def test_only_secret_looking_arguments_are_redacted(args: list[str], kept: bool) -> None:
    out, replaced = promote.redact_args(args)
    assert (list(out) == args) is kept and (not replaced) is kept


def test_a_plain_decision_serves_the_verification_specs_plain_variant() -> None:
    spec = spec_of(EAGLE)
    files = promote.deploy_files(decision_of(None), spec)
    assert json.loads(files["speculative-config.json"]) is None
    assert "--speculative-config" not in exec_words(files["vllm-serve.sh"])
    assert Variant.model_validate(yaml.safe_load(files["variant.yaml"])) == spec.plain


def test_a_hot_swap_variant_is_deployed_without_the_dev_endpoints() -> None:
    variant = {**EAGLE, "hot_swap": True}
    files = promote.deploy_files(decision_of(variant), spec_of(variant))
    assert "--worker-extension-cls" not in exec_words(files["vllm-serve.sh"])
    assert "VLLM_SERVER_DEV_MODE" not in files["slurm.sbatch"]
    assert "hot_swap" not in yaml.safe_load(files["variant.yaml"])


def test_an_inconsistent_decision_is_refused() -> None:
    decision = decision_of(EAGLE).model_copy(
        update={"speculative_config": {"num_speculative_tokens": 5, "method": "eagle3"}}
    )
    with pytest.raises(InputError, match="is not its variant's"):
        promote.deploy_files(decision, spec_of(EAGLE))
    broken = decision_of(EAGLE).model_copy(update={"variant": {**EAGLE, "k": 1}})
    with pytest.raises(InputError, match="decision code-0123456789: variant"):
        promote.deploy_files(broken, spec_of(EAGLE))


# -- the promotion ----------------------------------------------------------------------------------------
def test_an_approval_writes_the_files_and_the_document_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    decision = decision_of(EAGLE)
    campaign = home / "raw" / decision.campaign_id
    spec = spec_of(EAGLE, SLURM_LAUNCHER)
    doc = promote.write_promotion(
        campaign, decision, spec, approved=True, approver="alice", note="ship it", via="cli", home=home
    )
    folder = home / "promoted" / decision.decision_id
    expected = promote.deploy_files(decision, spec)
    assert sorted(p.name for p in folder.iterdir()) == sorted(expected)
    for name, text in expected.items():
        assert (folder / name).read_text() == text
    assert (folder / "vllm-serve.sh").stat().st_mode & 0o111
    assert not [p for p in (home / "promoted").iterdir() if p.name.startswith(".")]  # no temporaries left

    path = layout.promotion_file(campaign, decision.decision_id)
    stored = read_document(path, PromotionDocument)
    assert stored == doc
    assert stored.approved and stored.approver == "alice" and stored.via == "cli" and stored.note == "ship it"
    assert stored.files == [f"promoted/{decision.decision_id}/{name}" for name in expected]
    assert all((home / f).is_file() for f in stored.files)
    assert stored.vllm_args == promote.serve_args(expected)
    assert stored.speculative_config == json.loads(expected["speculative-config.json"])
    assert stored.tool is not None and stored.tool.git_revision

    for approved in (True, False):
        with pytest.raises(InputError, match=str(path)):
            promote.write_promotion(
                campaign, decision, spec, approved=approved, approver="bob", note="", via="cli", home=home
            )
    assert read_document(path, PromotionDocument) == doc


def test_a_refusal_writes_no_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    decision = decision_of(NGRAM)
    campaign = home / "raw" / decision.campaign_id
    doc = promote.write_promotion(
        campaign,
        decision,
        spec_of(NGRAM),
        approved=False,
        approver="carol",
        note="gate failed on chat",
        via="prefect-ui",
        home=home,
    )
    assert not (home / "promoted").exists()
    stored = read_document(layout.promotion_file(campaign, decision.decision_id), PromotionDocument)
    assert stored == doc and not stored.approved and stored.files == [] and stored.vllm_args == []
    assert stored.note == "gate failed on chat" and stored.via == "prefect-ui"
    assert promote.promoted_variant(home) is None


def test_existing_promoted_files_block_an_approval_and_nothing_is_recorded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    decision = decision_of(EAGLE)
    campaign = home / "raw" / decision.campaign_id
    (home / "promoted" / decision.decision_id).mkdir(parents=True)
    with pytest.raises(InputError, match="promoted/code-0123456789 exists"):
        promote.write_promotion(
            campaign, decision, spec_of(EAGLE), approved=True, approver="a", note="", via="cli", home=home
        )
    assert not layout.promotion_file(campaign, decision.decision_id).exists()


def test_the_latest_approved_promotion_gives_the_nightly_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    assert promote.promoted_variant(home) is None  # no raw tree yet

    def answer(variant: dict[str, Any], decision_id: str, campaign: str, when: str, approved: bool) -> None:
        monkeypatch.setattr(promote, "utc_now", lambda: when)
        decision = decision_of(variant, decision_id).model_copy(update={"campaign_id": campaign})
        promote.write_promotion(
            home / "raw" / campaign,
            decision,
            spec_of(variant),
            approved=approved,
            approver="alice",
            note="",
            via="cli",
            home=home,
        )

    # Written out of time order, under campaigns whose names sort the other way round.
    answer(NGRAM, "code-bbbbbbbbbb", "a-campaign", "2026-12-03T10:00:00.000Z", True)
    answer(EAGLE, "code-aaaaaaaaaa", "z-campaign", "2026-12-01T10:00:00.000Z", True)
    answer(
        {**EAGLE, "k": 2, "k_schedule": [[1, 4, 2], [5, 256, 0]]},
        "code-cccccccccc",
        "m-campaign",
        "2026-12-05T10:00:00.000Z",
        False,
    )  # the latest answer, but a refusal

    latest = promote.promoted_variant(home)
    assert latest is not None and Variant.model_validate(latest) == Variant.model_validate(NGRAM)
    older = promote.promoted_variant(home, "code-aaaaaaaaaa")
    assert older is not None and older["k_schedule"] == SCHEDULE and older["method"] == "eagle3"
    assert promote.promoted_variant(home, "code-cccccccccc") is None
    assert promote.promoted_variant(home, "code-unknown000") is None
