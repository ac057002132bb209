#!/usr/bin/env bash
# Session 36 call 5: the segment sizes of the prefill permute and activation kernels: the tree
# before (base.tar.xz), segments of 2 KB / 1024 columns / 8 fp8 groups (bins.tar.xz, call 4) and
# of 1 KB / 512 / 4 (small.tar.xz), alternating, two rounds, at 256 and 4096 tokens.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/base /tmp/seg /tmp/small
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 190 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
tar -xJf build-carry/base.tar.xz -C /tmp/base moekit; tar -xJf build-carry/bins.tar.xz -C /tmp/seg moekit
tar -xJf build-carry/small.tar.xz -C /tmp/small
for round in 1 2; do
  for b in base seg small; do
    for spec in "mixtral-8x7b bf16" "qwen3-30b-a3b bf16" "deepseek-v3 fp8"; do
      set -- $spec
      ( timeout $(left 30) /tmp/$b/moekit bench --device cuda --model $1 --dtype $2 --batch 256,4096 --iterations 10 --json ) > $R/seg${round}_${b}_$1_$2.json 2> $R/seg${round}_${b}_$1_$2.err
      stamp "round $round $b $1 $2 rc=$?"
    done
  done
  pack
done
stamp done
