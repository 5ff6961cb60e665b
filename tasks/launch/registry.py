"""Launcher backends by the spec's launcher kind.

A backend is one module whose launcher class is decorated with `@register`; `BACKENDS` says which module
holds each kind, so that a kind's module (and what it imports: paramiko for the clusters) is imported only
when that kind is used. Adding a backend: its spec class in experiments/spec.py, its module, one line here.
"""

from __future__ import annotations

import importlib
from typing import TypeVar

from experiments.spec import ExperimentSpec
from tasks.launch.config import LauncherConfig
from tasks.launch.protocol import Launcher

BACKENDS: dict[str, str] = {
    "local": "tasks.launch.local",
    "endpoint": "tasks.launch.endpoint",
    "slurm": "tasks.launch.slurm",
    "sml": "tasks.launch.sml",
}

_REGISTERED: dict[str, type[Launcher]] = {}
L = TypeVar("L", bound=type)


def register(cls: L) -> L:
    """Class decorator: make a launcher class the backend of its `kind`."""
    kind = cls.kind  # type: ignore[attr-defined]
    if kind not in BACKENDS or BACKENDS[kind] != cls.__module__:
        raise RuntimeError(f"launcher kind {kind!r} of {cls.__qualname__} is not listed in BACKENDS")
    _REGISTERED[kind] = cls  # type: ignore[assignment]
    return cls


def launcher_class(kind: str) -> type[Launcher]:
    """The backend of a launcher kind, importing its module on first use."""
    if kind not in _REGISTERED:
        if kind not in BACKENDS:
            raise NotImplementedError(f"launcher kind {kind!r}")
        importlib.import_module(BACKENDS[kind])
    return _REGISTERED[kind]


def launcher_for(spec: ExperimentSpec, config: LauncherConfig | None = None) -> Launcher:
    """The launcher for a spec, with the saved settings its launcher section names already read
    (`blocks.resolve_launcher_config(spec.launcher)`; none needed for a local launcher)."""
    return launcher_class(spec.launcher.kind).from_spec(spec.launcher, config or LauncherConfig())
