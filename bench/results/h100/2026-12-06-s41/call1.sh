#!/usr/bin/env bash
# Session 41 run 1: the fp8 consumers' own conversions (branch s40-fp8-f16-mma, "f16": the
# weights by cvt once for every n-tile, the activations by bit moves, f16 mma steps) against main
# (ptxas's e4m3 mma). Carry build-carry/{main,f16}.tar.xz (moekit and moekit_cuda_tests of each
# tree). The f16 tree's fp8 GPU tests (GpuFp8Mma: exact on subnormal codes; the layer and engine
# against the CPU reference), memcheck on its fp8 kernels; DeepSeek-V3 / Kimi-K2 / MiniMax-M2 fp8
# at 1 / 8 / 32 tokens (the decode kernels' range; from 64 tokens these models take the grouped
# GEMMs), main and f16 alternating, two rounds; then main's prefill of the models run 3 of
# session 40 did not reach, and the grouped GEMM instances alone at 4096 and 16384 tokens, and
# two timelines of 4096-token layers.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 570 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $R/gpu.txt
for v in main f16; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout $(left 120) /tmp/f16/moekit_cuda_tests --gtest_filter='GpuFp8*:EngineFp8Gpu*:GpuLayer.*:GpuEngine*' > $R/f16_gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "PASSED|FAILED" $R/f16_gpu_tests.txt
timeout $(left 120) compute-sanitizer --tool memcheck /tmp/f16/moekit_cuda_tests --gtest_filter='GpuFp8Small*:GpuFp8Mma*' > $R/f16_memcheck.txt 2>&1; stamp "memcheck rc=$?"
tail -2 $R/f16_memcheck.txt
pack
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for m in deepseek-v3 kimi-k2 minimax-m2; do
  for i in 1 2; do for v in main f16; do
    bench $v ab${i}_${v}_${m} 20 --device cuda --model $m --dtype fp8 --batch 1,8,32 --iterations 20
  done; done
  pack
done
for md in minimax-m2:fp8 mixtral-8x7b:bf16 qwen3-30b-a3b:bf16 minimax-m2:bf16; do
  bench main pre_${md%:*}_${md#*:} 40 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1024,4096
  pack
done
gg() {  # name, timeout, -- grouped-gemm args
  local name=$1 lim=$2; shift 2
  ( timeout $(left $lim) /tmp/main/moekit bench grouped-gemm "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for md in deepseek-v3:bf16 deepseek-v3:fp8 mixtral-8x7b:bf16 qwen3-30b-a3b:bf16; do
  gg gg_${md%:*}_${md#*:} 40 --model ${md%:*} --dtype ${md#*:} --batch 4096,16384
done
pack
bench main trace_deepseek-v3_bf16_4096 30 --device cuda --model deepseek-v3 --dtype bf16 --batch 4096 --fuse-shared on --trace
bench main trace_mixtral-8x7b_bf16_4096 30 --device cuda --model mixtral-8x7b --dtype bf16 --batch 4096 --trace
pack
stamp done
