#!/bin/bash
# Issue 28 on the GPU machine: the trainer's acceptance run
# (bench/gpu_acceptance.py), then the whole product on the GPU
# (bench/gpu_product.py) if the time left allows, each under its own time
# limit so the call ends inside the device tool's 10 minutes with its files
# written. Item 1 comes first: it gets all the time it needs, and the product
# runs in this call only with PRODUCT_MIN_S left; else a second call runs it.
#
# Here, once:  python bench/gpu_product.py wheels .whl
# Device:      run(command="bash bench/gpu_session.sh", carry=[".whl"], timeout_s=600)
#              then, if the product did not fit: "bash bench/gpu_session.sh product"
#
# $OUT gets session.txt (GPU, driver, timings), acceptance.txt and .json,
# gpu_product.json, gpu_product_up.txt, gpu_product_ranks.txt.
# Arguments: what to run (both, acceptance or product; default both), and the
# seconds this script may take in all (default 570).
# A dry run off the GPU: PYTHON=<a Python with torch> ACCEPTANCE_ARGS=--cpu-smoke
# PRODUCT_ARGS="--allow-cpu --model tiny --steps 1500 --checkpoint-every 100".
set -u
T0=$(date +%s)
WHAT=${1:-both}
BUDGET=${2:-570}
PRODUCT_MIN_S=${PRODUCT_MIN_S:-200}  # what the product run needs, at least
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
left() { echo $((BUDGET - ($(date +%s) - T0))); }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.is_available() and torch.cuda.nccl.version())'
} > "$OUT/session.txt" 2>&1
cat "$OUT/session.txt"

# The control plane's wheels install while the GPU runs (CPU only).
( $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /tmp/pip.txt 2>&1; echo "pip exit $?" >> /tmp/pip.txt ) &
PIP=$!

if [ "$WHAT" != product ]; then
  # Its rows go to stderr as they are measured: a run cut short keeps them.
  timeout --signal=INT $(( $(left) - 15 )) $PY bench/gpu_acceptance.py \
    --json "$OUT/acceptance.json" ${ACCEPTANCE_ARGS:-} > "$OUT/acceptance.txt" 2>&1
  echo "acceptance: exit $? after $(( $(date +%s) - T0 )) s" | tee -a "$OUT/session.txt"
  tail -40 "$OUT/acceptance.txt"
fi

wait $PIP
cat /tmp/pip.txt >> "$OUT/session.txt"
LEFT=$(left)
if [ "$WHAT" = acceptance ]; then
  :
elif [ "$LEFT" -ge "$PRODUCT_MIN_S" ]; then
  PYTHONPATH=/tmp/site timeout --signal=INT $((LEFT - 10)) $PY bench/gpu_product.py \
    --out "$OUT" --end-timeout $((LEFT - 60)) ${PRODUCT_ARGS:-} 2>&1 | tail -25
  echo "product: exit ${PIPESTATUS[0]} after $(( $(date +%s) - T0 )) s" | tee -a "$OUT/session.txt"
else
  echo "product: not run, $LEFT s left (bash bench/gpu_session.sh product)" \
    | tee -a "$OUT/session.txt"
fi
