#!/usr/bin/env bash
# Session 36 call 3: the prefill path's permute and activation kernels a warp a row (no 64-bit
# division per 16 bytes; bf16 and fp8) against the tree before, alternating, two rounds, the layer
# at 1024 and 4096 tokens on six models; each kernel's time under ncu at 4096 tokens (Qwen3-30B-A3B
# bf16, DeepSeek-V3 fp8) for both builds; the prefill, layer-family and MX GPU tests, memcheck and
# racecheck on the small prefill cases.
# Binaries built on the development machine: build-carry/bins.tar.xz (new), base.tar.xz (before).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/new /tmp/base
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 565 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
tar -xJf build-carry/bins.tar.xz -C /tmp/new; tar -xJf build-carry/base.tar.xz -C /tmp/base
/tmp/new/moekit list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; pack; exit 1; }
stamp start
for round in 1 2; do
  for b in base new; do
    for spec in "qwen3-30b-a3b bf16" "deepseek-v3 bf16" "deepseek-v3 fp8" "minimax-m3 bf16" "mixtral-8x7b bf16" "gpt-oss-120b mxfp4"; do
      set -- $spec
      ( timeout $(left 40) /tmp/$b/moekit bench --device cuda --model $1 --dtype $2 --batch 1024,4096 --iterations 10 --json ) > $R/layer${round}_${b}_$1_$2.json 2> $R/layer${round}_${b}_$1_$2.err
      stamp "round $round $b $1 $2 rc=$?"
    done
  done
  pack
done
for b in base new; do
  for spec in "qwen3-30b-a3b bf16" "deepseek-v3 fp8"; do
    set -- $spec
    ( timeout $(left 50) ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
        /tmp/$b/moekit bench --device cuda --model $1 --dtype $2 --batch 4096 --iterations 1 ) > $R/ncu_${b}_$1_$2.csv 2> $R/ncu_${b}_$1_$2.err
    stamp "ncu $b $1 $2 rc=$?"
  done
done
pack
T=/tmp/new/moekit_cuda_tests
( timeout $(left 200) $T --gtest_filter='GpuPrefill*:AllFamilies/GpuLayerFamily*:GpuMx*:GpuFp8*' --gtest_brief=1 ) > $R/gpu_tests.txt 2>&1
stamp "tests rc=$?"; tail -3 $R/gpu_tests.txt
for tool in memcheck racecheck; do
  ( timeout $(left 60) compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='GpuPrefill.SmallCaseForSanitizers:GpuPrefillMxSmall.*:GpuPrefillFp8.QuantiserBitExactAgainstReference' ) > $R/${tool}.txt 2>&1
  stamp "$tool rc=$?"; tail -2 $R/${tool}.txt
done
stamp done
pack
