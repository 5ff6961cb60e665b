"""Errors callers can catch by meaning. Each says what failed and where."""

from __future__ import annotations

from pathlib import Path


class SpecgaugeError(Exception):
    """Base of every error specgauge raises on purpose."""


class InputError(SpecgaugeError):
    """Bad input from a user: a file, a field, a value. Deterministic: never retried."""


class WorkloadError(InputError):
    """One problem in a workload file, located as FILE:LINE: field: message."""

    def __init__(self, path: Path | str, line: int, field: str, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        super().__init__(f"{path}:{line}: {field}: {message}")


class WorkloadFileError(InputError):
    """A workload file with one or more problems; `problems` lists them all."""

    def __init__(self, problems: list[WorkloadError]) -> None:
        self.problems = problems
        shown = "\n".join(str(p) for p in problems[:20])
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} problem(s) in workload input:\n{shown}{more}")


class SpecError(InputError):
    """An experiment spec that does not validate; the message names the file and field."""


class LaunchError(SpecgaugeError):
    """A deployment could not be started. `transient` says whether trying again may help."""

    def __init__(self, message: str, *, log_tail: str = "", transient: bool = False) -> None:
        self.log_tail = log_tail
        self.transient = transient
        super().__init__(message + (f"\n--- log tail ---\n{log_tail}" if log_tail else ""))


class EngineDied(LaunchError):
    """The engine process (or its job) ended before it was ready or while it was measured."""


class ReadinessTimeout(LaunchError):
    """The deployment did not become ready within the readiness check's timeout (launcher.ready_timeout_s)."""


class MetricsError(SpecgaugeError):
    """A /metrics text could not be scraped or parsed, or its counters are unusable."""


class CounterReset(MetricsError):
    """A counter went down between two snapshots: the server restarted and the cell is invalid."""


class ArtifactError(SpecgaugeError):
    """A raw artifact is missing, incomplete or would be overwritten."""
