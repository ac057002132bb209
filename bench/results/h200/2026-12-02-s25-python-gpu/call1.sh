#!/usr/bin/env bash
# Session 25 call 1: build; every GPU test (verifies the qwen2 fp8 instance case and the engine fp8
# 3e-2 bound); the Python package built with its CUDA ops and pytest on the GPU; initcheck on EP.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
( STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1 ) &
BP=$!
# the Python package with CUDA ops, built beside the library
( python3 -c "import torch, nanobind; print('torch', torch.__version__, torch.version.cuda)";
  time CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
   --target /tmp/pyinst . -Ccmake.define.MOEKIT_CUDA=ON \
   -Ccmake.define.MOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library ) > $OUT/py_build.txt 2>&1
tail -5 $OUT/py_build.txt
wait $BP
cp $R/b/summary.txt $OUT/build_summary.txt
T=build-gpu/tests/moekit_cuda_tests
( time timeout 330 $T --gtest_brief=1 ) > $OUT/test_all.txt 2>&1
grep -E "FAILED|Failure" $OUT/test_all.txt | head -20
tail -8 $OUT/test_all.txt
( cd python/tests && PYTHONPATH=/tmp/pyinst timeout 200 python3 -m pytest -q -p no:cacheprovider -rs ) > $OUT/pytest_gpu.txt 2>&1
tail -15 $OUT/pytest_gpu.txt
( time timeout 150 compute-sanitizer --tool initcheck --error-exitcode 9 $T \
   --gtest_filter='Models/EpLocal.*/deepseek*:EpLocalErrors.*' --gtest_brief=1 ) > $OUT/initcheck_ep.txt 2>&1
echo "initcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED|real" $OUT/initcheck_ep.txt | tail -5
