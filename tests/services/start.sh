#!/usr/bin/env bash
# Start the services the tests need and that must run as daemons: munge, slurmctld/slurmd, sshd.
# Idempotent: each script checks what already runs. The Prefect server is started by the test session
# itself (tests/conftest.py), on a port and PREFECT_HOME of its own.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for service in slurm sshd; do
  if [ -x "$here/$service.sh" ]; then
    "$here/$service.sh" start
  fi
done
