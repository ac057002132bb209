#!/usr/bin/env bash
# Session 27 call 4: the tree as committed: every GPU test, the Python package's pytest with the
# CUDA ops, synccheck on GpuFp8Small (one token: the fp8 one-token rings).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
REPO=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
CUT=/tmp/cutlass/cutlass_library
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=$CUT"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
( rm -rf /tmp/pyinst; CMAKE_BUILD_PARALLEL_LEVEL=6 python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
   --no-deps --target /tmp/pyinst $REPO -Cminimum-version=1.1 -Ccmake.define.MOEKIT_CUDA=ON \
   -Ccmake.define.MOEKIT_CUTLASS_DIR=$CUT; echo "py build rc=$?" ) > $R/py_build.txt 2>&1 &
PP=$!
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $R/build_summary.txt; rm -rf $R/b; stamp build; tail -3 $R/build_summary.txt
T=build-gpu/tests/moekit_cuda_tests
( time timeout 260 $T --gtest_brief=1 ) > $R/gpu_tests.txt 2>&1
stamp gtest; grep -E "FAILED|Failure" $R/gpu_tests.txt | head -20; tail -6 $R/gpu_tests.txt
wait $PP; stamp py build; tail -2 $R/py_build.txt
( cd python/tests && PYTHONPATH=/tmp/pyinst timeout 120 python3 -m pytest -q -p no:cacheprovider -rs ) > $R/pytest_gpu.txt 2>&1
stamp "pytest rc=$?"; tail -4 $R/pytest_gpu.txt
for tool in synccheck; do
  ( timeout 60 compute-sanitizer --tool $tool --print-limit 100000 --error-exitcode 9 $T --gtest_filter='GpuFp8Small.*' --gtest_brief=1 ) > $R/${tool}_fp8.txt 2>&1
  stamp "$tool rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/${tool}_fp8.txt | tail -3
  grep -E "at .*\.(cuh|inc|cu):[0-9]+" -o $R/${tool}_fp8.txt | sort | uniq -c | sort -rn | head -8 > $R/${tool}_fp8_sites.txt; cat $R/${tool}_fp8_sites.txt
done
tar -czf $OUT/res.tgz -C $R .
cp $R/gpu_tests.txt $R/pytest_gpu.txt $R/synccheck_fp8.txt $OUT/
