#!/usr/bin/env bash
# Session 41 run 2 (at most 300 s: little device time is left): the 128-row cooperative grouped
# GEMM against the plan's 64-row ping-pong where experts hold many rows (the layer, and the GEMMs
# alone); then, on an H200 only, what bounds main's fp8 decode kernels where the read bandwidth
# does not (DeepSeek-V3 at 8 tokens, fp8 and bf16: ncu's speed-of-light, scheduler, warp-state,
# instruction and pipe sections on the bulk kernels, clocks left alone) and the prefill of the
# models session 40's run 3 did not reach. Carry build-carry/main.tar.xz (moekit of main).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/main
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 300 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
tar -xJf build-carry/main.tar.xz -C /tmp/main
M=/tmp/main/moekit
ncu --version | tail -1
prof() {  # name, model, dtype, batch
  ( timeout $(left 40) $M bench --device cuda --model $2 --dtype $3 --batch $4 --iterations 20 --json ) > $R/layer_$1.json 2> $R/layer_$1.err
  stamp "layer $1 rc=$?"
  ( timeout $(left 100) ncu --clock-control none -k regex:experts_bulk --launch-skip 8 --launch-count 2 \
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
      --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      $M bench --device cuda --model $2 --dtype $3 --batch $4 --iterations 2 ) > $R/ncu_$1.txt 2>&1
  stamp "ncu $1 rc=$?"
  pack
}
# the 128-row cooperative instance against the plan's 64-row ping-pong where experts hold many
# rows (Mixtral-8x7B at 2048 / 4096 tokens: 512 / 1024 a routed expert; Qwen3-30B-A3B at 4096:
# 256), alternating, two rounds; and the GEMMs alone in the reverse order of instances
for i in 1 2; do for v in plan coop; do
  for md in mixtral-8x7b:2048,4096 qwen3-30b-a3b:4096; do
    ( [ $v = coop ] && export MOEKIT_EXPERTS_GROUPED_GEMM=grouped_bf16_128x256_coop
      timeout $(left 40) $M bench --device cuda --model ${md%:*} --dtype bf16 --batch ${md#*:} --iterations 10 --json ) > $R/tile${i}_${v}_${md%:*}.json 2> $R/tile${i}_${v}_${md%:*}.err
    stamp "tile$i $v $md rc=$?"
  done
done; done
( timeout $(left 40) $M bench grouped-gemm --model mixtral-8x7b --batch 2048,4096 --kernels grouped_bf16_64x256_pingpong,grouped_bf16_128x256_coop --json ) > $R/gg_mixtral-8x7b_bf16.json 2> $R/gg_mixtral-8x7b_bf16.err
stamp "gg mixtral rc=$?"
pack
if grep -q H200 $R/gpu.txt; then
  prof deepseek-v3_fp8_8 deepseek-v3 fp8 8
  prof deepseek-v3_bf16_8 deepseek-v3 bf16 8
  for md in mixtral-8x7b:bf16 qwen3-30b-a3b:bf16 minimax-m2:fp8 minimax-m2:bf16; do
    ( timeout $(left 40) $M bench --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1024,4096 --json ) > $R/pre_${md%:*}_${md#*:}.json 2> $R/pre_${md%:*}_${md#*:}.err
    stamp "pre $md rc=$?"
    pack
  done
fi
stamp done
pack
