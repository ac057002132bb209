#!/usr/bin/env bash
# Session 35 call 3: the prefill plan in two launches over up to 32 CTA ranges (count, then
# offsets and placement) instead of one CTA: every GPU test, memcheck and racecheck on the small
# prefill case, each plan kernel's time under ncu, and the layer at 1024 / 4096 tokens against
# the tree before (base), alternating, two rounds.
# Binaries built on the development machine: build-carry/bins.tar.xz (this tree), base.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin /tmp/base
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
tar -xJf build-carry/bins.tar.xz -C /tmp/bin; tar -xJf build-carry/base.tar.xz -C /tmp/base
M=/tmp/bin/moekit; T=/tmp/bin/moekit_cuda_tests; B=/tmp/base/moekit
$M list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
# 1. the layer, base and this tree alternating, two rounds
for round in 1 2; do
  for spec in "qwen3-30b-a3b bf16" "deepseek-v3 bf16" "deepseek-v3 fp8" "mixtral-8x7b bf16" "minimax-m3 bf16"; do
    set -- $spec
    for which in base new; do
      bin=$M; [ $which = base ] && bin=$B
      ( timeout $(left 40) $bin bench --device cuda --model $1 --dtype $2 --batch 1024,4096 --fuse-shared auto --iterations 10 --json ) > $R/layer${round}_$1_$2_$which.json 2> $R/layer${round}_$1_$2_$which.err
      stamp "layer$round $1 $2 $which rc=$?"
    done
  done
  pack
done
# 2. the plan kernels' times under ncu (this tree, then base's one-CTA kernel)
for spec in "qwen3-30b-a3b bf16" "deepseek-v3 bf16"; do
  set -- $spec
  for which in new base; do
    bin=$M; [ $which = base ] && bin=$B
    ( timeout $(left 40) ncu --clock-control none -k regex:prefill_ --metrics gpu__time_duration.sum --csv --page raw $bin bench --device cuda --model $1 --dtype $2 --batch 4096 --fuse-shared auto --iterations 1 ) > $R/ncu_plan_$1_$2_$which.csv 2> $R/ncu_plan_$1_$2_$which.err
    stamp "ncu $1 $which rc=$?"
  done
done
pack
# 3. every GPU test; memcheck and racecheck on the small prefill case
( time timeout $(left 260) $T --gtest_brief=1 ) > $R/gpu_tests.txt 2>&1
stamp "gpu tests rc=$?"; grep -E "FAILED|Failure" $R/gpu_tests.txt | head -10; tail -4 $R/gpu_tests.txt
pack
for tool in memcheck racecheck; do
  ( timeout $(left 90) compute-sanitizer --tool $tool --print-limit 50 --error-exitcode 9 $T --gtest_filter='GpuPrefill.SmallCaseForSanitizers' --gtest_brief=1 ) > $R/${tool}_prefill.txt 2>&1
  stamp "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $R/${tool}_prefill.txt | tail -2
done
stamp done
pack
