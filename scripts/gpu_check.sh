#!/usr/bin/env bash
# A few-minute run of fusebench's GPU paths: CUDA-event timing, allocator peak, channels-last,
# AMP, torch.compile, NVML telemetry, Triton kernels, timm models. For a lent GPU machine:
#   OUT=/some/dir bash scripts/gpu_check.sh      (outputs land in $OUT)
# Each step has its own time limit and a failing step does not stop the others.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fusebench-gpu-check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
FB="$PY -m fusebench"
step() {  # step NAME SECONDS CMD...: run with a limit, log to $OUT/NAME.log, say how it went
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    tail -n 25 "$OUT/$name.log"
}

nvidia-smi -L
step env 60 $FB env
# convnext_atto, channels-last, compile beside eager (and fused when present): CUDA events,
# allocator peak, NVML telemetry fields, correctness vs float64 on the GPU
step run_convnext 200 $FB run convnext_atto -m eager,compile,fused --device cuda \
    --channels-last -b 64 --warmup 5 --steps 30 --out "$OUT" --timeout 180
step run_effnet_amp 150 $FB run efficientnet_b0 -m eager,torchscript,aot --device cuda --amp \
    -b 64 --warmup 5 --steps 30 --out "$OUT" --timeout 120
step run_timm 60 $FB run timm:resnet18 -m eager --device cuda -b 32 --steps 10 --out "$OUT"
step fidelity 90 $PY benchmarks/fidelity.py --device cuda --reps 2
step kernels 120 $PY benchmarks/kernels.py --cuda-only
step kernel_cmd 90 $FB kernel ln2d --impl permute,channels_last,triton,fused --device cuda \
    --shape 32,96,56,56 --direction fwdbwd --out "$OUT"
echo "== done; results documents:"
ls "$OUT"/*.json 2>/dev/null
