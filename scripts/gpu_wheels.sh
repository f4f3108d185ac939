#!/usr/bin/env bash
# Wheels for the packages a lent GPU machine's image lacks, downloaded here (the device has no
# package index) for its Python 3.12 on x86-64, into .whl/ (ignored by git; name it in the
# device call's `carry`). scripts/gpu_check.sh installs whatever .whl/ holds before it starts.
#   bash scripts/gpu_wheels.sh [NAME ...]     # default: pydantic (missing there on 2026-12-04),
#                                             # einops (gpu_sites.py's einops models)
# Each NAME is pinned to the version installed here, and its own dependencies come along.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(pydantic einops)
pins=()
for n in "${names[@]}"; do
    v=$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$n")
    pins+=("$n==$v")
done
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
    plat+=(--platform "$p")
done
mkdir -p .whl
$PY -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d .whl "${pins[@]}"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
echo "wheels for ${pins[*]} (with their dependencies) in .whl/:"
ls .whl
