#!/bin/bash
# The issue-40 table on a CUDA machine: the 8B-shaped fixture (LAYERS decoder layers at Llama-3.1-8B's full
# widths and vocabulary) through bench/scale.py --device "${DEVICE:-cuda}", 128 chunks of 512 calibration tokens.
# Usage: [OUT=dir] [LAYERS=4] [BUDGET_S=480] bash bench/scale_cuda.sh
# Wheels missing on the machine (gguf, llama-cpp-python, diskcache) may wait in .whl/; they are installed
# into /tmp/site first. Writes scale.txt, scale.json, gpu.csv (nvidia-smi once a second) and logs.tgz.
set -u
OUT=${OUT:-/tmp/qs-out}
LAYERS=${LAYERS:-4}
W=${WORK:-/tmp/qs}
mkdir -p "$W" "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
nproc; free -g | head -2
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -l 1 > "$OUT/gpu.csv" &
SMI=$!
t0=$(date +%s)
FX=${FIXTURE:-$W/fx}
[ -d "$FX" ] || python3 bench/make_8b_fixture.py "$FX" --layers "$LAYERS" || exit 1
left=$(( ${BUDGET_S:-480} - ($(date +%s) - t0) ))
# the first run holds the paths that matter most; the second what time is left for
timeout $(( left * 2 / 3 )) python3 bench/scale.py "$FX" --work "$W/scale" --no-llama --device "${DEVICE:-cuda}" --threads "$(nproc)" \
    --calib-ctx 512 --calib-chunks 128 --paths inspect,export,calibrate,gptq,awq+gptq,eval --json "$OUT/scale.json" \
    2>&1 | tee "$OUT/scale.txt"
left=$(( ${BUDGET_S:-480} - ($(date +%s) - t0) ))
[ "$left" -gt 30 ] && timeout "$left" python3 bench/scale.py "$FX" --work "$W/scale" --no-llama --device "${DEVICE:-cuda}" \
    --threads "$(nproc)" --calib-ctx 512 --calib-chunks 128 --paths awq,scan,best --json "$OUT/scale2.json" \
    2>&1 | tee -a "$OUT/scale.txt"
kill $SMI
tar czf "$OUT/logs.tgz" -C "$W/scale" $(cd "$W/scale" && ls *.log)
ls -la "$W/scale" "$OUT"
