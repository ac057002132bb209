#!/usr/bin/env bash
# Session 34 call 2: the fp8 crossover rule (the prefill path from 2 routed tokens per expert)
# against the decode kernels, twice, on DeepSeek-V3, MiniMax-M2 and Kimi-K2 at 48-192 tokens;
# the plan tests on the GPU. Binaries built on the development machine (build-carry/bins.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 400 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
M=/tmp/bin/moekit; T=/tmp/bin/moekit_cuda_tests
$M list-kernels > /dev/null 2>&1 || { stamp "carried binaries do not run"; exit 1; }
for round in 1 2; do
  for spec in "deepseek-v3 48,64,80,96,128" "minimax-m2 48,64,80,96,128" "kimi-k2 64,96,128,192"; do
    set -- $spec
    for how in rule decode; do
      env=X=1; [ $how = decode ] && env=MOEKIT_EXPERTS_GROUPED_FROM=0
      ( timeout $(left 60) env $env $M bench --device cuda --model $1 --dtype fp8 --batch $2 --fuse-shared auto --iterations 5 --json ) > $R/cross${round}_$1_$how.json 2> $R/cross${round}_$1_$how.err
      stamp "round $round $1 $how rc=$?"; tail -1 $R/cross${round}_$1_$how.err
    done
  done
  pack
done
( timeout $(left 120) $T --gtest_filter='*Plan*:*Fp8*' --gtest_brief=1 ) > $R/gpu_tests_plan_fp8.txt 2>&1
stamp "tests rc=$?"; tail -3 $R/gpu_tests_plan_fp8.txt
pack
