#!/usr/bin/env bash
# Session 36 call 6: the fp8 permute and activation with a half-warp's groups loaded before it
# quantises the first (4 loads in flight a lane) against the tree of call 4 (base.tar.xz),
# alternating, two rounds, DeepSeek-V3 and MiniMax-M2 fp8 at 1024 and 4096 tokens; the fp8
# permute and activation under ncu; the fp8 prefill tests, memcheck on the quantiser's.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/new /tmp/base
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 185 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
tar -xJf build-carry/bins.tar.xz -C /tmp/new; tar -xJf build-carry/base.tar.xz -C /tmp/base moekit
for round in 1 2; do
  for b in base new; do
    for m in deepseek-v3 minimax-m2; do
      ( timeout $(left 25) /tmp/$b/moekit bench --device cuda --model $m --dtype fp8 --batch 1024,4096 --iterations 10 --json ) > $R/fp8q${round}_${b}_$m.json 2> $R/fp8q${round}_${b}_$m.err
      stamp "round $round $b $m rc=$?"
    done
  done
  pack
done
T=/tmp/new/moekit_cuda_tests
( timeout $(left 60) $T --gtest_filter='GpuPrefillFp8.*' --gtest_brief=1 ) > $R/gpu_tests_fp8.txt 2>&1
stamp "tests rc=$?"; tail -2 $R/gpu_tests_fp8.txt
( timeout $(left 30) compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='GpuPrefillFp8.QuantiserBitExactAgainstReference' ) > $R/memcheck_fp8.txt 2>&1
stamp "memcheck rc=$?"; tail -1 $R/memcheck_fp8.txt
pack
( timeout $(left 25) ncu --clock-control none -k regex:prefill_ --metrics gpu__time_duration.sum --csv --page raw \
    /tmp/new/moekit run --device cuda --model deepseek-v3 --expert-dtype fp8 --tokens 4096 ) > $R/ncu_new_deepseek-v3_fp8.csv 2> $R/ncu_new.err
stamp "ncu rc=$?"
stamp done
pack
