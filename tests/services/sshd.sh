#!/usr/bin/env bash
# A real OpenSSH server for the tests on 127.0.0.1:2222, with its own host key, configuration and a test
# client key (all under a scratch directory; the system's sshd configuration is not touched).
#   tests/services/sshd.sh start|stop|status
# Files the tests use: $scratch/client_ed25519 (private key), $scratch/known_hosts (the server's host key).
# Sessions get SLURM_CONF pointing at tests/services/slurm.sh's configuration.
set -euo pipefail

scratch="${SPECGAUGE_SSHD_DIR:-/var/tmp/specgauge-sshd}"
slurm_conf="${SPECGAUGE_SLURM_DIR:-/var/tmp/specgauge-slurm}/slurm.conf"
port="${SPECGAUGE_SSHD_PORT:-2222}"
config="$scratch/sshd_config"
pidfile="$scratch/sshd.pid"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

start() {
  if [ "$(id -u)" != 0 ]; then
    echo "sshd.sh: must run as root to start sshd" >&2
    exit 1
  fi
  [ -x /usr/sbin/sshd ] || { echo "sshd.sh: openssh-server is not installed (tests/services/install-system.sh)" >&2; exit 1; }
  mkdir -p "$scratch" /run/sshd
  chmod 700 "$scratch"
  [ -f "$scratch/host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C specgauge-test-host -f "$scratch/host_ed25519"
  [ -f "$scratch/client_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C specgauge-test-client -f "$scratch/client_ed25519"
  cp "$scratch/client_ed25519.pub" "$scratch/authorized_keys"
  chmod 600 "$scratch/authorized_keys"
  echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$scratch/host_ed25519.pub")" >"$scratch/known_hosts"
  cat >"$config" <<EOF
# Written by tests/services/sshd.sh: specgauge's test sshd.
Port $port
ListenAddress 127.0.0.1
HostKey $scratch/host_ed25519
PidFile $pidfile
AuthorizedKeysFile $scratch/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
ClientAliveInterval 30
MaxStartups 50:30:100
MaxSessions 50
SetEnv SLURM_CONF=$slurm_conf
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
  /usr/sbin/sshd -t -f "$config"
  if running; then
    echo "sshd: running on 127.0.0.1:$port"
    return
  fi
  /usr/sbin/sshd -f "$config" -E "$scratch/sshd.log"
  for _ in $(seq 50); do
    if running && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "sshd: running on 127.0.0.1:$port (key $scratch/client_ed25519)"
      return
    fi
    sleep 0.1
  done
  echo "sshd.sh: sshd did not come up; see $scratch/sshd.log" >&2
  exit 1
}

stop() {
  if running; then
    kill "$(cat "$pidfile")"
    rm -f "$pidfile"
  fi
  echo "sshd: stopped"
}

status() {
  if running; then
    echo "sshd: running on 127.0.0.1:$port"
  else
    echo "sshd: not running"
    return 1
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
