"""Who measured what, where and when: facts recorded in every artifact."""

from __future__ import annotations

import hashlib
import platform
import socket
import subprocess
from datetime import UTC, datetime
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from specgauge.settings import REPO_ROOT


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc_stamp() -> str:
    """Compact UTC stamp for names: 20261130T164500Z."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


@lru_cache
def specgauge_version() -> str:
    try:
        return version("specgauge")
    except PackageNotFoundError:
        return "0+unknown"


@lru_cache
def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "--no-optional-locks",
                "-C",
                str(REPO_ROOT),
                "status",
                "--porcelain",
                "--untracked-files=no",
            ],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (rev or "unknown") + ("-dirty" if dirty else "")


def host_facts() -> dict[str, str | int]:
    import os

    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count() or 0,
    }


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tool_facts() -> dict[str, str]:
    return {"specgauge_version": specgauge_version(), "git_revision": git_revision()}
