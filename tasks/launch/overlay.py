"""vLLM source overlays: patched copies of a few vLLM files, mounted over the originals in a container.

`patches/*.patch` are unified diffs against vLLM's repository layout (`a/vllm/...`). `build_overlay`
applies the chosen ones to a copy of just the files they touch (GNU patch, no fuzz: a patch that does not
fit the given vLLM fails loudly, naming its hunks), writes the copies under OUT/<relpath> (relpath is
relative to the `vllm` package) and a manifest, OUT/overlay.json, which launchers read to add the mounts
and to record the overlay (patch names + sha256) in the deployment's provenance.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specgauge.errors import InputError
from specgauge.provenance import sha256_file, utc_now
from specgauge.settings import REPO_ROOT

PATCHES_DIR = REPO_ROOT / "patches"
# On the engine's PYTHONPATH: its sitecustomize loads the overlay's files in place of vLLM's (local engine).
LOCAL_OVERLAY_SITE = Path(__file__).resolve().parent / "local_overlay"
MANIFEST = "overlay.json"
_TARGET = re.compile(r"^\+\+\+ b/vllm/(\S+)", re.MULTILINE)
_HEADER = re.compile(r"^([A-Z][A-Za-z-]+):\s*(.+)$")
_VERSION = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.MULTILINE)


@dataclass(frozen=True)
class PatchFile:
    name: str
    path: Path
    sha256: str
    files: tuple[str, ...]  # relpaths inside the vllm package
    headers: dict[str, str]

    @property
    def description(self) -> str:
        return self.headers.get("Description", "")


@dataclass
class Overlay:
    """What `build_overlay` wrote; serialised as OUT/overlay.json."""

    root: str
    vllm_src: str
    vllm_version: str | None
    container_vllm_dir: str
    patches: list[dict[str, str]] = field(default_factory=list)  # {name, sha256}
    files: list[dict[str, str]] = field(default_factory=list)  # {relpath, sha256, original_sha256}
    created_at: str = ""

    def mounts(self, root: str | None = None) -> list[str]:
        """`<root>/<relpath>:<container vllm dir>/<relpath>` for each file (root: where the copies are)."""
        base = (root or self.root).rstrip("/")
        return [f"{base}/{f['relpath']}:{self.container_vllm_dir}/{f['relpath']}" for f in self.files]

    def provenance(self, root: str | None = None) -> dict[str, Any]:
        return {
            "patches": self.patches,
            "files": self.files,
            "vllm_version": self.vllm_version,
            "mounts": self.mounts(root),
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_patch(path: Path) -> PatchFile:
    text = path.read_text()
    files = tuple(dict.fromkeys(_TARGET.findall(text)))
    if not files:
        raise InputError(f"{path}: no '+++ b/vllm/...' file header: not a patch against vLLM's layout")
    headers: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith(("--- ", "diff ")):
            break
        if match := _HEADER.match(line):
            headers[match.group(1)] = match.group(2).strip()
    return PatchFile(path.stem, path, sha256_file(path), files, headers)


def available_patches(directory: Path = PATCHES_DIR) -> dict[str, PatchFile]:
    return {p.stem: parse_patch(p) for p in sorted(Path(directory).glob("*.patch"))}


def find_vllm_package(src: Path) -> Path:
    """The `vllm` package directory from a site-packages dir, a repository checkout, or the package itself."""
    src = Path(src).expanduser().resolve()
    for candidate in (src / "vllm", src):
        if (candidate / "__init__.py").exists() and (candidate / "v1").is_dir():
            return candidate
    raise InputError(f"{src}: no vLLM package here (expected vllm/__init__.py and vllm/v1/ under it)")


def vllm_version(package: Path) -> str | None:
    for name in ("_version.py", "version.py"):
        path = package / name
        if path.exists() and (match := _VERSION.search(path.read_text(errors="replace"))):
            return match.group(1)
    return None


def _apply(patch: PatchFile, tree: Path) -> str:
    """Apply one patch inside `tree` (which holds vllm/<relpath> copies); return patch's report."""
    command = ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "-d", str(tree)]
    with open(patch.path, "rb") as fh:
        dry = subprocess.run([*command, "--dry-run"], stdin=fh, capture_output=True, text=True)
    if dry.returncode != 0:
        raise InputError(
            f"{patch.path}: does not apply to this vLLM ({patch.headers.get('Targets', 'targets not stated')}):\n"
            + (dry.stdout + dry.stderr).strip()
        )
    with open(patch.path, "rb") as fh:
        done = subprocess.run(command, stdin=fh, capture_output=True, text=True)
    if done.returncode != 0:  # pragma: no cover - the dry run said it would apply
        raise InputError(f"{patch.path}: failed to apply: {done.stdout}{done.stderr}")
    return done.stdout.strip()


def build_overlay(
    vllm_src: Path,
    out: Path,
    names: list[str] | None = None,
    *,
    container_vllm_dir: str = "/usr/local/lib/python3.12/dist-packages/vllm",
    patches_dir: Path = PATCHES_DIR,
) -> Overlay:
    """Write patched copies of the files the chosen patches (default: all) touch, and the manifest."""
    package = find_vllm_package(vllm_src)
    known = available_patches(patches_dir)
    chosen = names or sorted(known)
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise InputError(f"unknown patch(es) {', '.join(unknown)}; available: {', '.join(sorted(known))}")
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: not empty; give a new directory (an overlay is written once)")
    with tempfile.TemporaryDirectory(prefix="specgauge-overlay-") as tmp:
        tree = Path(tmp)
        originals: dict[str, str] = {}
        for name in chosen:
            for relpath in known[name].files:
                if relpath in originals:
                    continue
                source = package / relpath
                if not source.exists():
                    raise InputError(f"{known[name].path}: {source} does not exist in this vLLM")
                (tree / "vllm" / relpath).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, tree / "vllm" / relpath)
                originals[relpath] = sha256_file(source)
        for name in chosen:  # in order: later patches see earlier ones' changes
            _apply(known[name], tree)
        out.mkdir(parents=True, exist_ok=True)
        files = []
        for relpath, original in originals.items():
            target = out / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / "vllm" / relpath, target)
            files.append({"relpath": relpath, "sha256": sha256_file(target), "original_sha256": original})
    overlay = Overlay(
        root=str(out),
        vllm_src=str(package),
        vllm_version=vllm_version(package),
        container_vllm_dir=container_vllm_dir.rstrip("/"),
        patches=[{"name": n, "sha256": known[n].sha256} for n in chosen],
        files=files,
        created_at=utc_now(),
    )
    (out / MANIFEST).write_text(json.dumps(overlay.to_json(), indent=2) + "\n")
    return overlay


def load_overlay(directory: Path | str) -> Overlay:
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(path.read_text())
        overlay = Overlay(**data)
    except (OSError, json.JSONDecodeError, TypeError) as exc:
        raise InputError(
            f"{path}: not an overlay manifest written by `specgauge patches overlay` ({exc})"
        ) from None
    for entry in overlay.files:
        copy = Path(directory) / entry["relpath"]
        if not copy.exists() or sha256_file(copy) != entry["sha256"]:
            raise InputError(f"{copy}: missing or changed since the overlay was written")
    return overlay


@functools.lru_cache(maxsize=8)
def engine_vllm_package(engine_python: Path | str) -> Path:
    """The `vllm` package an engine Python imports (found without importing it; asked once per process, not
    at every launch)."""
    probe = "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"
    done = subprocess.run([str(engine_python), "-c", probe], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise InputError(f"{engine_python}: cannot find its vLLM: {done.stderr.strip()[-500:]}")
    return find_vllm_package(Path(done.stdout.strip()))


def engine_overlay(engine_python: Path | str, names: list[str], home: Path) -> Overlay:
    """The overlay of `names` for the embedded engine's own vLLM, built once under HOME/overlays/ (keyed by the
    vLLM and the patches' sha256) and reused by every later start."""
    package = engine_vllm_package(engine_python)
    known = available_patches()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"unknown patch(es) {', '.join(unknown)}; available: {', '.join(sorted(known))}")
    key_text = "|".join(
        [str(package), vllm_version(package) or "", *(f"{n}:{known[n].sha256}" for n in names)]
    )
    out = home / "overlays" / hashlib.sha256(key_text.encode()).hexdigest()[:16]
    if (out / MANIFEST).exists():
        return load_overlay(out)
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    overlay = build_overlay(package, partial, names, container_vllm_dir=str(package))
    overlay.root = str(out)  # where it lives once moved into place
    (partial / MANIFEST).write_text(json.dumps(overlay.to_json(), indent=2) + "\n")
    try:
        partial.rename(out)
    except OSError:  # another start built it first
        shutil.rmtree(partial, ignore_errors=True)
    return load_overlay(out)
