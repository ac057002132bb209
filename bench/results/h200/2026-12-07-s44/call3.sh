#!/usr/bin/env bash
# Session 44 run 3 (any GPU). Branch s44-fp8-self-route ("new": run 2's change (b) alone, with its
# tests, and the same for the MX gate/up kernels): the fp8 one-token gate/up kernel routes its
# token itself at E <= 256 without shared experts (MiniMax-M2), the MX ones at E <= 128 (gpt-oss).
# Its GPU tests (the fp8 and MX layers, the instances, the self-routed and one-token-ring tests),
# memcheck and racecheck on the new tests; then main (3b2436d) and new alternating, two rounds:
# MiniMax-M2 fp8 and gpt-oss-120b MXFP4 at 1 / 8 tokens, DeepSeek-V3 fp8 and Qwen3-30B-A3B bf16
# at one token (their paths unchanged); new's MiniMax-M2 and gpt-oss timelines at one token.
# Carry build-carry/{main,new}.tar.xz (new's moekit_cuda_tests too).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 300 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
T=/tmp/new/moekit_cuda_tests
timeout -k 5 $(left 80) $T --gtest_filter='GpuFp8*:GpuMx*:EngineFp8Gpu*:EngineMx*:EveryInstance/*fp8*:EveryInstance/*mx*:EveryInstance/*self_route*:GpuLayerSmall.SelfRouted*:GpuLayerSmall.OneTokenRings' > $R/new_gpu_tests.txt 2>&1; stamp "new tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/new_gpu_tests.txt | head
for tool in memcheck racecheck; do
  timeout -k 5 $(left 45) compute-sanitizer --tool $tool $T --gtest_filter='GpuFp8.SelfRouted*:GpuMx.SelfRouted*' > $R/new_$tool.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/new_$tool.txt
done
pack
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in main new; do
  bench $v ab${i}_${v}_minimax-m2_fp8 20 --device cuda --model minimax-m2 --dtype fp8 --batch 1,8 --iterations 30
  bench $v ab${i}_${v}_gpt-oss-120b_mxfp4 20 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1,8 --iterations 30
  bench $v ab${i}_${v}_deepseek-v3_fp8 20 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 30
  bench $v ab${i}_${v}_qwen3-30b-a3b_bf16 20 --device cuda --model qwen3-30b-a3b --batch 1 --iterations 30
done; pack; done
bench new trace_new_minimax-m2_fp8 20 --device cuda --model minimax-m2 --dtype fp8 --batch 1 --iterations 20 --trace
bench new trace_new_gpt-oss-120b_mxfp4 20 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1 --iterations 20 --trace
bench main trace_main_gpt-oss-120b_mxfp4 20 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1 --iterations 20 --trace
stamp done
pack
