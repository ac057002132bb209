#!/usr/bin/env bash
# Session 35 call 4: the shared expert on the grouped (prefill) path, fused slots against the
# dense shared MLP, at 64-8192 tokens, two rounds, with the rule of this tree (auto unfused where
# the dense shared MLP applies); the plan and prefill GPU tests on the new rule.
# Binaries built on the development machine (build-carry/bins.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 500 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
M=/tmp/bin/moekit; T=/tmp/bin/moekit_cuda_tests
$M list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
for round in 1 2; do
  for m in deepseek-v3 minimax-m3 kimi-k2 glm-4.5 qwen2-57b-a14b; do
    ( timeout $(left 50) $M bench --device cuda --model $m --dtype bf16 --batch 64,128,256,512,1024,2048,4096,8192 --fuse-shared auto --iterations 5 --json ) > $R/shared${round}_$m.json 2> $R/shared${round}_$m.err
    stamp "shared$round $m rc=$?"; grep "fused=" $R/shared${round}_$m.err | head -16
  done
  pack
done
( time timeout $(left 150) $T --gtest_filter='GpuPrefill*:GpuLayer*:*Plan*' --gtest_brief=1 ) > $R/gpu_tests_prefill_plan.txt 2>&1
stamp "gpu tests rc=$?"; grep -E "FAILED|Failure" $R/gpu_tests_prefill_plan.txt | head -10; tail -3 $R/gpu_tests_prefill_plan.txt
stamp done
pack
