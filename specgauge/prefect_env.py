"""Point Prefect at the repo's profiles before it is imported, unless the user chose otherwise."""

from __future__ import annotations

import os
from typing import Any

from specgauge.settings import REPO_ROOT, get_settings


def configure() -> None:
    os.environ.setdefault("PREFECT_PROFILES_PATH", str(REPO_ROOT / "profiles" / "profiles.toml"))
    os.environ.setdefault("PREFECT_PROFILE", "local")
    # Prefect's logging with every handler redacting secrets (specgauge.redact): console, API, worker logs.
    os.environ.setdefault("PREFECT_LOGGING_SETTINGS_PATH", str(REPO_ROOT / "profiles" / "logging.yml"))
    # Prefect's own state (ephemeral API database, local results) lives with specgauge's state, not in ~.
    os.environ.setdefault("PREFECT_HOME", str(get_settings().home / "prefect"))
    os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)
    os.environ.setdefault("SPECGAUGE_REPO", str(REPO_ROOT))


def redact_stored_parameters() -> None:
    """Prefect stores the parameters of every flow run in its database, a subflow's included (the campaign's
    deployment subflow gets the whole spec: target.env, extra_args, endpoint URLs): they pass through
    specgauge.redact first. The flow itself is called with the real values; only the stored copy is redacted.
    Imports prefect: call it where flows are defined (flows/__init__.py), not from configure()."""
    from prefect.flows import Flow

    from specgauge.redact import redact_data

    original = Flow.serialize_parameters
    if getattr(original, "redacted", False):
        return

    def serialize_parameters(self: Flow, parameters: dict[str, Any]) -> dict[str, Any]:
        return redact_data(original(self, parameters))

    serialize_parameters.redacted = True  # type: ignore[attr-defined]
    Flow.serialize_parameters = serialize_parameters  # type: ignore[method-assign]
