#!/usr/bin/env bash
# Session 36 call 2: the MX decode kernels on half blocks (a warp's units of 64 bytes of every row,
# unit v warp v % 8's) against the tree before (whole blocks w and w + 8), alternating, two
# rounds: gpt-oss-120b MXFP4 and MiniMax-M3 MXFP8 at 1-128 tokens; each kernel's time under ncu
# at one token; the MX GPU tests, memcheck and racecheck on the new kernels.
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
T=/tmp/new/moekit_cuda_tests
( timeout $(left 120) $T --gtest_filter='GpuMx*' --gtest_brief=1 ) > $R/gpu_tests_mx.txt 2>&1
stamp "mx tests rc=$?"; tail -3 $R/gpu_tests_mx.txt
for tool in memcheck racecheck; do
  ( timeout $(left 90) compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='GpuMxSmall.*' ) > $R/${tool}_mx.txt 2>&1
  stamp "$tool rc=$?"; tail -2 $R/${tool}_mx.txt
done
pack
for round in 1 2; do
  for b in base new; do
    for spec in "gpt-oss-120b mxfp4" "minimax-m3 mxfp8"; do
      set -- $spec
      ( timeout $(left 40) /tmp/$b/moekit bench --device cuda --model $1 --dtype $2 --batch 1,8,32,128 --iterations 20 --json ) > $R/mx${round}_${b}_$1.json 2> $R/mx${round}_${b}_$1.err
      stamp "round $round $b $1 rc=$?"
    done
  done
  pack
done
for b in base new; do
  ( timeout $(left 60) ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --page raw \
      /tmp/$b/moekit bench --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1 --iterations 1 ) > $R/ncu_${b}_mxfp4_1.csv 2> $R/ncu_${b}_mxfp4_1.err
  stamp "ncu $b rc=$?"
done
stamp done
pack
