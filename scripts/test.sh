#!/usr/bin/env bash
# Sets everything up, then runs every check and the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
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

step "mypy --strict"
.venv/bin/mypy

step "pytest"
.venv/bin/python -m pytest "$@"
