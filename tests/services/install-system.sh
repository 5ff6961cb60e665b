#!/usr/bin/env bash
# System packages the test suite needs: a real single-node SLURM (slurm-wlm, munge), a real sshd, and
# Debian's headless chromium for rendering reports. Installs only what is missing; needs root (CI is root).
set -euo pipefail
need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || [ -x /usr/sbin/munged ] || need+=(munge)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)  # selenium drives the Prefect UI with it
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "missing system packages: ${need[*]} (run as root, or install them: apt-get install ${need[*]})" >&2
  exit 1
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
