#!/usr/bin/env bash
# Session 29 call 3: the tree as committed: every GPU test, the Python package's pytest with the
# CUDA ops, memcheck and racecheck on GpuMxSmall, then the layer bench of gpt-oss-120b (MXFP4
# against bf16) and MiniMax-M3 (MXFP8 against bf16) side by side with the read bandwidth, and ncu
# of both MX layers at one token.
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
cp $R/b/summary.txt $R/build_summary.txt; tar -xzf $R/b/logs.tar.gz -C $R/b 2>/dev/null
grep -h -A4 "Compiling entry function.*12ExpertFormatE[23]E" $(find $R/b -name "build.log" -type f) 2>/dev/null | grep -E "Compiling|registers|spill|stack" | head -40 > $R/ptxas_mx.txt
rm -rf $R/b; stamp build; tail -3 $R/build_summary.txt
T=build-gpu/tests/moekit_cuda_tests
( time timeout 280 $T --gtest_brief=1 ) > $R/gpu_tests.txt 2>&1
stamp gtest; grep -E "FAILED|Failure" $R/gpu_tests.txt | head -20; tail -6 $R/gpu_tests.txt
for tool in memcheck racecheck; do
  ( timeout 100 compute-sanitizer --tool $tool --print-limit 100 --error-exitcode 9 $T --gtest_filter='GpuMxSmall.*' --gtest_brief=1 ) > $R/${tool}_mx.txt 2>&1
  stamp "$tool rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/${tool}_mx.txt | tail -3
done
M=build-gpu/moekit
for spec in "gpt-oss-120b mxfp4" "gpt-oss-120b bf16" "minimax-m3 mxfp8" "minimax-m3 bf16"; do
  set -- $spec
  ( timeout 150 $M bench --device cuda --model $1 --dtype $2 --batch 1,8,32,128 --json ) > $R/bench_$1_$2.json 2> $R/bench_$1_$2.err
  stamp "bench $1 $2 rc=$?"
done
for spec in "gpt-oss-120b mxfp4" "minimax-m3 mxfp8"; do
  set -- $spec
  STAGES=profile PROFILE_MODELS=$1 PROFILE_TOKENS=1 PROFILE_ARGS="--expert-dtype $2" PROFILE_SOURCE=1 \
    STAGE_TIMEOUT=120 OUT=$R/p_$1 bash scripts/gpu_check.sh > $R/profile_$1.txt 2>&1
  cat $R/p_$1/ncu.txt $R/p_$1/ncu_source.txt >> $R/ncu_mx.txt 2>/dev/null; stamp "profile $1"
done
python3 - $R <<'PY' > $R/table.txt
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    try: recs = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    for r in recs:
        print(f"{r['model']:14s} {r.get('dtype','?'):6s} T={r['batch']:4d} fuse={r.get('fuse_shared')} "
              f"us={r['us_per_layer']:9.1f} floor={r['floor_us']:8.1f} bw={r['bw_fraction']:.3f} "
              f"bytes={r['touched_bytes']/1e6:8.1f}MB")
PY
cat $R/table.txt
wait $PP; stamp py build; tail -2 $R/py_build.txt
( cd python/tests && PYTHONPATH=/tmp/pyinst timeout 120 python3 -m pytest -q -p no:cacheprovider -rs ) > $R/pytest_gpu.txt 2>&1
stamp "pytest rc=$?"; tail -4 $R/pytest_gpu.txt
tar -czf $OUT/res.tgz -C $R .
cp $R/table.txt $R/gpu_tests.txt $R/pytest_gpu.txt $R/memcheck_mx.txt $R/racecheck_mx.txt $R/ncu_mx.txt $R/ptxas_mx.txt $OUT/
