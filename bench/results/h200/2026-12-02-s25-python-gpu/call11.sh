#!/usr/bin/env bash
# Session 25 call 11: the package built as the project builds it now (it links the shared libstdc++ torch loads),
# then every pytest test (CPU and CUDA).
set -uo pipefail
cd "$(dirname "$0")/.."
echo "CXX=${CXX:-} CC=${CC:-} CUDAHOSTCXX=${CUDAHOSTCXX:-}"; ls -la /usr/bin/g++
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
rm -rf /tmp/pyinst build-py
ls /opt/gcc/lib64/libstdc++.so* /opt/gcc/lib/libstdc++.so* 2>&1 | head -3; ls -la /usr/lib/x86_64-linux-gnu/libstdc++.so.6
( time CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
   --no-deps --target /tmp/pyinst . -Cminimum-version=1.1 -Ccmake.define.MOEKIT_CUDA=ON \
   -Ccmake.define.MOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library ) > $OUT/py_build.txt 2>&1
tail -3 $OUT/py_build.txt; grep -h "ops link" build-py/*/CMakeFiles/CMakeOutput.log 2>/dev/null | head -2
readelf -d /tmp/pyinst/moekit/_moekit_ops.so | grep NEEDED | grep -c stdc
cd python/tests
( PYTHONPATH=/tmp/pyinst timeout 170 python3 -m pytest -q -p no:cacheprovider -rs ) > $OUT/pytest_gpu.txt 2>&1
grep -v "^  File" $OUT/pytest_gpu.txt | tail -40
