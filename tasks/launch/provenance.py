"""What can change a deployment's results besides its variant, recorded in deployment.json's `provenance`
(artifacts.documents.ProvenanceFacts): the target's content hash, the engine's package lock, the overlays
applied and the hardware it ran on. Each fact is measured where the engine runs or recorded as absent with
the reason; none is guessed.

- **Target**: sha256 over the model folder's identity files (weights, config, tokenizer, chat template), in
  name order, each entering as `name\\0size\\0sha256(bytes)\\n`. Per-file hashes are cached in
  SPECGAUGE_HOME/cache/target-digests/ keyed by the folder's resolved path; a file whose size and mtime
  (ns) still match its cache entry is not read again, so a 140 GB target is read once, and a changed shard
  costs one shard. (A tool that rewrites a file keeping its size and mtime would defeat the cache: delete
  the cache file to force a full read.)
- **Environment**: the engine environment's installed distributions in `pip freeze` form (`freeze_text`),
  URL credentials redacted, hashed; the text is
  kept once per hash (artifacts.layout.environment_file) and in the warehouse's `environments`.
- **Overlays**: the patches (name, sha256) and patched files of tasks.launch.overlay; none applied is the
  sha256 of nothing.
- **Hardware**: CPU model, logical CPUs, physical cores; GPUs from `nvidia-smi --query-gpu` when it is on
  PATH (absent otherwise, with the reason).

The local launcher measures all four on this machine (the engine's). Cluster launchers and endpoints cannot
see the engine's files or host from here: `remote_provenance` records what is known (the staged overlay)
and why the rest is absent.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from artifacts import layout
from artifacts.documents import ProvenanceFacts
from specgauge.provenance import sha256_file
from specgauge.redact import redact_text

# What makes a target what it is (README.md and training cards are not: an edited card is the same model).
IDENTITY_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "*.bin",
    "*.pt",
    "*.gguf",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()  # an overlay record with nothing applied


class NoTargetWeights(FileNotFoundError):
    """A folder without config.json or weights: nothing that identifies a model."""


def target_files(directory: Path) -> list[Path]:
    """The files whose content is the target's identity, by name."""
    found = {f for pattern in IDENTITY_PATTERNS for f in Path(directory).glob(pattern) if f.is_file()}
    return sorted(found, key=lambda f: f.name)


def _cache_file(cache_dir: Path, directory: Path) -> Path:
    return cache_dir / f"{hashlib.sha256(str(directory).encode()).hexdigest()[:24]}.json"


def _read_cache(path: Path, directory: Path) -> dict[str, list[Any]]:
    """name -> [size, mtime_ns, sha256] as last hashed; empty when absent, unreadable or another folder's."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("path") != str(directory):
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def _write_cache(path: Path, directory: Path, files: dict[str, list[Any]]) -> None:
    """Best effort (a read-only home only costs a re-read next time); atomic, so readers never see half."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(directory), "files": files}, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass


def target_digest(directory: Path | str, cache_dir: Path | None) -> dict[str, Any]:
    """{sha256, files, bytes, rehashed, seconds} of a local model folder (the module docstring says how and
    what the cache trusts). Raises NoTargetWeights for a folder without config.json or weights."""
    started = time.perf_counter()
    directory = Path(directory).resolve()
    files = target_files(directory)
    if not any(f.suffix in _WEIGHT_SUFFIXES for f in files) or not (directory / "config.json").is_file():
        raise NoTargetWeights(f"{directory}: no config.json or no weight files (.safetensors, .bin, ...)")
    cache_path = _cache_file(cache_dir, directory) if cache_dir is not None else None
    cached = _read_cache(cache_path, directory) if cache_path is not None else {}
    entries: dict[str, list[Any]] = {}
    rehashed = 0
    for file in files:
        stat = file.stat()
        known = cached.get(file.name)
        if isinstance(known, list) and known[:2] == [stat.st_size, stat.st_mtime_ns]:
            entries[file.name] = known
        else:
            entries[file.name] = [stat.st_size, stat.st_mtime_ns, sha256_file(file)]
            rehashed += 1
    if cache_path is not None and (rehashed or set(cached) != set(entries)):
        _write_cache(cache_path, directory, entries)
    digest = hashlib.sha256()
    for name, (size, _, sha) in entries.items():
        digest.update(f"{name}\0{size}\0{sha}\n".encode())
    return {
        "sha256": digest.hexdigest(),
        "files": len(entries),
        "bytes": sum(size for size, _, _ in entries.values()),
        "rehashed": rehashed,
        "seconds": round(time.perf_counter() - started, 3),
    }


def target_record(model: str, local_dir: Path | str | None, cache_dir: Path | None) -> dict[str, Any]:
    """The target's provenance: its digest where `local_dir` is a readable model folder here, else absent
    with the reason (a hub id resolved by the engine, a folder without weights)."""
    if local_dir is None or not Path(local_dir).is_dir():
        return {"path": model, "absent": f"{model}: not a local folder (a hub id?): the engine resolves it"}
    try:
        return {"path": model, **target_digest(local_dir, cache_dir)}
    except (NoTargetWeights, OSError) as exc:
        return {"path": model, "absent": f"not hashed: {exc}"}


def site_packages(python: Path | str) -> list[Path]:
    """The site-packages folders of the environment `python` lives in (`<prefix>/bin/python` of a venv or an
    installation: `<prefix>/lib/python3.*/site-packages`), without running it."""
    prefix = Path(os.path.abspath(python)).parent.parent  # not resolved: a venv's python links to the base's
    return sorted(prefix.glob("lib/python3*/site-packages"))


def freeze_text(python: Path | str) -> str:
    """The engine environment's package lock in `pip freeze` form: `name==version` per installed
    distribution (`name @ url` for a direct-URL install), sorted, URL credentials and tokens redacted (the
    stored text is what is hashed). Read from the environment's site-packages, not by running its Python:
    a stand-in engine (tests) is an executable that serves whatever it is given, and `python -m pip` costs
    about 1.5 s a launch. Raises FileNotFoundError when `python` has no site-packages beside it."""
    folders = site_packages(python)
    if not folders:
        raise FileNotFoundError(f"no lib/python3*/site-packages beside {python}")
    lines = set()
    for dist in importlib.metadata.distributions(path=[str(folder) for folder in folders]):
        name = dist.metadata["Name"]
        if not name:
            continue
        direct = dist.read_text("direct_url.json")
        url = json.loads(direct).get("url") if direct else None
        editable = url and url.startswith("file:")
        lines.add(f"{name} @ {url}" if url and not editable else f"{name}=={dist.version}")
    return redact_text("".join(f"{line}\n" for line in sorted(lines, key=str.lower)))


def store_environment(text: str, deployment_directory: Path) -> str:
    """Keep `text` once under its sha256 (artifacts.layout.environment_file); returns the sha256. A file of
    that name already holds this very text: it is left as it is."""
    sha = hashlib.sha256(text.encode()).hexdigest()
    final = layout.environment_file(deployment_directory, sha)
    if final.exists():
        return sha
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-p{os.getpid()}")
    tmp.write_text(text)
    try:
        os.link(tmp, final)  # never overwrites: a concurrent writer of the same hash wrote the same text
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return sha


def environment_record(python: Path | str, deployment_directory: Path) -> dict[str, Any]:
    """The engine's package lock: its sha256 and package count, the text stored once per hash."""
    try:
        text = freeze_text(python)
    except OSError as exc:
        return {"python": str(python), "absent": f"no package lock: {exc}"}
    packages = sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))
    sha = store_environment(text, deployment_directory)
    return {"python": str(python), "sha256": sha, "packages": packages}


def overlay_record(overlays: dict[str, Any] | None) -> dict[str, Any]:
    """Patches and patched files as tasks.launch.overlay's `Overlay.provenance()` gives them (None: no
    overlay applied), with their combined sha256."""
    patches = list((overlays or {}).get("patches") or [])
    files = list((overlays or {}).get("files") or [])
    digest = hashlib.sha256()
    for patch in patches:
        digest.update(f"patch\0{patch.get('name')}\0{patch.get('sha256')}\n".encode())
    for file in files:
        digest.update(f"file\0{file.get('relpath')}\0{file.get('sha256')}\n".encode())
    return {"sha256": digest.hexdigest(), "patches": patches, "files": files}


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo on Linux, else the platform's word for it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def gpu_facts(timeout_s: float = 20) -> tuple[list[dict[str, str | int]] | None, str | None]:
    """(GPUs: name, driver, memory in MiB; None) or (None, why absent), from `nvidia-smi --query-gpu`."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi not on PATH"
    query = "index,name,driver_version,memory.total"
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        return (
            None,
            f"nvidia-smi failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-200:]}",
        )
    gpus: list[dict[str, str | int]] = []
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        index, name, driver, memory = parts
        gpus.append(
            {
                "index": int(index) if index.isdigit() else index,
                "name": name,
                "driver_version": driver,
                "memory_total_mib": int(memory) if memory.isdigit() else memory,
            }
        )
    if not gpus:
        return None, "nvidia-smi listed no GPU"
    return gpus, None


def hardware_record() -> dict[str, Any]:
    """This machine's CPU and GPUs (the local engine's host)."""
    gpus, why = gpu_facts()
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "cpu_cores": psutil.cpu_count(logical=False),
        "gpus": gpus,
        "gpus_absent": why,
    }


def local_provenance(
    *,
    model: str,
    local_dir: Path | str | None,
    engine_python: Path | str,
    deployment_directory: Path,
    overlays: dict[str, Any] | None,
    cache_dir: Path | None,
) -> dict[str, Any]:
    """All four facts for an engine running on this machine, validated as the document reads them."""
    record = {
        "target": target_record(model, local_dir, cache_dir),
        "environment": environment_record(engine_python, deployment_directory),
        "overlays": overlay_record(overlays),
        "hardware": hardware_record(),
    }
    return ProvenanceFacts.model_validate(record).model_dump(mode="json", exclude_none=True)


def remote_provenance(
    model: str, where: str, overlays: dict[str, Any] | None, *, overlays_known: bool = True
) -> dict[str, Any]:
    """For an engine this machine cannot look into (`where`: e.g. "on cluster node n1", "behind an endpoint
    specgauge did not launch"): the overlay staged for it (None: none staged; `overlays_known` False: it
    cannot be known), the rest absent with the reason."""
    reason = f"the engine runs {where}: not readable from the orchestrator, so not recorded"
    record = {
        "target": {"path": model, "absent": f"{model}: {reason}"},
        "environment": {"absent": reason},
        "overlays": overlay_record(overlays) if overlays_known else {"absent": reason},
        "hardware": {"absent": reason},
    }
    return ProvenanceFacts.model_validate(record).model_dump(mode="json", exclude_none=True)


def model_argument(command: list[str]) -> str | None:
    """The engine's `--model` value (tasks.launch.command.vllm_args puts it there)."""
    for i, arg in enumerate(command):
        if arg == "--model" and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None
