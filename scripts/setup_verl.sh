#!/usr/bin/env bash
# Create .venv-verl: the real verl for the verl bridge's integration test (integration_tests/test_verl_bridge.py).
#
# verl pins packages the main environment cannot share (transformers < 5.11, tensordict, Ray), so it gets a venv of
# its own, never requirements.lock. verl itself is installed without its dependencies: its full set (vLLM or
# SGLang, flash-attn, wandb, tensorboard, peft, ...) is many gigabytes of GPU packages, while the modules the bridge
# and its test import (verl.experimental.agent_loop, verl.protocol and what they import) need only the packages
# below. torch is the local CPU build (a plain `torch` requirement would pull the multi-gigabyte CUDA one). This repo
# is installed into it without dependencies, plus what `polar_client` imports (gRPC, protobuf, OpenTelemetry,
# pydantic-settings: the versions of requirements.lock), so verl's process talks to Polar over gRPC.
#
# Measured (4 Dec 2026, 2-core machine): about 1.7 GB on disk (torch 754 MB, Ray 240 MB, pyarrow 170 MB,
# transformers 107 MB, pandas 84 MB), 3-4 minutes from the package index.
#
# Idempotent: a venv whose marker records the same requirements is left alone; the test skips without the venv.
# Usage: scripts/setup_verl.sh      PYTHON=python3.11 selects the interpreter (default: the main .venv's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -f "$ROOT/.venv/pyvenv.cfg" ]]; then
    PYTHON="$(sed -n 's/^home = //p' "$ROOT/.venv/pyvenv.cfg")/python3.11"
  else
    PYTHON="python3.11"
  fi
fi
DIR="$ROOT/.venv-verl"
VERL="verl==0.9.1"  # polar_train/bridges/verl.py VERL_VERSION
TORCH="torch==2.13.0"
# What verl.experimental.agent_loop and verl.protocol import, at versions verl 0.9.1 accepts.
VERL_IMPORTS=(
  "transformers==5.10.4" "tensordict==0.10.0" "hydra-core==1.3.8" "codetiming==1.4.0" "cachetools==8.0.2"
  "fastapi==0.165.0" "uvicorn==0.55.0"
)
# Shared with the main environment: the versions of requirements.lock (Ray's of requirements-ray.lock).
LOCKED=(numpy pydantic pillow datasets grpcio protobuf opentelemetry-api opentelemetry-sdk
  opentelemetry-instrumentation-grpc pydantic-settings PyYAML)

locked() {  # locked NAME...: NAME==VERSION as requirements.lock pins it
  local name
  for name in "$@"; do
    grep -i "^${name}==" "$ROOT/requirements.lock" | head -1 | cut -d' ' -f1
  done
}

want="$VERL $TORCH ${VERL_IMPORTS[*]} $(locked "${LOCKED[@]}" | tr '\n' ' ')$(sha256sum "$ROOT/requirements-ray.lock" | cut -c1-16)"
marker="$DIR/.polar-requirements"
if [[ -x "$DIR/bin/python" && -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
  echo "$DIR is up to date"
  exit 0
fi
start=$(date +%s)
rm -rf "$DIR"
"$PYTHON" -m venv "$DIR"
pip=("$DIR/bin/python" -m pip install --quiet)
"${pip[@]}" --upgrade pip
"${pip[@]}" "$TORCH"
"${pip[@]}" --no-deps "$VERL"
"${pip[@]}" "${VERL_IMPORTS[@]}" $(locked "${LOCKED[@]}")
# Separately: tensordict's helper pyvers asks for packaging < 26, Ray's lock pins 26.4 (pip warns; both work).
"${pip[@]}" ray==2.60.0 -c "$ROOT/requirements-ray.lock"
"${pip[@]}" --no-deps -e "$ROOT"
"$DIR/bin/python" -c "import verl.experimental.agent_loop, verl.protocol, polar_client, polar_train.bridges.verl"
echo "$want" >"$marker"
echo "$DIR ready in $(( $(date +%s) - start )) s, $(du -sh "$DIR" | cut -f1)"
