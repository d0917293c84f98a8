#!/bin/bash
# The whole product on the GPU machine, in ONE device call of at most ten
# minutes, every part under its own time limit and each one explaining
# itself if it stops short:
#   1. what the machine offers the local fleet, first (kernel, /proc,
#      abstract Unix sockets, dcgmi, nvidia-smi, Python and torch);
#   2. the whole product (bench/gpu_product.py) with warm standbys, then
#      with standbys off (cold launches), a control plane of its own each;
#   3. DEMO_ARGS="--devices cuda --nodes 1 --spares 1" ./run as a new user
#      runs it, to the demo job's first step (bench/demo_first_step.py).
#
# Here, once:  python bench/gpu_product.py wheels .whl
# Device:      run(command="bash bench/gpu_session.sh", carry=[".whl"], timeout_s=600)
#
# $OUT gets 7 files: session.txt (the machine, the timings, each part's exit),
# gpu_product-warm.json/.txt, gpu_product-cold.json/.txt (checks, figures,
# and where everything stood if it failed), demo_first_step.json/.txt.
# Argument: the seconds this script may take in all (default 570).
# A dry run off the GPU (docs/performance.md): PYTHON=<a Python with torch
# and none of the control plane> PRODUCT_ARGS="--allow-cpu --model tiny"
# DEMO_DEVICES=cpu WHEELS=<wheels for that Python> bash bench/gpu_session.sh
set -u
T0=$(date +%s)
BUDGET=${1:-570}
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-.whl}  # the control plane's wheels for this Python
PRODUCT_LIMIT_S=${PRODUCT_LIMIT_S:-190}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { echo "$*" | tee -a "$OUT/session.txt"; }

# The control plane's wheels install while the machine is probed (CPU only).
( $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl > /tmp/pip.txt 2>&1; echo "pip exit $?" >> /tmp/pip.txt ) &
PIP=$!
{
  date -u
  uname -a
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import sys, torch; print("python", sys.version.split()[0], sys.executable, "prefix", sys.prefix); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.is_available() and torch.cuda.nccl.version())'
  command -v make || echo "make: not on PATH"
  $PY bench/product_dump.py
} >> "$OUT/session.txt" 2>&1
wait $PIP
cat /tmp/pip.txt >> "$OUT/session.txt"
cat "$OUT/session.txt"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# 2. The product, warm then cold (one call of gpu_product.py, --standbys
# both): each run stops itself at its limit, having written where it stood;
# `timeout` is the net under both. The demo keeps DEMO_MIN_S for itself.
DEMO_MIN_S=${DEMO_MIN_S:-130}
LIMIT=$(( ($(left) - DEMO_MIN_S - 20) / 2 ))
[ "$LIMIT" -gt "$PRODUCT_LIMIT_S" ] && LIMIT=$PRODUCT_LIMIT_S
if [ "$LIMIT" -ge 90 ]; then
  timeout --signal=INT --kill-after=20 $((2 * LIMIT + 20)) $PY bench/gpu_product.py \
    --out "$OUT" --standbys both --limit-s $LIMIT --steps 600 --checkpoint-every 100 \
    --start-timeout 150 --recover-timeout 120 --end-timeout 150 ${PRODUCT_ARGS:-} \
    > /tmp/product.txt 2>&1
  say "product (standbys on, then off; $LIMIT s each): exit $? after $(( $(date +%s) - T0 )) s"
  grep -E "^(--- the whole|check |[a-z ]{3,16} (pass|FAIL) |figures:|whole product)" \
    /tmp/product.txt | tee -a "$OUT/session.txt"
else
  say "product: not run, $(left) s left"
fi

# 3. ./run as a new user runs it, on this machine's Python: its prefix is the
# virtualenv ./run uses, with the Makefile's stamps (everything installed).
PREFIX=$($PY -c 'import sys; print(sys.prefix)')
VENV_DIR=$PREFIX
if ! touch "$PREFIX/.installed-stamp" "$PREFIX/.controlplane-stamp" "$PREFIX/.fleet-stamp" \
    2>/dev/null || [ ! -x "$PREFIX/bin/python" ]; then
  # A read-only prefix: a virtualenv of our own that sees its packages.
  VENV_DIR=/tmp/run-venv
  $PY -m venv --without-pip "$VENV_DIR"
  PKGS=$($PY -c 'import site; print(site.getsitepackages()[0])')
  echo "import site; site.addsitedir('$PKGS')" > \
    "$("$VENV_DIR/bin/python" -c 'import site; print(site.getsitepackages()[0])')/image.pth"
  touch "$VENV_DIR/.installed-stamp" "$VENV_DIR/.controlplane-stamp" "$VENV_DIR/.fleet-stamp"
fi
LIMIT=$(( $(left) - 15 ))
if [ "$LIMIT" -ge 60 ]; then
  timeout --signal=INT --kill-after=20 $((LIMIT + 10)) $PY bench/demo_first_step.py \
    --devices "${DEMO_DEVICES:-cuda}" --venv "$VENV_DIR" --limit-s $LIMIT --out "$OUT" \
    > /tmp/demo.txt 2>&1
  say "demo first step: exit $? after $(( $(date +%s) - T0 )) s (venv $VENV_DIR)"
  head -c 3000 /tmp/demo.txt
else
  say "demo first step: not run, $(left) s left"
fi
say "session: $(( $(date +%s) - T0 )) s in all"
