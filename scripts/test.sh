#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh --all: every harness, backend server, Docker, Chromium), then runs every
# check and the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --all
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "protobuf: buf lint, buf format, buf breaking against the last release, generated code up to date"
.venv/bin/buf lint
.venv/bin/buf format --diff --exit-code
# protos/released/polar-v1.binpb: the last released contracts (regenerate on release; see its README.md).
.venv/bin/buf breaking --against protos/released/polar-v1.binpb
.venv/bin/python scripts/gen_protos.py --check

step "ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

step "import contract: lint-imports ([tool.importlinter] in pyproject.toml)"
.venv/bin/lint-imports --no-cache

step "mypy --strict"
.venv/bin/mypy

step "pytest"
# Two workers, each taking whole files (module fixtures stay shared): most tests wait on real servers and CLIs,
# so two workers on two cores roughly halve the wall time. POLAR_TEST_WORKERS=0 runs in one process.
# --durations: the 30 slowest phases close the log, to keep the suite inside CI's time budget.
.venv/bin/python -m pytest -n "${POLAR_TEST_WORKERS:-2}" --dist loadfile --durations=30 "$@"
