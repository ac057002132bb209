#!/usr/bin/env bash
# Session 25 call 4: the CUDA op tests alone (test_ops_cuda.py), and which CPU error messages crash.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
if [ ! -d /tmp/pyinst/moekit ]; then
( time CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
   --no-deps --target /tmp/pyinst . -Cminimum-version=1.1 -Ccmake.define.MOEKIT_CUDA=ON \
   -Ccmake.define.MOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library ) > $OUT/py_build.txt 2>&1
fi
cd python/tests
( PYTHONPATH=/tmp/pyinst timeout 240 python3 -m pytest -q -p no:cacheprovider -rs test_ops_cuda.py ) > $OUT/pytest_cuda.txt 2>&1
tail -40 $OUT/pytest_cuda.txt
for case in "x.float(), w13[:, :10], w2, ids, wts" "x, w13, w2, ids[:, :1], wts" "x, w13.float(), w2, ids, wts"; do
PYTHONPATH=/tmp/pyinst timeout 60 python3 - <<PY 2>&1 | tail -2
import torch, moekit
from test_ops import _weights
w = _weights("qwen3_moe"); s = w["spec"]
ids, wts = moekit.route(w["logits"], s); x, w13, w2 = w["x"], w["w13"], w["w2"]
try:
    moekit.fused_experts($case, s)
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0][:150])
PY
echo "case [$case] rc=$?"
done
