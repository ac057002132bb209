#!/usr/bin/env bash
# Session 25 call 5: native backtraces of the two crashes (a CPU shape error, the CUDA route).
set -uo pipefail
cd "$(dirname "$0")/.."
gcc -shared -fPIC -O0 -o /tmp/segv_bt.so build-ab/segv_bt.c
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
if [ ! -d /tmp/pyinst/moekit ]; then
( CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
   --no-deps --target /tmp/pyinst . -Cminimum-version=1.1 -Ccmake.define.MOEKIT_CUDA=ON \
   -Ccmake.define.MOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library ) > $OUT/py_build.txt 2>&1
fi
cd python/tests
for dev in cpu cuda; do
PYTHONPATH=/tmp/pyinst LD_PRELOAD=/tmp/segv_bt.so timeout 60 python3 - > $OUT/bt_$dev.txt 2>&1 <<PY
import torch, moekit
from test_ops import _weights
w = _weights("qwen3_moe"); s = w["spec"]
if "$dev" == "cpu":
    ids, wts = moekit.route(w["logits"], s)
    moekit.fused_experts(w["x"], w["w13"], w["w2"], ids[:, :1], wts, s)
else:
    print(moekit.route(w["logits"].cuda(), s))
PY
echo "$dev rc=$?"; grep -v "^ *File\|^$" $OUT/bt_$dev.txt | head -40
done
ls /tmp/pyinst/moekit; ldd /tmp/pyinst/moekit/*.so | grep -E "torch|c10|moekit|stdc"
