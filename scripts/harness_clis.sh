#!/usr/bin/env bash
# Install the agent CLIs that the harness tests drive (tests/harnesses/), at pinned
# versions, from the npm registry into a cache outside the repo, and print their paths:
#
#   claude=/root/.cache/tito/npm/node_modules/.bin/claude
#   codex=/root/.cache/tito/npm/node_modules/.bin/codex
#
# Both packages ship their native binary inside registry packages (Claude Code: the
# platform package its postinstall copies into place; Codex: the platform package its
# node launcher execs), so nothing is downloaded when they run. A second run with the
# pinned versions already there installs nothing (about a second). Needs node and npm;
# scripts/install.sh does not call this (the harness tests skip without the CLIs).
#
# TITO_HARNESS_NPM: the cache folder (default ~/.cache/tito/npm).
set -euo pipefail
CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
PREFIX="${TITO_HARNESS_NPM:-$HOME/.cache/tito/npm}"

command -v npm >/dev/null 2>&1 || { echo "harness_clis.sh: npm not found" >&2; exit 1; }

installed() {  # installed VERSION of package $1 (empty when absent)
    local manifest="$PREFIX/node_modules/$1/package.json"
    [ -f "$manifest" ] && node -p "require(process.argv[1]).version" "$manifest" || true
}

if [ "$(installed @anthropic-ai/claude-code)" != "$CLAUDE_CODE_VERSION" ] ||
        [ "$(installed @openai/codex)" != "$CODEX_VERSION" ] ||
        [ ! -x "$PREFIX/node_modules/.bin/claude" ] || [ ! -x "$PREFIX/node_modules/.bin/codex" ]; then
    mkdir -p "$PREFIX"
    [ -f "$PREFIX/package.json" ] || echo '{"name": "tito-harness-clis", "private": true}' \
        > "$PREFIX/package.json"
    # postinstall scripts stay on: Claude Code's copies its platform binary into bin/
    npm install --prefix "$PREFIX" --no-audit --no-fund --no-update-notifier \
        --loglevel=error --save-exact \
        "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
fi
echo "claude=$PREFIX/node_modules/.bin/claude"
echo "codex=$PREFIX/node_modules/.bin/codex"
