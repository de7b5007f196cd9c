#!/usr/bin/env bash
# Installs the agent programs Polar runs as harnesses: the npm CLIs at the exact versions pinned in
# gateway/harnesses/npm/package-lock.json, into <repo>/.harnesses/node_modules, and the Python agents, one
# virtual environment each from gateway/harnesses/python/<name>/requirements.txt, into <repo>/.harnesses/py/.
#
# Usage: scripts/setup_harnesses.sh [HARNESS ...]    (no argument: every harness)
#        scripts/setup_harnesses.sh --list           (the harness names it installs, one a line)
# HARNESS is a name as in task files (pi, opencode, aider, ...). scripts/setup.sh installs only pi (what
# `polar run` uses by default); `polar run --harness NAME` names this command when NAME is missing.
# Idempotent: installs only what is missing or pinned differently. Skips the npm CLIs quietly without npm.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1m[setup-harnesses]\033[0m %s\n' "$*"; }

have_npm=1
command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 || have_npm=0

src=gateway/harnesses/npm
dest=.harnesses
stamp="$dest/.polar-stamp-$(sha256sum "$src/package.json" "$src/package-lock.json" scripts/patch_opencode.py | sha256sum | cut -c1-16)"

# The npm harnesses: task-file name, npm package (as in $src/package.json), the executable it puts in .bin.
NPM_HARNESSES=(
  "claude-code @anthropic-ai/claude-code claude"
  "codex @openai/codex codex"
  "qwen-code @qwen-code/qwen-code qwen"
  "pi @mariozechner/pi-coding-agent pi"
  "gemini-cli @google/gemini-cli gemini"
  "opencode opencode-ai opencode"
  "cline cline cline"
  "continue @continuedev/cli cn"
)
# The Python agents: one folder each under gateway/harnesses/python, named as in task files.
PY_HARNESSES=()
for req in gateway/harnesses/python/*/requirements.txt; do
  [ -f "$req" ] && PY_HARNESSES+=("$(basename "$(dirname "$req")")")
done

npm_entry() {  # the NPM_HARNESSES entry of harness $1; nothing when it is not an npm harness
  local entry
  for entry in "${NPM_HARNESSES[@]}"; do
    if [ "${entry%% *}" = "$1" ]; then echo "$entry"; fi
  done
}
npm_package() { local e; e=$(npm_entry "$1"); e=${e#* }; echo "${e%% *}"; }
npm_bin() { local e; e=$(npm_entry "$1"); echo "${e##* }"; }

# opencode and cline ship their executable in per-platform optional packages (installed from the lock like any
# package) and pick it in a postinstall script that npm does not run. Do what those scripts do, locally only:
# opencode's bin/opencode.exe is a stub until the binary is linked there (the AVX2-less "baseline" build when the
# CPU lacks AVX2); cline's wrapper finds bin/.cline first (it would otherwise search node_modules at every start).
# opencode's executable is patched first so its shell tool waits for a command's output (scripts/patch_opencode.py).
link_platform_binaries() {
  local arch variant oc
  arch=$(node -p 'process.arch')
  variant=""
  [ "$arch" = x64 ] && ! grep -qw avx2 /proc/cpuinfo && variant="-baseline"
  if [ -d "$dest/node_modules/opencode-ai" ]; then
    oc="$dest/node_modules/opencode-linux-$arch$variant/bin/opencode"
    if [ -x "$oc" ]; then
      python3 scripts/patch_opencode.py "$oc" >/dev/null
      ln -f "$oc" "$dest/node_modules/opencode-ai/bin/opencode.exe"
    else
      log "warning: $oc missing; opencode will not run"
    fi
  fi
  if [ -x "$dest/node_modules/@cline/cli-linux-$arch/bin/cline" ]; then
    ln -f "$dest/node_modules/@cline/cli-linux-$arch/bin/cline" "$dest/node_modules/cline/bin/.cline"
  fi
}

# install_npm NAME...: the named npm CLIs, plus every one already installed (npm removes what package.json no
# longer names), from the full lock: npm keeps the locked version of every package the subset needs.
install_npm() {
  local name bin entry keep=() missing=() packages=() start
  for name in "$@"; do
    [ -x "$dest/node_modules/.bin/$(npm_bin "$name")" ] || missing+=("$name")
  done
  if [ -f "$stamp" ] && [ ${#missing[@]} = 0 ]; then
    log "harness CLIs up to date ($dest/node_modules: $*)"
    return 0
  fi
  for entry in "${NPM_HARNESSES[@]}"; do
    set -- $entry
    if [ -x "$dest/node_modules/.bin/$3" ] || [[ " ${missing[*]} " == *" $1 "* ]]; then
      keep+=("$1")
      packages+=("$2")
    fi
  done
  mkdir -p "$dest"
  cp "$src/package-lock.json" "$dest/"
  node -e '
    const fs = require("fs");
    const manifest = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    const wanted = new Set(process.argv.slice(3));
    manifest.dependencies = Object.fromEntries(Object.entries(manifest.dependencies).filter(([k]) => wanted.has(k)));
    fs.writeFileSync(process.argv[2], JSON.stringify(manifest, null, 2) + "\n");
  ' "$src/package.json" "$dest/package.json" "${packages[@]}"
  log "installing pinned harness CLIs into $dest: ${keep[*]} (pi alone ~200 MB, all ~2 GB)"
  start=$(date +%s)
  rm -f "$dest"/.polar-stamp-*
  # Claude Code and Qwen Code declare node>=22 but run on node 20; --engine-strict stays off on purpose.
  # `npm ci` rejects this lock file (optional per-platform packages it never recorded) and installs only all of
  # it, so use `npm install`, which still installs exactly the locked versions.
  npm install --prefix "$dest" --no-save --no-audit --no-fund --loglevel=error >/dev/null
  # Qwen Code ships ripgrep without the executable bit (its postinstall would set it); without it, it falls back
  # to a slower built-in grep and prints a warning on every run.
  find "$dest/node_modules/@qwen-code" -path '*/vendor/ripgrep/*' -name rg -type f -exec chmod +x {} + 2>/dev/null || true
  link_platform_binaries
  touch "$stamp"
  for name in "${keep[@]}"; do
    bin=$(npm_bin "$name")
    log "$bin $("$dest/node_modules/.bin/$bin" --version 2>&1 | head -1)"
  done
  log "done in $(( $(date +%s) - start )) s"
}

# The interpreter a Python agent's environment is built from. Without gateway/harnesses/python/<name>/python-version
# it is $HARNESS_PYTHON, else /usr/bin/python3 (sandboxes see /usr; a pyenv build under /root they do not). With one (a minor
# version, e.g. 3.12) it is that version, found on PATH or in pyenv; sandboxes see only system directories and
# .harnesses, so one outside /usr is copied once into .harnesses/py/.python/<version> (without its tests and
# site-packages) with its library path made relative ($ORIGIN), and the environment is built from the copy.
agent_python() {
  local dir=$1 ver py prefix copy
  ver=$( { tr -d '[:space:]' < "$dir/python-version"; } 2>/dev/null || true)
  if [ -z "$ver" ]; then  # the system Python: /usr is visible in every sandbox, a pyenv build under /root is not
    if [ -n "${HARNESS_PYTHON:-}" ]; then echo "$HARNESS_PYTHON"; elif [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else echo python3; fi
    return 0
  fi
  py=$(command -v "python$ver" 2>/dev/null || true)
  case "$py" in */shims/*) py="" ;; esac  # pyenv's shims run only the version pyenv has selected
  if [ -z "$py" ]; then
    py=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$ver".*/bin/"python$ver" 2>/dev/null | sort -V | tail -1 || true)
  fi
  [ -n "$py" ] || { log "no Python $ver found (PATH, pyenv) for $dir" >&2; return 1; }
  prefix=$("$py" -c 'import sys; print(sys.base_prefix)')
  case "$prefix" in /usr|/usr/*) echo "$py"; return 0 ;; esac
  copy="$dest/py/.python/$("$py" -c 'import platform; print(platform.python_version())')"
  if [ ! -x "$copy/bin/python$ver" ]; then
    mkdir -p "$copy"
    (cd "$prefix" && tar cf - --exclude="lib/python$ver/test" --exclude="lib/python$ver/site-packages/*" \
      --exclude="lib/python$ver/idlelib" --exclude="lib/python$ver/tkinter" bin lib include) | tar xf - -C "$copy"
    if ! command -v patchelf >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "installing system package: patchelf" >&2
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends patchelf >/dev/null
    fi
    patchelf --set-rpath '$ORIGIN/../lib' "$copy/bin/python$ver"
  fi
  echo "$(cd "$copy" && pwd -P)/bin/python$ver"
}

# Python agents: one virtual environment per agent, .harnesses/py/<name>, from the complete exact pins in
# gateway/harnesses/python/<name>/requirements.txt (installed --no-deps, so nothing but the pins lands).
install_python_agents() {
  local req name venv pstamp start py
  for name in "$@"; do
    req=gateway/harnesses/python/$name/requirements.txt
    venv="$dest/py/$name"
    # The stamp covers the interpreter choice too (python-version, when there is one).
    pstamp="$venv/.polar-stamp-$({ cat "$req"; cat "$(dirname "$req")/python-version" 2>/dev/null || true; } | sha256sum | cut -c1-16)"
    if [ -f "$pstamp" ]; then
      log "$name up to date ($venv)"
      continue
    fi
    start=$(date +%s)
    rm -rf "$venv"
    py=$(agent_python "$(dirname "$req")")
    if [ -x .venv/bin/uv ]; then  # uv (pinned in requirements.lock): ~10x faster than pip for these closures
      .venv/bin/uv venv -q --python "$py" "$venv"
      VIRTUAL_ENV="$venv" .venv/bin/uv pip install -q --no-deps -r "$req"
    else
      "$py" -m venv "$venv"
      "$venv/bin/python" -m pip install -q --no-deps --disable-pip-version-check -r "$req"
    fi
    touch "$pstamp"
    log "$name installed into $venv in $(( $(date +%s) - start )) s"
  done
}

if [ "${1:-}" = --list ]; then
  for entry in "${NPM_HARNESSES[@]}"; do set -- $entry; echo "$1"; done
  printf '%s\n' "${PY_HARNESSES[@]}"
  exit 0
fi
npm_wanted=()
py_wanted=()
if [ $# = 0 ]; then
  for entry in "${NPM_HARNESSES[@]}"; do set -- $entry; npm_wanted+=("$1"); done
  py_wanted=("${PY_HARNESSES[@]}")
else
  for name in "$@"; do
    if [ -n "$(npm_package "$name")" ]; then
      npm_wanted+=("$name")
    elif [ -f "gateway/harnesses/python/$name/requirements.txt" ]; then
      py_wanted+=("$name")
    else
      echo "setup_harnesses.sh: unknown harness $name; known: $(bash "$0" --list | tr '\n' ' ')" >&2
      exit 2
    fi
  done
fi
if [ ${#npm_wanted[@]} -gt 0 ]; then
  if [ "$have_npm" = 1 ]; then
    install_npm "${npm_wanted[@]}"
  else
    log "warning: npm/node not found; skipping the npm harness CLIs ${npm_wanted[*]} (install node 20+ with npm, then run this again; their integration tests are skipped)"
  fi
fi
[ ${#py_wanted[@]} = 0 ] || install_python_agents "${py_wanted[@]}"
