"""SLURM job control from the login node (over SSH or on it): submit with sbatch, ask squeue and scontrol,
cancel with scancel. `squeue` and not `sacct`, which needs a database."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from specgauge.errors import LaunchError
from tasks.launch.ssh import Shell, SSHError, quote

ALIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING"})
GONE = "GONE"  # slurmctld no longer knows the job (it ended more than MinJobAge ago)
_JOB_ID = re.compile(r"^(\d+)(?:;\S+)?$")


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # a SLURM state (PENDING, RUNNING, FAILED, ...) or GONE
    node: str | None = None
    reason: str | None = None
    name: str | None = None

    @property
    def alive(self) -> bool:
        return self.state in ALIVE_STATES


def job_state(shell: Shell, job_id: str) -> JobState:
    """The job's state from squeue (all states, so that a just-ended job reads as ended, not missing)."""
    result = shell.run(f"squeue -h -t all -j {quote(job_id)} -o '%T|%N|%r|%j'", 30, idempotent=True)
    if result.rc == 0:
        line = result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""
        if line:
            state, node, reason, name = [*line.split("|"), "", "", ""][:4]
            return JobState(job_id, state.strip(), node.strip() or None, reason.strip() or None, name.strip())
        return JobState(job_id, GONE)
    if "Invalid job id" in result.stderr:
        return JobState(job_id, GONE)
    raise SSHError(f"squeue for job {job_id} failed (exit {result.rc}): {result.stderr.strip()[:500]}")


def job_details(shell: Shell, job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (empty when slurmctld no longer knows the job)."""
    result = shell.run(f"scontrol show job -o {quote(job_id)}", 30, idempotent=True)
    if result.rc != 0:
        return {}
    details = {}
    for token in result.stdout.split():
        key, sep, value = token.partition("=")
        if sep and key not in details:
            details[key] = value
    return details


def describe_end(shell: Shell, job_id: str) -> str:
    """One line on how a job ended, e.g. `job 42: FAILED (NonZeroExitCode), exit code 1:0, node vm`."""
    details = job_details(shell, job_id)
    if not details:
        return f"job {job_id}: no longer known to slurmctld"
    parts = [f"job {job_id}: {details.get('JobState', '?')}"]
    if details.get("Reason") and details["Reason"] != "None":
        parts[0] += f" ({details['Reason']})"
    if details.get("ExitCode"):
        parts.append(f"exit code {details['ExitCode']}")
    if details.get("NodeList") and details["NodeList"] != "(null)":
        parts.append(f"node {details['NodeList']}")
    return ", ".join(parts)


def cancel_job(shell: Shell, job_id: str, *, wait_s: float = 60.0, poll_s: float = 1.0) -> str:
    """scancel, then wait until the job has left the running/pending states. Returns what happened."""
    state = job_state(shell, job_id)
    if not state.alive:
        return f"job {job_id} already ended ({state.state})"
    cancelled = shell.run(f"scancel {quote(job_id)}", 30)
    if cancelled.rc != 0:
        state = job_state(shell, job_id)
        if not state.alive:  # it ended between the two calls
            return f"job {job_id} already ended ({state.state})"
        cancelled.check(f"scancel {job_id}")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        state = job_state(shell, job_id)
        if not state.alive and state.state != "COMPLETING":
            return f"cancelled job {job_id} ({state.state})"
        time.sleep(poll_s)
    return f"scancel sent to job {job_id}; still {state.state} after {wait_s:g} s"


def submit(shell: Shell, script_path: str, *, cwd: str) -> str:
    """`sbatch --parsable`; returns the job id."""
    result = shell.run(f"cd {quote(cwd)} && sbatch --parsable {quote(script_path)}", 60)
    result.check("sbatch")
    line = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    match = _JOB_ID.match(line)
    if not match:
        raise LaunchError(f"sbatch printed no job id: {result.stdout.strip()!r} {result.stderr.strip()!r}")
    return match.group(1)
