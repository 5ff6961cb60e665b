#!/usr/bin/env bash
# A real single-node SLURM for the tests: munged, slurmctld and slurmd on this host, configured under a
# scratch directory (no systemd here: daemons are started by hand and stopped by the PIDs recorded).
#   tests/services/slurm.sh start|stop|status
# Idempotent: `start` starts only what is not running; `stop` stops only what it started.
# Client commands need SLURM_CONF=$SPECGAUGE_SLURM_DIR/slurm.conf (sshd.sh passes it to SSH sessions).
set -euo pipefail

scratch="${SPECGAUGE_SLURM_DIR:-/var/tmp/specgauge-slurm}"
conf="$scratch/slurm.conf"
export SLURM_CONF="$conf"
node="$(hostname -s)"

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_state() { sinfo -h -n "$node" -o %T 2>/dev/null | head -1; }

write_conf() {
  local cpus mem
  cpus="$(nproc)"
  # RealMemory must not exceed what slurmd sees, or the node is drained: stay well below free memory.
  mem="$(free -m | awk '/^Mem:/ {print int($2 * 0.8)}')"
  mkdir -p "$scratch"/{state,spool,log,run}
  cat >"$conf" <<EOF
# Written by tests/services/slurm.sh: a single-node cluster for specgauge's tests.
ClusterName=ci
SlurmctldHost=${node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$scratch/state
SlurmdSpoolDir=$scratch/spool
SlurmctldPidFile=$scratch/run/slurmctld.pid
SlurmdPidFile=$scratch/run/slurmd.pid
SlurmctldLogFile=$scratch/log/slurmctld.log
SlurmdLogFile=$scratch/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=300
NodeName=${node} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
  if munge_ok; then
    return
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    echo "slurm.sh: creating a munge key"
    mkdir -p /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge_ok && return; sleep 0.1; done
  echo "slurm.sh: munged did not come up" >&2
  exit 1
}

start() {
  if [ "$(id -u)" != 0 ]; then
    echo "slurm.sh: must run as root to start munged/slurmctld/slurmd" >&2
    exit 1
  fi
  command -v slurmctld >/dev/null || { echo "slurm.sh: slurm-wlm is not installed (tests/services/install-system.sh)" >&2; exit 1; }
  start_munge
  write_conf
  if ! pid_alive "$scratch/run/slurmctld.pid"; then
    setsid slurmctld -D -i -f "$conf" </dev/null >>"$scratch/log/slurmctld.stdout" 2>&1 &
    echo $! >"$scratch/run/slurmctld.pid"
  fi
  if ! pid_alive "$scratch/run/slurmd.pid"; then
    setsid slurmd -D -f "$conf" </dev/null >>"$scratch/log/slurmd.stdout" 2>&1 &
    echo $! >"$scratch/run/slurmd.pid"
  fi
  for _ in $(seq 150); do
    case "$(node_state)" in
      idle | mixed | allocated) echo "slurm: node $node $(node_state) (SLURM_CONF=$conf)"; return ;;
    esac
    sleep 0.2
  done
  echo "slurm.sh: node $node not ready (state: $(node_state || true)); see $scratch/log/" >&2
  exit 1
}

stop_pid() {
  local pidfile="$1" pid
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

stop() {
  # Jobs first, so that no engine outlives the cluster.
  if pid_alive "$scratch/run/slurmctld.pid"; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    sleep 1
  fi
  stop_pid "$scratch/run/slurmd.pid"
  stop_pid "$scratch/run/slurmctld.pid"
  echo "slurm: stopped (munged left running: other services may use it)"
}

status() {
  local ok=0
  munge_ok && echo "munged: running" || { echo "munged: not running"; ok=1; }
  pid_alive "$scratch/run/slurmctld.pid" && echo "slurmctld: running" || { echo "slurmctld: not running"; ok=1; }
  pid_alive "$scratch/run/slurmd.pid" && echo "slurmd: running" || { echo "slurmd: not running"; ok=1; }
  if [ $ok = 0 ]; then
    echo "node $node: $(node_state || echo unknown) (SLURM_CONF=$conf)"
  fi
  return $ok
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
