#!/usr/bin/env bash
# Session 46 run 4. build-carry/bias2.tar.xz: the landed tree's machine code (fe258e9: the MX
# ring's items bring their biases; its binary is run 3's bias2, whose kernels' SASS equals
# fe258e9's); build-carry/base46.tar.xz: the tree before (5b7802a). The MX GPU tests, then base46
# and bias2 alternating on gpt-oss-120b MXFP4 and MiniMax-M3 MXFP8 at 1-128 tokens, two rounds,
# and the landed tree's fp8 layers (DeepSeek-V3, Kimi-K2) at 1-128 tokens, where an H200 came.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 300 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in base46 bias2; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 60) /tmp/bias2/moekit_cuda_tests --gtest_filter='GpuMx.ForwardMatchesTheCpuReference:EveryInstance/*mx*' > $R/gpu_tests_bias2.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_bias2.txt
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in base46 bias2; do
  for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
    bench ab${i}_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 30
  done
done; pack; done
for m in deepseek-v3 kimi-k2; do
  bench fp8_bias2_${m}_fp8 30 bias2 --device cuda --model $m --dtype fp8 --batch 1,8,32,128 --iterations 30
done
pack
stamp done
