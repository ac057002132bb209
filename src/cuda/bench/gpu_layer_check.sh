#!/usr/bin/env bash
# One call on the GPU machine for the CUDA MoE layer: build (unless BUILD already holds the
# binaries), SASS facts, every GPU layer test (also under compute-sanitizer on small shapes), the
# benchmarks, all logs and JSON under $OUT. Usage (repo root):
#   OUT=/some/dir bash src/cuda/bench/gpu_layer_check.sh [quick]
# "quick" skips the sanitizers and the second chunk variant. A short table is printed last.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
status=0

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
if [ ! -x "$BUILD/tests/moekit_cuda_tests" ] || [ ! -x "$BUILD/moekit" ]; then
  log "building in $BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DMOEKIT_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    > "$OUT/cmake.log" 2>&1 || { log "cmake failed"; tail -30 "$OUT/cmake.log"; exit 1; }
  ninja -C "$BUILD" moekit_cuda_tests moekit_cli > "$OUT/build.log" 2>&1 \
    || { log "build failed"; grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
fi

# SASS: 16-byte loads, tensor-core mma, no local memory in the expert kernels
if command -v cuobjdump > /dev/null; then
  cuobjdump -sass "$BUILD/libmoekit.a" > "$OUT/sass.txt" 2>&1
  awk '/Function :/ {f=$3} {for (i=1;i<=NF;i++) { op=$i; k="";
         if (op ~ /^(LDGSTS|HMMA|LDL|STL)/) { split(op,a,"."); k=a[1] }
         else if (op ~ /^LDG/) k = (op ~ /128/) ? "LDG.128" : "LDG.narrow";
         if (k != "") c[f" "k]++ }} END {for (x in c) print c[x], x}' \
    "$OUT/sass.txt" | grep -E "experts_|routing_kernel|read_kernel" | sort -k2 > "$OUT/sass_counts.txt"
  log "SASS counts (count function op):"; cat "$OUT/sass_counts.txt" | tee -a "$OUT/summary.txt"
fi

T="$BUILD/tests/moekit_cuda_tests"
log "GPU layer tests (fast ones first)"
"$T" --gtest_filter='GpuRouting.*:GpuLayer.*' > "$OUT/test_quick.log" 2>&1 || status=1
tail -3 "$OUT/test_quick.log" | tee -a "$OUT/summary.txt"
grep -E "^\[  FAILED|Failure|T=.*kernels" "$OUT/test_quick.log" | head -40 | tee -a "$OUT/summary.txt"
log "GPU layer tests: every family, every T, and DeepSeek-V3 real shape"
"$T" --gtest_filter='AllFamilies/*:GpuLayerRealShape.*' > "$OUT/test_families.log" 2>&1 || status=1
tail -3 "$OUT/test_families.log" | tee -a "$OUT/summary.txt"
grep -E "^\[  FAILED|Failure" -A6 "$OUT/test_families.log" | head -60 | tee -a "$OUT/summary.txt"

if [ "${1:-}" != "quick" ]; then
  log "chunk-16 expert kernels on every family (MOEKIT_EXPERTS_CHUNK=16)"
  MOEKIT_EXPERTS_CHUNK=16 "$T" --gtest_filter='AllFamilies/*T7:AllFamilies/*T128:GpuLayer.ForwardIsDeterministic' \
    > "$OUT/test_chunk16.log" 2>&1 || status=1
  tail -2 "$OUT/test_chunk16.log" | tee -a "$OUT/summary.txt"
  log "without programmatic dependent launch (MOEKIT_PDL=0)"
  MOEKIT_PDL=0 "$T" --gtest_filter='AllFamilies/*T7:AllFamilies/*T128:GpuLayer.*' \
    > "$OUT/test_nopdl.log" 2>&1 || status=1
  tail -2 "$OUT/test_nopdl.log" | tee -a "$OUT/summary.txt"
  if command -v compute-sanitizer > /dev/null; then
    small='AllFamilies/*deepseek_v3_T7:AllFamilies/*qwen2_57b_a14b_T32:AllFamilies/*gpt_oss_120b_T2:GpuLayer.GraphReplayMatchesForward'
    log "compute-sanitizer memcheck"
    compute-sanitizer --tool memcheck --error-exitcode 9 "$T" --gtest_filter="$small" \
      > "$OUT/memcheck.log" 2>&1 || status=1
    tail -4 "$OUT/memcheck.log" | tee -a "$OUT/summary.txt"
    log "compute-sanitizer racecheck"
    compute-sanitizer --tool racecheck --error-exitcode 9 "$T" \
      --gtest_filter='AllFamilies/*deepseek_v3_T7:AllFamilies/*mixtral_8x7b_T32' \
      > "$OUT/racecheck.log" 2>&1 || status=1
    tail -4 "$OUT/racecheck.log" | tee -a "$OUT/summary.txt"
  fi
fi

B="$BUILD/moekit"
log "benchmarks"
"$B" bench --device cuda --model deepseek-v3 --batch 1,2,8,32,64,128,256 --json \
  > "$OUT/bench_deepseek-v3.json" 2> "$OUT/bench_deepseek-v3.err" || status=1
"$B" bench --device cuda --model qwen3-30b-a3b --batch 1,32,128 --json \
  > "$OUT/bench_qwen3-30b-a3b.json" 2> "$OUT/bench_qwen3-30b-a3b.err" || status=1
# A/B of the expert kernels: regs-early is the previous default (activations loaded with the
# weights, kUnroll 3)
MOEKIT_EXPERTS_KERNEL=regs-early "$B" bench --device cuda --model deepseek-v3 \
  --batch 1,2,8,32,128 --json \
  > "$OUT/bench_deepseek-v3_regs-early.json" 2> "$OUT/bench_deepseek-v3_regs-early.err" || status=1
MOEKIT_EXPERTS_KERNEL=regs-early "$B" bench --device cuda --model qwen3-30b-a3b --batch 1,32,128 \
  --json > "$OUT/bench_qwen3-30b-a3b_regs-early.json" \
  2> "$OUT/bench_qwen3-30b-a3b_regs-early.err" || status=1
if [ "${1:-}" != "quick" ]; then
  MOEKIT_EXPERTS_KERNEL=ring "$B" bench --device cuda --model deepseek-v3 --batch 1,32 --json \
    > "$OUT/bench_deepseek-v3_ring.json" 2> "$OUT/bench_deepseek-v3_ring.err" || status=1
  MOEKIT_PDL=0 "$B" bench --device cuda --model deepseek-v3 --batch 1,32 --json \
    > "$OUT/bench_deepseek-v3_nopdl.json" 2> "$OUT/bench_deepseek-v3_nopdl.err" || status=1
  MOEKIT_EXPERTS_CHUNK=16 "$B" bench --device cuda --model deepseek-v3 --batch 32,128 --json \
    > "$OUT/bench_deepseek-v3_chunk16.json" 2> "$OUT/bench_deepseek-v3_chunk16.err" || status=1
fi
python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    try:
        recs = json.load(open(f))
    except Exception as e:
        print(f, "unreadable:", e); continue
    print(os.path.basename(f), "read bw %.0f GB/s" % recs[0]["read_bw_gbs"] if recs else "")
    print("%6s %4s %10s %9s %7s %10s %8s %7s" % ("batch", "fuse", "us/layer", "floor", "bwfrac", "step_us", "launch", "on/off"))
    for r in recs:
        print("%6d %4s %10.1f %9.1f %7.3f %10.0f %8d %7.3f" % (r["batch"], r["fuse_shared"], r["us_per_layer"],
              r["floor_us"], r["bw_fraction"], r["step_us"], r["launches"], r["fused_over_unfused"]))
PY
log "exit status $status"
exit $status
