"""Point Prefect at the repo's profiles before it is imported, unless the user chose otherwise."""

from __future__ import annotations

import os

from specgauge.settings import REPO_ROOT, get_settings


def configure() -> None:
    os.environ.setdefault("PREFECT_PROFILES_PATH", str(REPO_ROOT / "profiles" / "profiles.toml"))
    os.environ.setdefault("PREFECT_PROFILE", "local")
    # Prefect's own state (ephemeral API database, local results) lives with specgauge's state, not in ~.
    os.environ.setdefault("PREFECT_HOME", str(get_settings().home / "prefect"))
    os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)
    os.environ.setdefault("SPECGAUGE_REPO", str(REPO_ROOT))
