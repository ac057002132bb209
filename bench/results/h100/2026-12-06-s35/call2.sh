#!/usr/bin/env bash
# Session 35 call 2: the MX decode kernels keeping a stage's activations in registers while the
# activation row and chunk repeat, against the tree before (base), alternating, gpt-oss-120b MXFP4
# and MiniMax-M3 MXFP8 at 1-128 tokens, with the MX GPU tests and memcheck; then the grouped
# GEMMs' tile-scheduler raster order and swizzle at 4096 tokens (each GEMM alone, and the layer).
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
# 1. the MX GPU tests and memcheck on their small shapes
( time timeout $(left 120) $T --gtest_filter='GpuMx*:GpuPrefillMx*' --gtest_brief=1 ) > $R/tests_mx.txt 2>&1
stamp "mx tests rc=$?"; grep -E "FAILED|Failure|PASSED" $R/tests_mx.txt | head -5
( timeout $(left 120) compute-sanitizer --tool memcheck --print-limit 50 --error-exitcode 9 $T --gtest_filter='GpuMxSmall.*' --gtest_brief=1 ) > $R/memcheck_mx.txt 2>&1
stamp "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/memcheck_mx.txt | tail -2
pack
# 2. the MX layer, base and this tree alternating, two rounds
for round in 1 2; do
  for spec in "gpt-oss-120b mxfp4" "minimax-m3 mxfp8"; do
    set -- $spec
    for which in base new; do
      bin=$M; [ $which = base ] && bin=$B
      ( timeout $(left 40) $bin bench --device cuda --model $1 --dtype $2 --batch 1,8,32,128 --fuse-shared auto --iterations 20 --json ) > $R/mx${round}_$1_$2_$which.json 2> $R/mx${round}_$1_$2_$which.err
      stamp "mx$round $1 $2 $which rc=$?"; grep "batch" $R/mx${round}_$1_$2_$which.err | head -4
    done
  done
done
( timeout $(left 40) $M bench --device cuda --model gpt-oss-120b --dtype bf16 --batch 1,8,32,128 --iterations 20 --json ) > $R/bf16_gpt-oss-120b.json 2> $R/bf16_gpt-oss-120b.err
stamp "gpt-oss bf16 rc=$?"
pack
# 3. the grouped GEMMs alone at 4096 tokens under each raster order / swizzle, then the layer
for m in "deepseek-v3 bf16" "mixtral-8x7b bf16" "deepseek-v3 fp8" "qwen3-30b-a3b bf16"; do
  set -- $m
  for rs in m1 n1 m2 m4 n4; do
    ( timeout $(left 40) env MOEKIT_GROUPED_RASTER=${rs:0:1} MOEKIT_GROUPED_SWIZZLE=${rs:1} $M bench grouped-gemm --model $1 --dtype $2 --batch 4096 --json ) > $R/gg_$1_$2_$rs.json 2> $R/gg_$1_$2_$rs.err
    stamp "gg $1 $2 $rs rc=$?"
  done
  pack
done
for rs in m1 n1 m4 m1b; do
  ( timeout $(left 40) env MOEKIT_GROUPED_RASTER=${rs:0:1} MOEKIT_GROUPED_SWIZZLE=${rs:1:1} $M bench --device cuda --model deepseek-v3 --dtype bf16 --batch 4096 --fuse-shared auto --iterations 5 --json ) > $R/layer_deepseek-v3_bf16_$rs.json 2> $R/layer_deepseek-v3_bf16_$rs.err
  stamp "layer $rs rc=$?"; grep batch $R/layer_deepseek-v3_bf16_$rs.err
done
stamp done
pack
