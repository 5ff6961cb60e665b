"""The local launcher's engine command: how it asks the engine to compile the model (no engine started)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from experiments.spec import LocalLaunchSpec, SpecError, TargetSpec, Variant, load_spec
from tasks.launch.local import LocalLauncher, sets_compilation

REPO = Path(__file__).resolve().parent.parent
TARGET = TargetSpec(model="models/tiny-target", served_model_name="tiny")
DRAFT = Variant(name="draft-k3", method="draft_model", k=3, draft_model="models/tiny-draft")


def engine_args(spec: LocalLaunchSpec, target: TargetSpec = TARGET, variant: Variant = DRAFT) -> list[str]:
    return LocalLauncher(spec, engine_python=Path(sys.executable)).command(target, variant, port=8000)[3:]


def test_the_default_keeps_vllms_compilation_and_eager_adds_enforce_eager() -> None:
    default = engine_args(LocalLaunchSpec())
    assert LocalLaunchSpec().compilation == "cached"
    assert not sets_compilation(default)
    eager = engine_args(LocalLaunchSpec(compilation="eager"))
    assert eager.count("--enforce-eager") == 1
    assert [a for a in eager if a != "--enforce-eager"] == default


@pytest.mark.parametrize(
    "own",
    [
        ["--enforce-eager"],
        ["-O3"],
        ["-O", "0"],
        ["--optimization-level", "2"],
        ["--compilation-config", '{"mode": 3}'],
        ['--compilation-config={"mode": 0}'],
        ["-cc.mode=none"],
    ],
)
def test_compilation_flags_in_the_targets_extra_args_win(own: list[str]) -> None:
    target = TARGET.model_copy(update={"extra_args": tuple(own)})
    args = engine_args(LocalLaunchSpec(compilation="eager"), target=target)
    assert any(args[i : i + len(own)] == own for i in range(len(args)))
    assert args.count("--enforce-eager") == own.count("--enforce-eager")


def test_other_flags_do_not_count_as_a_compilation_choice() -> None:
    variant = Variant(name="plain", extra_args=("--enable-prefix-caching", "--max-num-seqs", "8"))
    assert "--enforce-eager" in engine_args(LocalLaunchSpec(compilation="eager"), variant=variant)
    assert not sets_compilation(["--model", "/m/-O3", "--seed", "0", "--override-generation-config", "{}"])


def test_the_demo_spec_takes_the_default_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    assert load_spec(REPO / "experiments" / "demo.yaml").launcher.compilation == "cached"
    text = (REPO / "experiments" / "demo.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("  kind: local\n", "  kind: local\n  compilation: fast\n"))
    with pytest.raises(SpecError, match="compilation"):
        load_spec(bad)
    eager = tmp_path / "eager.yaml"
    eager.write_text(text.replace("  kind: local\n", "  kind: local\n  compilation: eager\n"))
    assert load_spec(eager).launcher.compilation == "eager"


def test_the_deployment_records_how_its_engine_was_compiled(home: Path, tmp_path: Path) -> None:
    """The choice reaches deployment.json (command and facts), which the warehouse keeps per deployment. The
    "engine" here is the application's own Python, which exits at once: nothing is served."""
    for compilation in ("eager", "vllm", "cached"):
        launcher = LocalLauncher(LocalLaunchSpec(compilation=compilation), engine_python=Path(sys.executable))
        deployment = launcher.launch(
            TARGET, DRAFT, deployment_id=f"c-{compilation}", directory=tmp_path / compilation
        )
        launcher.teardown(deployment)
        saved = json.loads((tmp_path / compilation / "deployment.json").read_text())
        assert saved["extra"]["compilation"] == compilation
        assert ("--enforce-eager" in saved["command"]) == (compilation == "eager")
        assert ("--enforce-eager" in (tmp_path / compilation / "command.txt").read_text()) == (
            compilation == "eager"
        )


def test_cached_turns_vllms_aot_cache_off_and_keeps_inductors_beside_vllms_cache() -> None:
    from tasks.launch.local import compile_cache_env

    assert compile_cache_env("vllm", {}) == {} and compile_cache_env("eager", {}) == {}
    fixed = compile_cache_env("cached", {"VLLM_CACHE_ROOT": "/c/vllm"})
    assert fixed == {"VLLM_USE_AOT_COMPILE": "0", "TORCHINDUCTOR_CACHE_DIR": "/c/vllm/torchinductor"}
    default = compile_cache_env("cached", {})
    assert default["TORCHINDUCTOR_CACHE_DIR"] == str(Path.home() / ".cache" / "vllm" / "torchinductor")
    # The same engine arguments as vLLM's default: only the environment differs.
    assert engine_args(LocalLaunchSpec(compilation="cached")) == engine_args(
        LocalLaunchSpec(compilation="vllm")
    )


def test_a_cached_launch_records_its_cache_and_the_targets_env_wins(home: Path, tmp_path: Path) -> None:
    target = TARGET.model_copy(update={"env": {"VLLM_CACHE_ROOT": str(tmp_path / "cache")}})
    launcher = LocalLauncher(LocalLaunchSpec(compilation="cached"), engine_python=Path(sys.executable))
    deployment = launcher.launch(target, DRAFT, deployment_id="c-cached", directory=tmp_path / "cached")
    launcher.teardown(deployment)
    extra = json.loads((tmp_path / "cached" / "deployment.json").read_text())["extra"]
    assert extra["compilation"] == "cached" and extra["VLLM_USE_AOT_COMPILE"] == "0"
    assert extra["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "torchinductor")
    own = target.model_copy(update={"extra_args": ("--enforce-eager",)})
    deployment = launcher.launch(own, DRAFT, deployment_id="c-own", directory=tmp_path / "own")
    launcher.teardown(deployment)
    extra = json.loads((tmp_path / "own" / "deployment.json").read_text())["extra"]
    assert extra["compilation"] == "extra_args" and "VLLM_USE_AOT_COMPILE" not in extra


def test_the_uniprocess_executor_takes_effect_on_the_cpu_and_is_recorded(home: Path, tmp_path: Path) -> None:
    """vLLM's CPU platform turns "uni" into "mp" unless VLLM_ENABLE_V1_MULTIPROCESSING is 0: the launcher
    sets it with "uni" (and only then), the caller's environment wins, and deployment.json records it."""
    from tasks.launch.local import uniprocess_env

    assert engine_args(LocalLaunchSpec())[-2:] == ["--distributed-executor-backend", "uni"]
    assert "--distributed-executor-backend" not in engine_args(LocalLaunchSpec(uniprocess_executor=False))
    assert uniprocess_env(["x", "--distributed-executor-backend", "uni"]) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0"
    }
    assert uniprocess_env(["x", "--distributed-executor-backend", "mp"]) == {}
    for uni in (True, False):
        launcher = LocalLauncher(LocalLaunchSpec(uniprocess_executor=uni), engine_python=Path(sys.executable))
        deployment = launcher.launch(TARGET, DRAFT, deployment_id=f"u-{uni}", directory=tmp_path / str(uni))
        launcher.teardown(deployment)
        extra = json.loads((tmp_path / str(uni) / "deployment.json").read_text())["extra"]
        assert extra.get("VLLM_ENABLE_V1_MULTIPROCESSING") == ("0" if uni else None)
