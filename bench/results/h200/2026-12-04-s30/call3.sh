#!/usr/bin/env bash
# Session 30 call 3: the MX widening in rounds (loads in flight, stores in row order through shared
# memory), runs of 512 MiB by default: the widening and MX GPU tests, memcheck + racecheck on
# them, and the layer bench at prefill batches: MX on the prefill path (the default runs, runs
# of 1 GiB) beside MX on the bulk kernels (the crossover) and the bf16 layer, in one run.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
stamp build; tail -3 $R/b/summary.txt
T=build-gpu/tests/moekit_cuda_tests; M=build-gpu/moekit
( time timeout 120 $T --gtest_filter='GpuPrefillMx*:GpuMx.ForwardMatches*:GpuMx.Graph*:GpuMxSmall*' --gtest_brief=1 ) > $OUT/gpu_tests_mx.txt 2>&1
stamp "mx tests rc=$?"; grep -E "FAILED|Failure|PASSED" $OUT/gpu_tests_mx.txt | head -20; tail -4 $OUT/gpu_tests_mx.txt
for tool in memcheck racecheck; do
  ( timeout 120 compute-sanitizer --tool $tool --print-limit 100 --error-exitcode 9 $T --gtest_filter='GpuMxSmall.*:GpuPrefillMxSmall.*' --gtest_brief=1 ) > $R/${tool}_mx.txt 2>&1
  stamp "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $R/${tool}_mx.txt | tail -3
done
cat $R/memcheck_mx.txt $R/racecheck_mx.txt > $OUT/sanitizers_mx.txt
bench() {  # name env model dtype batches
  local name=$1 envs=$2 model=$3 dtype=$4 batches=$5
  ( env $envs timeout 150 $M bench --device cuda --model $model --dtype $dtype --batch $batches --json ) > $R/bench_$name.json 2> $R/bench_$name.err
  stamp "bench $name rc=$?"; tail -2 $R/bench_$name.err
}
bench gpt_mxfp4 "MOEKIT_EXPERTS_KERNEL=grouped" gpt-oss-120b mxfp4 256,512,1024,2048,4096
bench gpt_mxfp4_bulk "MOEKIT_EXPERTS_KERNEL=bulk" gpt-oss-120b mxfp4 256,512,1024,2048
bench gpt_bf16 "" gpt-oss-120b bf16 256,512,1024,2048,4096
bench gpt_mxfp4_run32 "MOEKIT_EXPERTS_KERNEL=grouped MOEKIT_EXPERTS_MX_CHUNK=32" gpt-oss-120b mxfp4 1024,4096
bench m3_mxfp8 "MOEKIT_EXPERTS_KERNEL=grouped" minimax-m3 mxfp8 256,512,1024,2048,4096
bench m3_mxfp8_bulk "MOEKIT_EXPERTS_KERNEL=bulk" minimax-m3 mxfp8 256,512,1024
bench m3_bf16 "" minimax-m3 bf16 256,512,1024,2048,4096
python3 - $R <<'PY' > $OUT/table.txt
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    name = os.path.basename(f)[6:-5]
    try: recs = json.load(open(f))
    except Exception as e: print(name, "unreadable", e); continue
    for r in recs:
        print(f"{name:18s} {r['model']:13s} {r.get('dtype','?'):6s} T={r['batch']:5d} fuse={r.get('fuse_shared')} "
              f"us={r['us_per_layer']:9.1f} bw={r['bw_fraction']:.3f} tflops={r.get('expert_tflops',0):6.1f} "
              f"peak={r.get('peak_fraction',0):.3f}")
PY
cat $OUT/table.txt
tar -czf $OUT/bench.tgz -C $R $(cd $R && ls bench_*.json bench_*.err)
