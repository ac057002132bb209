#!/usr/bin/env bash
# Session 46 run 2. build-carry/base46.tar.xz: main (5b7802a's moekit and GPU tests);
# build-carry/bias.tar.xz: branch s46-mx-bias-stage (ac95d9e): the MX ring's items bring the
# biases of their output rows in their first stage (lanes 17-18 of the producer, one bulk copy
# each), consumer warp 0 puts them after the reduction buffer's partials, and the epilogue warp
# reads them there instead of loading them from global memory per item. On any GPU: bias's MX,
# prefill-MX, instance and self-routing GPU tests, memcheck and racecheck on the small MX and
# small-layer sanitizer shapes; base46 and bias alternating on gpt-oss-120b MXFP4 and MiniMax-M3
# MXFP8 (no biases) at 1-256 tokens and gpt-oss-120b bf16 at 1 and 8, two rounds; the timelines
# of gpt-oss-120b MXFP4 at one token.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 400 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in base46 bias; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 150) /tmp/bias/moekit_cuda_tests --gtest_filter='GpuMx*:GpuPrefillMx*:EveryInstance/*mx*:*SelfRouted*' > $R/gpu_tests_bias.txt 2>&1; stamp "tests bias rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_bias.txt
for tool in memcheck racecheck; do
  timeout -k 5 $(left 60) compute-sanitizer --tool $tool /tmp/bias/moekit_cuda_tests --gtest_filter='GpuMxSmall.*' > $R/${tool}_bias.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/${tool}_bias.txt
done
pack
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in base46 bias; do
  for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
    bench ab${i}_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128,256 --iterations 30
  done
  bench ab${i}_${v}_gpt-oss-120b_bf16 20 $v --device cuda --model gpt-oss-120b --dtype bf16 --batch 1,8 --iterations 30
done; pack; done
for v in base46 bias; do
  bench trace_${v}_gpt-oss-120b_mxfp4 20 $v --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1 --iterations 20 --trace
done
pack
stamp done
