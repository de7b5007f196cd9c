#!/usr/bin/env bash
# Installs what the real-Slurm test (integration_tests/test_cluster_slurm.py) and `polar cluster` need on this
# machine: Debian's slurm-wlm (slurmctld, slurmd and the client commands) and munge. Idempotent and quiet: nothing
# happens when they are there. Only as root with apt-get; otherwise it says what is missing (the test then skips,
# naming it). The test starts its own private munged/slurmctld/slurmd (integration_tests/support/slurm.py); no
# system Slurm is configured or started here.
set -euo pipefail
log() { printf '\033[1m[setup_slurm]\033[0m %s\n' "$*"; }

missing=()
for tool in slurmctld:slurm-wlm slurmd:slurm-wlm sbatch:slurm-wlm munged:munge; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || missing+=("${tool#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log "installing ${packages[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
else
  log "warning: missing ${packages[*]} (as root: apt-get install --no-install-recommends ${packages[*]}); the Slurm test will be skipped"
fi
