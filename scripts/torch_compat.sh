#!/usr/bin/env bash
# The test suite under another torch (or Python): a fresh clone of this checkout's HEAD, a fresh
# venv with that torch and what it brings (torch 2.4.1 pins triton 3.0.0), a fresh kernel cache,
# then the README's install and test command, and one `run --quick` whose cells all must finish.
#   bash scripts/torch_compat.sh 2.4.1 [DIR]                  # DIR: the clone and the logs
#   PYTHON=/path/to/python3.10 bash scripts/torch_compat.sh 2.13.0   # the oldest Python allowed
# Prints the versions it got and the suite's summary line; exit code: the suite's.
set -u -o pipefail
VERSION=${1:?usage: torch_compat.sh TORCH_VERSION [DIR]}
PYTHON=${PYTHON:-python3}
DIR=${2:-/tmp/fusebench-torch-$VERSION-$(basename "$PYTHON")}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }   # the local index's notices
rm -rf "$DIR" && mkdir -p "$DIR"
git clone -q "$ROOT" "$DIR/repo" || exit 2
cd "$DIR/repo" || exit 2
"$PYTHON" -m venv .venv && . .venv/bin/activate || exit 2
quiet pip install -q --upgrade pip
quiet pip install -q "torch==$VERSION" || { echo "torch==$VERSION does not install here"; exit 2; }
quiet pip install -q -e '.[test,kernels]' || exit 2
python -c "import sys, torch, numpy; from importlib.metadata import version as v; \
print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', v('triton'), \
'numpy', numpy.__version__)"
export FUSEBENCH_CACHE=$DIR/cache
fusebench run efficientnet_b0 --quick --out "$DIR/results" > "$DIR/quick.log" 2>&1
echo "run --quick: exit code $? ($DIR/quick.log)"
python -m pytest -q > "$DIR/suite.log" 2>&1
rc=$?
tail -1 "$DIR/suite.log"
exit $rc
