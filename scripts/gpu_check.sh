#!/usr/bin/env bash
# Every GPU path of fusebench in about 5 minutes of device time, for a lent GPU machine that got
# a copy of this repository:
#   OUT=/some/dir bash scripts/gpu_check.sh
# Steps: `fusebench env`; `kernel ln2d --impl all` at 32x96x56x56 fwd+bwd in fp32 and bf16
# (L2-flushed step time vs graph-replayed device time, launch_bound events, Triton in
# cudagraphs mode too); `run efficientnet_b3 --channels-last --amp` at the model's standard
# batch in every mode (cudagraphs included) plus compile reduce-overhead and fused cudagraphs;
# NVML telemetry in the records. Then scripts/gpu_summary.py writes $OUT/summary.json and
# prints each issue-16 target as met / missed with its number.
# AMP: bf16 autocast (`--amp-dtype bfloat16`; plain `--amp` is fp16 on CUDA).
# Each step has its own time limit, a failing step does not stop the others, and a step that
# would start after BUDGET seconds is skipped (said in its log line).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fusebench-gpu-check}
BUDGET=${BUDGET:-300}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
FB="$PY -m fusebench"
T0=$SECONDS

# a bare machine: install the package itself when it does not import (deps from what is there)
if ! $PY -c "import fusebench.cli" >/dev/null 2>&1; then
    if $PY -c "import torch" >/dev/null 2>&1; then
        $PY -m pip install -q -e . --no-deps >"$OUT/pip.log" 2>&1
    else
        $PY -m pip install -q -e . >"$OUT/pip.log" 2>&1
    fi
    echo "== pip install: rc=$? (log $OUT/pip.log)"
fi

step() {  # step NAME SECONDS CMD...: run with a limit, log to $OUT/NAME.log, say how it went
    local name=$1 limit=$2; shift 2
    local used=$((SECONDS - T0))
    if [ "$used" -ge "$BUDGET" ]; then
        echo "== $name: skipped, ${used} s of the ${BUDGET} s budget used"
        return
    fi
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    tail -n 15 "$OUT/$name.log"
}

nvidia-smi -L 2>&1 | tee "$OUT/nvidia-smi.txt"
step env 40 $FB env --device cuda
$FB env --json --device cuda >"$OUT/env.json" 2>/dev/null

LN2D=(--shape 32,96,56,56 --direction fwdbwd --device cuda --warmup 5 --steps 20 --timeout 60)
for dt in float32 bfloat16; do
    step "kernel_ln2d_$dt" 70 $FB kernel ln2d --impl all --dtype "$dt" "${LN2D[@]}" \
        --out "$OUT/kernel_$dt"
    step "kernel_ln2d_${dt}_cudagraphs" 25 $FB kernel ln2d --impl triton,function -m cudagraphs \
        --dtype "$dt" "${LN2D[@]}" --out "$OUT/kernel_$dt"
done

EFF=(efficientnet_b3 --channels-last --amp-dtype bfloat16 --device cuda --warmup 3 --steps 10 --warm-cache)
step run_effnet_all 150 $FB run "${EFF[@]}" -m all --timeout 140 --out "$OUT/run"
step run_effnet_reduce_overhead 60 $FB run "${EFF[@]}" -m compile --compile-mode reduce-overhead \
    --timeout 55 --out "$OUT/run"
step run_effnet_cudagraphs_fused 40 $FB run "${EFF[@]}" -m cudagraphs --cudagraphs-step fused \
    --timeout 35 --out "$OUT/run"

$PY scripts/gpu_summary.py "$OUT" --seconds $((SECONDS - T0)) --out "$OUT/summary.json"
echo "== done in $((SECONDS - T0)) s; results under $OUT"
