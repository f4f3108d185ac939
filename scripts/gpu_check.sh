#!/usr/bin/env bash
# Every GPU path of fusebench in at most 7.5 minutes (BUDGET) of device time, for a lent GPU
# machine that got a copy of this repository:
#   OUT=/some/dir bash scripts/gpu_check.sh
# Steps, most needed first (a step that would start after BUDGET seconds is skipped, said in
# its log line; each has its own time limit and a failing step does not stop the others):
#   1. `fusebench env`.
#   2. scripts/gpu_kernels.py: every kernel family's impls (Triton ones included) on CUDA in one
#      process, fp32 and bf16, NCHW and channels-last: forward and gradients vs float64, times.
#   3. issue 15: `run efficientnet_b3 --channels-last` train, AMP bf16, at the model's standard
#      batch: eager, fused and compile side by side (2 worker processes each), then fused with
#      the Triton BN+act kernel (`--fused-bn-act triton`; CUDA's default is aten's sequence).
#   4. scripts/gpu_sites.py: the transformer graph sites' device paths (the mlp site's
#      native_dropout, the mha site's strided views into SDPA, the attention site's masks), each
#      model fused against eager in float32 and under bf16 autocast (tiny sizes, ~1 minute).
#   5. scripts/gpu_mlp.py: the MLP's Triton row blocks against the layers, fp32 and bf16, at
#      the narrow widths the CPU blocks pay at: errors vs float64 and fwd+bwd times (`auto`
#      keeps CUDA's MLPs layer by layer until these say otherwise).
#   6. issue 16: `kernel ln2d --impl all` at 32x96x56x56 fwd+bwd in fp32 and bf16 (L2-flushed
#      step time vs graph-replayed device time, launch_bound events), every other mode of b3
#      (cudagraphs included), compile reduce-overhead and fused cudagraphs.
# Then scripts/gpu_summary.py writes $OUT/summary.json and prints each target as met / missed
# with its number, and the fused mode's ratios (against eager and compile) and activation bytes.
# SKIP="kernels env" leaves those steps out (a rerun after a partial check). DEVICE=cpu SMALL=1
# runs the whole script at tiny sizes on a machine without a GPU (try it before a lease).
# AMP: bf16 autocast (`--amp-dtype bfloat16`; plain `--amp` is fp16 on CUDA).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fusebench-gpu-check}
BUDGET=${BUDGET:-450}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
FB="$PY -m fusebench"
T0=$SECONDS

# The device's image has its own packages and no index: install the wheels carried in .whl/
# (scripts/gpu_wheels.sh makes them here), then stop at once, before any step spends the lease,
# if a declared dependency is still missing (the package itself runs from PYTHONPATH).
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/fusebench-site .whl/*.whl >"$OUT/wheels.log" 2>&1
    rc=$?
    echo "== wheels from .whl: rc=$rc (log $OUT/wheels.log)"
    # wheels for another Python (a CPU smoke here) install nothing: keep this one's packages
    [ $rc = 0 ] && export PYTHONPATH="/tmp/fusebench-site:$PYTHONPATH"
fi
if ! $PY scripts/missing_deps.py >"$OUT/missing_deps.txt" 2>&1; then
    echo "== missing dependencies (carry wheels: bash scripts/gpu_wheels.sh NAME ..., then name"
    echo "   .whl in the device call's carry):"
    cat "$OUT/missing_deps.txt"
    exit 3
fi

step() {  # step NAME SECONDS CMD...: run with a limit, log to $OUT/NAME.log, say how it went
    local name=$1 limit=$2; shift 2
    case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped (SKIP)"; return;; esac
    local used=$((SECONDS - T0))
    if [ "$used" -ge "$BUDGET" ]; then
        echo "== $name: skipped, ${used} s of the ${BUDGET} s budget used"
        return
    fi
    local left=$((BUDGET - used))
    if [ "$limit" -gt "$left" ]; then   # the check as a whole ends inside its budget
        echo "== $name: limit cut from $limit s to the budget's last $left s"
        limit=$left
    fi
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    tail -n 15 "$OUT/$name.log"
}

DEVICE=${DEVICE:-cuda}
# SMALL=1: a smoke of this script itself (tiny model, shapes and steps); with DEVICE=cpu it runs
# on a machine without a GPU, before a lease is spent on it (tests/test_gpu_tools.py, slow)
if [ "${SMALL:-0}" = 1 ]; then
    MODEL=(efficientnet_b0 -b 2 --img-size 64); STEPS=(--warmup 1 --steps 2)
    KSHAPE=(--shape 2,8,8,8 --steps 2); LNSHAPE=2,8,8,8; MLP=(--small)
    [ "$DEVICE" = cpu ] && export TRITON_INTERPRET=1    # Triton impls on CPU tensors
else
    MODEL=(efficientnet_b3); STEPS=(--warmup 5 --steps 20)
    KSHAPE=(); LNSHAPE=32,96,56,56; MLP=()
fi

nvidia-smi -L >"$OUT/nvidia-smi.txt" 2>&1; cat "$OUT/nvidia-smi.txt"
step env 40 $FB env --device "$DEVICE"
$FB env --json --device "$DEVICE" >"$OUT/env.json" 2>/dev/null

step kernels 180 $PY scripts/gpu_kernels.py "$OUT/kernels" --device "$DEVICE" "${KSHAPE[@]}"

EFF=("${MODEL[@]}" --channels-last --amp-dtype bfloat16 --device "$DEVICE" "${STEPS[@]}"
     --warm-cache)
step run_effnet_fused 270 $FB run "${EFF[@]}" -m eager,fused,compile --repeat 2 --timeout 220 \
    --out "$OUT/run"
step run_effnet_fused_bn_act_triton 60 $FB run "${EFF[@]}" -m fused --fused-bn-act triton \
    --repeat 1 --timeout 55 --out "$OUT/run"

step sites 90 $PY scripts/gpu_sites.py --device "$DEVICE" --size tiny
step mlp 60 $PY scripts/gpu_mlp.py --device "$DEVICE" "${MLP[@]}"

LN2D=(--shape "$LNSHAPE" --direction fwdbwd --device "$DEVICE" "${STEPS[@]}" --timeout 60)
for dt in float32 bfloat16; do
    step "kernel_ln2d_$dt" 70 $FB kernel ln2d --impl all --dtype "$dt" "${LN2D[@]}" \
        --out "$OUT/kernel_$dt"
    step "kernel_ln2d_${dt}_cudagraphs" 25 $FB kernel ln2d --impl triton,function -m cudagraphs \
        --dtype "$dt" "${LN2D[@]}" --out "$OUT/kernel_$dt"
done

step run_effnet_other_modes 150 $FB run "${EFF[@]}" -m aot,torchscript,cudagraphs --repeat 1 \
    --timeout 140 --out "$OUT/run"
# reduce-overhead's cold compile of b3 ran past 55 s on the H200 (2026-12-04)
step run_effnet_reduce_overhead 120 $FB run "${EFF[@]}" -m compile --compile-mode reduce-overhead \
    --repeat 1 --timeout 115 --out "$OUT/run"
step run_effnet_cudagraphs_fused 40 $FB run "${EFF[@]}" -m cudagraphs --cudagraphs-step fused \
    --repeat 1 --timeout 35 --out "$OUT/run"

$PY scripts/gpu_summary.py "$OUT" --seconds $((SECONDS - T0)) --out "$OUT/summary.json"
echo "== done in $((SECONDS - T0)) s; results under $OUT"
