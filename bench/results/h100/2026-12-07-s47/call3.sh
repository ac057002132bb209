#!/usr/bin/env bash
# Session 47 run 3. build-carry: main47 (main's moekit, fe258e9's kernels), p47 (branch
# s47-mx-pieces 45848f4: the MX consumers' pieces dealt round the warps, the item's record handed
# over by the last warp), pd47 (5e4a361: also the pair-to-row division as a multiply and shift,
# every expert instance). pd47's GPU tests (every instance, MX, fp8 small) and sanitizers on the
# small MX shapes; then the three alternating on the MX layers at 1-128 tokens, two rounds; main47
# and pd47 on fp8 and bf16 layers; ncu's source counters on p47's MXFP4 kernels if time is left.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 470 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main47 p47 pd47; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 150) /tmp/pd47/moekit_cuda_tests --gtest_filter='EveryInstance/*:GpuMx*:GpuFp8Small*:RowDivisor*' > $R/gpu_tests_pd47.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]|tests ran" $R/gpu_tests_pd47.txt | head
for tool in memcheck racecheck; do
  timeout -k 5 $(left 60) compute-sanitizer --tool $tool /tmp/pd47/moekit_cuda_tests --gtest_filter='GpuMxSmall*' > $R/${tool}_pd47.txt 2>&1; stamp "$tool rc=$?"
  tail -3 $R/${tool}_pd47.txt
done
pack
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in main47 p47 pd47; do
  for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
    bench ab${i}_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 30
  done
done; pack; done
for v in main47 pd47; do
  for md in deepseek-v3:fp8 minimax-m2:fp8 qwen3-30b-a3b:bf16 gpt-oss-120b:bf16; do
    bench ab1_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,32 --iterations 30
  done
done
pack
( timeout -k 5 $(left 100) ncu --clock-control none -k regex:bulk --launch-skip 20 --launch-count 2 \
    --section SchedulerStats --section WarpStateStats --section InstructionStats --section SourceCounters \
    --import-source no -o $R/ncu_p47_mxfp4_32 -f \
    /tmp/p47/moekit bench --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 32 --iterations 2 ) > $R/ncu_p47_mxfp4_32.log 2>&1
stamp "ncu rc=$?"
ncu -i $R/ncu_p47_mxfp4_32.ncu-rep --page details > $R/ncu_p47_mxfp4_32_details.txt 2>&1
ncu -i $R/ncu_p47_mxfp4_32.ncu-rep --page source --csv --print-source sass > $R/ncu_p47_mxfp4_32_sass.csv 2>&1
pack
stamp done
