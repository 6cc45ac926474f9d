#!/usr/bin/env bash
# Set up Quant Studio in ./.venv (created if missing). Pass --dev to add the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Prefer a CPU build of torch when the machine has one at hand (small, no CUDA download);
# otherwise pip resolves torch normally (CUDA build on Linux, MPS build on macOS).
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "torch==2.13.0" 2>/dev/null || python -m pip install -q torch
fi
extra=""
[ "${1:-}" = "--dev" ] && extra="[dev]"
python -m pip install -q -e ".${extra}"
