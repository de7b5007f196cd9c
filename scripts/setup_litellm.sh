#!/usr/bin/env bash
# Create .venv-litellm: LiteLLM's proxy server, used only by bench/proxy_overhead as the comparison column.
#
# LiteLLM pins packages the main environment cannot share, so it gets a venv of its own in the repository
# root. Idempotent: a venv whose marker file records the same requirements is left alone. The benchmark looks
# for ``<repo>/.venv-litellm/bin/litellm`` and leaves the LiteLLM column out when it is absent.
#
# Usage: scripts/setup_litellm.sh
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

# 1.108.5 is the newest release whose [proxy] extra resolves from PyPI alone: later ones need
# litellm-proxy-extras 0.4.110.post1+ or a litellm-proxy package that PyPI does not carry.
REQS=("litellm[proxy]==1.108.5")
DIR="$ROOT/.venv-litellm"
MARKER="$DIR/.polar-requirements"
WANT="${REQS[*]}"

if [[ -x "$DIR/bin/litellm" && -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]]; then
  echo "$DIR is up to date"
  exit 0
fi
rm -rf "$DIR"
"$PYTHON" -m venv "$DIR"
"$DIR/bin/python" -m pip install --quiet --upgrade pip
"$DIR/bin/python" -m pip install --quiet "${REQS[@]}"
echo "$WANT" >"$MARKER"
echo "$DIR: ${REQS[*]}"
