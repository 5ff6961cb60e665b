"""patches/: each patch applies to the installed vLLM 0.32 (the engine venv), the patched files import,
the Apertus fallback does what it says, the NVTX range names are the documented contract, and
`specgauge patches overlay` writes the files and prints the mount list."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from cli.app import app
from specgauge.errors import InputError
from specgauge.provenance import sha256_file
from tasks.launch.overlay import available_patches, build_overlay, load_overlay

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / ".engine-venv" / "lib" / "python3.11" / "site-packages"
VLLM = SITE / "vllm"
NVTX_NAMES = ("specgauge:draft", "specgauge:verify", "specgauge:reject")

pytestmark = pytest.mark.skipif(
    not VLLM.is_dir(), reason="the engine venv (make engine) holds the vLLM to patch"
)


def test_every_patch_applies_to_the_installed_vllm(tmp_path: Path) -> None:
    patches = available_patches()
    assert set(patches) == {
        "apertus-image-token-id",
        "cpu-expand-dtype",
        "cpu-synthetic-acceptance",
        "nvtx-spec-decode",
    }
    for name, patch in patches.items():
        out = tmp_path / name
        overlay = build_overlay(SITE, out, [name])
        assert overlay.vllm_version == "0.32.0"
        assert overlay.patches == [{"name": name, "sha256": sha256_file(patch.path)}]
        assert [f["relpath"] for f in overlay.files] == list(patch.files)
        for entry in overlay.files:
            patched, original = out / entry["relpath"], VLLM / entry["relpath"]
            assert (
                entry["original_sha256"] == sha256_file(original) != entry["sha256"] == sha256_file(patched)
            )
            compile(patched.read_text(), str(patched), "exec")  # still valid Python
        assert load_overlay(out).patches == overlay.patches


def test_apertus_patch_changes_one_line_and_falls_back_to_image_token_id(tmp_path: Path) -> None:
    build_overlay(SITE, tmp_path, ["apertus-image-token-id"])
    relpath = "v1/spec_decode/llm_base_proposer.py"
    before, after = (VLLM / relpath).read_text().splitlines(), (tmp_path / relpath).read_text().splitlines()
    changed = [d for d in difflib.unified_diff(before, after, lineterm="", n=0) if d[:1] in "+-"]
    assert len(changed) == 4  # ---, +++, one line out, one line in
    assert changed[2][1:].strip() == "target_model.config.image_token_index"
    expression = changed[3][1:].split("#")[0].strip()

    def drafter_index(**config: int) -> int:
        return eval(expression, {}, {"target_model": SimpleNamespace(config=SimpleNamespace(**config))})

    assert drafter_index(image_token_id=7) == 7  # Apertus: only image_token_id
    assert drafter_index(image_token_index=3, image_token_id=7) == 3  # others: unchanged behaviour
    with pytest.raises(AttributeError):
        drafter_index()  # neither: fails as before, naming the attribute


def test_patched_modules_import_and_nvtx_ranges_are_noops_without_cuda(tmp_path: Path) -> None:
    """Load the patched files in place of vLLM's own (in the engine's Python, no GPU here)."""
    build_overlay(SITE, tmp_path)
    probe = f"""
import importlib.util, sys
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
proposer = load("vllm.v1.spec_decode.llm_base_proposer", "{tmp_path}/v1/spec_decode/llm_base_proposer.py")
v1 = load("vllm.v1.worker.gpu_model_runner", "{tmp_path}/v1/worker/gpu_model_runner.py")
v2 = load("vllm.v1.worker.gpu.model_runner", "{tmp_path}/v1/worker/gpu/model_runner.py")
assert hasattr(proposer, "SpecDecodeBaseProposer") and hasattr(v1, "GPUModelRunner") and hasattr(v2, "GPUModelRunner")
for module in (v1, v2):
    with module._specgauge_range("specgauge:draft"):
        pass
    assert module._specgauge_nvtx() is False
v2._specgauge_push("specgauge:verify"); v2._specgauge_pop()
print("ok")
"""
    engine_python = REPO / ".engine-venv" / "bin" / "python"
    done = subprocess.run([str(engine_python), "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_nvtx_range_names_are_the_documented_contract(tmp_path: Path) -> None:
    build_overlay(SITE, tmp_path, ["nvtx-spec-decode"])
    readme = (REPO / "patches" / "README.md").read_text()
    for relpath in ("v1/worker/gpu_model_runner.py", "v1/worker/gpu/model_runner.py"):
        text = (tmp_path / relpath).read_text()
        for name in NVTX_NAMES:
            assert text.count(f'"{name}"') == 1, (relpath, name)
            assert f"`{name}`" in readme
    v2 = (tmp_path / "v1/worker/gpu/model_runner.py").read_text()
    assert (
        v2.count("_specgauge_push(") == 2 and v2.count("_specgauge_pop()") == 2
    )  # definitions + one use each


def test_a_patch_that_does_not_fit_fails_naming_its_hunks(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "vllm"
    (fake / "v1" / "spec_decode").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    source = (VLLM / "v1/spec_decode/llm_base_proposer.py").read_text()
    drifted = source.replace(
        "target_model.config.image_token_index\n", "target_model.config.image_token_idx\n"
    )
    (fake / "v1/spec_decode/llm_base_proposer.py").write_text(drifted)
    with pytest.raises(
        InputError, match=r"(?s)apertus-image-token-id\.patch: does not apply .*Hunk #1 FAILED"
    ):
        build_overlay(tmp_path / "site", tmp_path / "out", ["apertus-image-token-id"])
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match=r"nvtx-spec-decode\.patch: .*does not exist in this vLLM"):
        build_overlay(tmp_path / "site", tmp_path / "out", ["nvtx-spec-decode"])
    with pytest.raises(InputError, match="unknown patch"):
        build_overlay(SITE, tmp_path / "out", ["no-such-patch"])
    with pytest.raises(InputError, match="no vLLM package here"):
        build_overlay(tmp_path, tmp_path / "out")


def test_overlay_command_writes_files_and_prints_the_mount_list(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "overlay"
    result = runner.invoke(
        app,
        [
            "patches",
            "overlay",
            "--vllm-src",
            str(SITE),
            "--out",
            str(out),
            "--site-packages",
            "/workspace/vllm",
        ],
    )
    assert result.exit_code == 0, result.output
    mounts = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert mounts == [
        f"{out}/v1/spec_decode/llm_base_proposer.py:/workspace/vllm/vllm/v1/spec_decode/llm_base_proposer.py",
        f"{out}/utils/cpu_triton_utils.py:/workspace/vllm/vllm/utils/cpu_triton_utils.py",
        f"{out}/v1/worker/gpu/model_runner.py:/workspace/vllm/vllm/v1/worker/gpu/model_runner.py",
        f"{out}/v1/worker/gpu_model_runner.py:/workspace/vllm/vllm/v1/worker/gpu_model_runner.py",
    ]
    manifest = json.loads((out / "overlay.json").read_text())
    assert [p["name"] for p in manifest["patches"]] == [
        "apertus-image-token-id",
        "cpu-expand-dtype",
        "cpu-synthetic-acceptance",
        "nvtx-spec-decode",
    ]
    assert manifest["container_vllm_dir"] == "/workspace/vllm/vllm" and manifest["vllm_version"] == "0.32.0"
    again = runner.invoke(app, ["patches", "overlay", "--vllm-src", str(SITE), "--out", str(out)])
    assert again.exit_code == 2 and "not empty" in again.output
    listed = runner.invoke(app, ["patches", "list"])
    assert (
        listed.exit_code == 0
        and "apertus-image-token-id" in listed.stdout
        and "nvtx-spec-decode" in listed.stdout
    )


def test_patch_files_are_plain_unified_diffs_that_gnu_patch_and_git_accept(tmp_path: Path) -> None:
    """The same files apply with the ordinary tools too (for users who patch an image by hand)."""
    tree = tmp_path / "tree"
    for patch in available_patches().values():
        for relpath in patch.files:
            (tree / "vllm" / relpath).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(VLLM / relpath, tree / "vllm" / relpath)
    for patch in available_patches().values():
        done = subprocess.run(
            ["git", "apply", "--check", str(patch.path)], cwd=tree, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
