#!/usr/bin/env bash
# Session 42, prepared and not run (no device time was left): branch s42-fp8-acts-l1 ("new":
# the gate/up consumers of the rings of weights only, 2-32 tokens, load their activations, x8
# and its scales (fp8) or x (bf16), through L1) against main at 3d0a103, where run 2's
# per-instruction samples (an H100, DeepSeek-V3 fp8 at 8 tokens) put 37% of the gate/up
# kernel's samples on the first conversion, waiting for those loads from L2. new's GPU tests
# of the layer; DeepSeek-V3, Kimi-K2 and MiniMax-M2 fp8 at 1 / 8 / 32 tokens (1: the one-token
# rings, unchanged) and Qwen3-30B-A3B and DeepSeek-V3 bf16 at 8 / 32, main and new
# alternating, two rounds. Build both trees and carry build-carry/{main,new}.tar.xz (moekit
# of each, moekit_cuda_tests of new); on an H200 the fp8 targets are set.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 300 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout $(left 90) /tmp/new/moekit_cuda_tests --gtest_filter='GpuFp8*:EngineFp8Gpu*:GpuLayer*:EveryInstance/*:AllFamilies/*' > $R/new_gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/new_gpu_tests.txt | head
for i in 1 2; do for v in main new; do
  for md in deepseek-v3:fp8:1,8,32 kimi-k2:fp8:1,8,32 minimax-m2:fp8:1,8,32 qwen3-30b-a3b:bf16:8,32 deepseek-v3:bf16:8,32; do
    IFS=: read m d b <<< "$md"
    ( timeout $(left 25) /tmp/$v/moekit bench --device cuda --model $m --dtype $d --batch $b --iterations 20 --json ) > $R/ab${i}_${v}_${m}_$d.json 2> $R/ab${i}_${v}_${m}_$d.err
    stamp "ab$i $v $m $d rc=$?"
  done
done; pack; done
stamp done
pack
