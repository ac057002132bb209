#!/usr/bin/env bash
# Session 42 run 3: the fp8 gate/up consumers of the rings of weights only (2-32 tokens) load
# x8 and its scales through L1 (new: run 2's tree plus that change) against main (d57b2d1),
# where run 2's per-instruction samples (an H100, DeepSeek-V3 at 8 tokens) put 37% of the
# gate/up kernel's samples on the first conversion, waiting for those loads from L2. new's fp8
# GPU tests; DeepSeek-V3, Kimi-K2 and MiniMax-M2 fp8 at 1 / 8 / 32 tokens (1: the one-token
# rings, unchanged), main and new alternating, two rounds. Carry build-carry/{main,new}.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 240 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout $(left 60) /tmp/new/moekit_cuda_tests --gtest_filter='GpuFp8*:EngineFp8Gpu*:EveryInstance/*fp8*:AllFamilies/*' > $R/new_gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/new_gpu_tests.txt | head
for i in 1 2; do for v in main new; do for m in deepseek-v3 kimi-k2 minimax-m2; do
  ( timeout $(left 25) /tmp/$v/moekit bench --device cuda --model $m --dtype fp8 --batch 1,8,32 --iterations 20 --json ) > $R/ab${i}_${v}_$m.json 2> $R/ab${i}_${v}_$m.err
  stamp "ab$i $v $m rc=$?"
done; done; pack; done
stamp done
pack
