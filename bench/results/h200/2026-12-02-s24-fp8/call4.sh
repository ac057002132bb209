#!/usr/bin/env bash
# Session 24 call 4 (final): the merged tree (fp8 deep ring, EP local transport, engine fp8 view, file splits).
# Build; every GPU test; sanitizers on the EP and engine fp8 tests; results written to $OUT as they come.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $OUT/build_summary.txt
tar -xzf $R/b/logs.tar.gz -C $R/b 2>/dev/null
grep -h -E "error|warning: .*ep" $(find $R/b -name build.log) | head -20 >> $OUT/build_summary.txt
T=build-gpu/tests/moekit_cuda_tests
( time timeout 330 $T --gtest_brief=1 ) > $OUT/test_all.txt 2>&1
grep -E "FAILED|Failure" $OUT/test_all.txt | head -20
tail -8 $OUT/test_all.txt
F="${SAN_FILTER:-Models/EpLocal.*/deepseek*:EpLocalErrors.*:EngineFp8Gpu.ExpertSlices*:EngineFp8Gpu.WhatItCannot*}"
STAGE_TIMEOUT=45 SANITIZE_FILTER="$F" STAGES=sanitize OUT=$R/s bash scripts/gpu_check.sh > /dev/null 2>&1
cp $R/s/summary.txt $OUT/sanitize_summary.txt
grep -E "rc=|SUMMARY|PASSED|FAILED" $OUT/sanitize_summary.txt
