#!/usr/bin/env bash
# Session 46 run 1. build-carry/base46.tar.xz: main (5b7802a's moekit and GPU tests);
# build-carry/w16.tar.xz: branch s46-mx-16warps, the MX ring's instances with 16 consumer warps
# (5 stages, 4 reduction buffers); build-carry/w16s6.tar.xz: the same with 6 stages and 2
# reduction buffers. Every other instance's machine code is main's. On any GPU: w16's MX, prefill-MX,
# instance and self-routing GPU tests, w16s6's MX tests, memcheck and racecheck on w16's MX
# sanitizer shapes; the three binaries alternating on gpt-oss-120b MXFP4 and MiniMax-M3 MXFP8 at
# 1-256 tokens, two rounds; a bf16 control; the timelines at one token.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in base46 w16 w16s6; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 150) /tmp/w16/moekit_cuda_tests --gtest_filter='GpuMx*:GpuPrefillMx*:EveryInstance/*mx*:*SelfRouted*' > $R/gpu_tests_w16.txt 2>&1; stamp "tests w16 rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_w16.txt
timeout -k 5 $(left 90) /tmp/w16s6/moekit_cuda_tests --gtest_filter='GpuMx*:EveryInstance/*mx*' > $R/gpu_tests_w16s6.txt 2>&1; stamp "tests w16s6 rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_w16s6.txt
for tool in memcheck racecheck; do
  timeout -k 5 $(left 60) compute-sanitizer --tool $tool /tmp/w16/moekit_cuda_tests --gtest_filter='GpuMxSmall.*' > $R/${tool}_w16.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/${tool}_w16.txt
done
pack
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in base46 w16 w16s6; do
  for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
    bench ab${i}_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128,256 --iterations 30
  done
done; pack; done
for v in base46 w16; do
  bench ctl_${v}_qwen3-30b-a3b_bf16 20 $v --device cuda --model qwen3-30b-a3b --dtype bf16 --batch 1,8 --iterations 30
  for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
    bench trace_${v}_${md%:*}_${md#*:} 20 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1 --iterations 20 --trace
  done
done
pack
stamp done
