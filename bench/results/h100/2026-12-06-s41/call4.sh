#!/usr/bin/env bash
# Session 41, prepared for an H200 and not run (no device time was left): the bf16 prefill
# layer with the 128-row cooperative grouped GEMM forced against the plan's choice (the 64-row
# ping-pong up to 4096 tokens), alternating, two rounds, where experts hold 256 to 1024 routed
# rows (what runs 2 and 3 measured on an H100). Carry build-carry/main.tar.xz (moekit of main).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/main
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 150 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
tar -xJf build-carry/main.tar.xz -C /tmp/main
M=/tmp/main/moekit
for i in 1 2; do for v in plan coop; do
  for md in mixtral-8x7b:1024,2048,4096 qwen3-30b-a3b:4096 qwen2-57b-a14b:4096; do
    ( [ $v = coop ] && export MOEKIT_EXPERTS_GROUPED_GEMM=grouped_bf16_128x256_coop
      timeout $(left 30) $M bench --device cuda --model ${md%:*} --dtype bf16 --batch ${md#*:} --iterations 10 --json ) > $R/tile${i}_${v}_${md%:*}.json 2> $R/tile${i}_${v}_${md%:*}.err
    stamp "tile$i $v $md rc=$?"
  done
done; done
tar -C $R -czf $OUT/results.tar.gz .
