#!/usr/bin/env bash
# Session 48 run 1. build-carry: m48 (main 1c3d9a1), x48 (branch s47-mx-onestep ee4775a: the MX
# consumers zeroing no register, and the two-multiply test only in layers whose e8m0 bytes may
# need it). x48's GPU tests (every instance's MX rows, MX, small MX prefill) and sanitizers on its
# small MX shapes; m48 and x48 alternating on the MX layers (three rounds); main's layers on the
# issues' models (fp8, MX, bf16 at 1-128 tokens; prefill at 4096); ncu on x48's MXFP4 kernels.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 500 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in m48 x48; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 90) /tmp/x48/moekit_cuda_tests --gtest_filter='EveryInstance/*mx*:GpuMx*:GpuPrefillMxSmall*' > $R/gpu_tests_x48.txt 2>&1; stamp "tests x48 rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_x48.txt | head
for tool in memcheck racecheck; do
  timeout -k 5 $(left 45) compute-sanitizer --tool $tool /tmp/x48/moekit_cuda_tests --gtest_filter='GpuMxSmall*' > $R/${tool}_x48.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/${tool}_x48.txt
done
pack
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
mx_round() {
  for v in m48 x48; do
    for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
      bench ab${1}_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 30
    done
  done
  pack
}
mx_round 1
for md in deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8 gpt-oss-120b:bf16 minimax-m3:bf16 qwen3-30b-a3b:bf16; do
  bench base_${md%:*}_${md#*:} 40 m48 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 30
done
pack
mx_round 2
for md in deepseek-v3:bf16 minimax-m3:bf16 qwen3-30b-a3b:bf16 mixtral-8x7b:bf16 deepseek-v3:fp8 minimax-m3:mxfp8 gpt-oss-120b:mxfp4; do
  bench prefill_${md%:*}_${md#*:} 60 m48 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 4096 --iterations 5
done
pack
mx_round 3
( timeout -k 5 $(left 100) ncu --clock-control none -k regex:bulk --launch-skip 20 --launch-count 2 \
    --section SchedulerStats --section WarpStateStats --section InstructionStats --section SourceCounters \
    --import-source no -o $R/ncu_x48_mxfp4_32 -f \
    /tmp/x48/moekit bench --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 32 --iterations 2 ) > $R/ncu_x48_mxfp4_32.log 2>&1
stamp "ncu rc=$?"
ncu -i $R/ncu_x48_mxfp4_32.ncu-rep --page details > $R/ncu_x48_mxfp4_32_details.txt 2>&1
ncu -i $R/ncu_x48_mxfp4_32.ncu-rep --page source --csv --print-source sass > $R/ncu_x48_mxfp4_32_sass.csv 2>&1
rm -f $R/ncu_x48_mxfp4_32.ncu-rep
pack
stamp done
