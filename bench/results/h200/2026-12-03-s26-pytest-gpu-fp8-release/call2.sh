#!/usr/bin/env bash
# Session 26 call 2: the Python package's pytest on the GPU after the tiny models' width and the
# logits test's token ids; initcheck on the EP cases (DeepSeek-V3 and Qwen3) after the align fix.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
CUT=/tmp/cutlass/cutlass_library
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=$CUT"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
( rm -rf /tmp/pyinst; CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
   --no-deps --target /tmp/pyinst $REPO -Cminimum-version=1.1 -Ccmake.define.MOEKIT_CUDA=ON \
   -Ccmake.define.MOEKIT_CUTLASS_DIR=$CUT; echo "py build rc=$?" ) > $R/py_build.txt 2>&1 &
PP=$!
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $R/build_summary.txt; rm -rf $R/b; stamp build; tail -3 $R/build_summary.txt
wait $PP; stamp py build; tail -2 $R/py_build.txt
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
( cd python/tests && PYTHONPATH=/tmp/pyinst timeout 120 python3 -m pytest -q -p no:cacheprovider -rs ) > $R/pytest_gpu.txt 2>&1
stamp "pytest rc=$?"; tail -4 $R/pytest_gpu.txt; grep -c "^moekit: CUDA call" $R/pytest_gpu.txt
T=build-gpu/tests/moekit_cuda_tests
( time timeout 150 compute-sanitizer --tool initcheck --error-exitcode 9 $T --gtest_filter='Models/EpLocal.*/deepseek*' --gtest_brief=1 ) > $R/initcheck_ep_dsv3.txt 2>&1
stamp "initcheck dsv3 rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/initcheck_ep_dsv3.txt | tail -3
grep -E "Device Frame|Host API" $R/initcheck_ep_dsv3.txt | sed 's/0x[0-9a-f]*//g' | sort | uniq -c | sort -rn | head -8
( time timeout 100 compute-sanitizer --tool initcheck --error-exitcode 9 $T --gtest_filter='EngineGpu*:EngineApiGpu*' --gtest_brief=1 ) > $R/initcheck_engine.txt 2>&1
stamp "initcheck engine rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/initcheck_engine.txt | tail -3
grep -E "Device Frame|Host API" $R/initcheck_engine.txt | sed 's/0x[0-9a-f]*//g' | sort | uniq -c | sort -rn | head -8
tar -czf $OUT/res.tgz -C $R .
cp $R/pytest_gpu.txt $OUT/
