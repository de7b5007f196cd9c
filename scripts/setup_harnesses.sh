#!/usr/bin/env bash
# Installs the five agent CLIs Polar runs as harnesses (Claude Code, Codex, Qwen Code, pi, Gemini CLI) at the
# exact versions pinned in gateway/harnesses/npm/package-lock.json, into <repo>/.harnesses/node_modules.
# Idempotent: does nothing when the installed lock file already matches. Skips quietly without npm.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1m[setup-harnesses]\033[0m %s\n' "$*"; }

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  log "npm/node not found; skipping the harness CLIs (their integration tests will be skipped)"
  exit 0
fi

src=gateway/harnesses/npm
dest=.harnesses
stamp="$dest/.polar-stamp-$(sha256sum "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -x "$dest/node_modules/.bin/claude" ]; then
  log "harness CLIs up to date ($dest/node_modules)"
  exit 0
fi

mkdir -p "$dest"
cp "$src/package.json" "$src/package-lock.json" "$dest/"
log "installing pinned harness CLIs into $dest (about 1.3 GB, ~40 s)"
start=$(date +%s)
# Claude Code and Qwen Code declare node>=22 but run on node 20; --engine-strict stays off on purpose.
# `npm ci` rejects this lock file (optional per-platform packages it never recorded), so use `npm install`,
# which still installs exactly the locked versions.
npm install --prefix "$dest" --no-save --no-audit --no-fund --loglevel=error >/dev/null
# Qwen Code ships ripgrep without the executable bit (its postinstall would set it); without it, it falls back
# to a slower built-in grep and prints a warning on every run.
find "$dest/node_modules/@qwen-code" -path '*/vendor/ripgrep/*' -name rg -type f -exec chmod +x {} + 2>/dev/null || true
rm -f "$dest"/.polar-stamp-*
touch "$stamp"
for bin in claude codex qwen pi gemini; do
  log "$bin $("$dest/node_modules/.bin/$bin" --version 2>&1 | head -1)"
done
log "done in $(( $(date +%s) - start )) s"
