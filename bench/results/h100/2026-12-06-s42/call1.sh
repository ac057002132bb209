#!/usr/bin/env bash
# Session 42 run 1 (an H200; on an H100, the ncu part only): the 128-row cooperative grouped GEMM forced against the plan's
# 64-row ping-pong where experts hold 256 to 1024 routed rows (what session 41 found faster on an
# H100), alternating, two rounds; what bounds main's fp8 and MXFP4 decode kernels where the read
# bandwidth does not (ncu's sections and per-instruction stall samples on the bulk kernels,
# clocks left alone); the prefill of the models session 40's run 3 did not reach. Carry
# build-carry/main.tar.xz (moekit and moekit_cuda_tests of main).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/main
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
tar -xJf build-carry/main.tar.xz -C /tmp/main
M=/tmp/main/moekit
$M plan --device-info live --model mixtral-8x7b --batch 1024,4096 > $R/plan_live_mixtral.txt 2>&1
tile() {  # round
  for v in plan coop; do
    for md in mixtral-8x7b:1024,2048,4096 qwen3-30b-a3b:4096 qwen2-57b-a14b:4096; do
      ( [ $v = coop ] && export MOEKIT_EXPERTS_GROUPED_GEMM=grouped_bf16_128x256_coop
        timeout $(left 30) $M bench --device cuda --model ${md%:*} --dtype bf16 --batch ${md#*:} --iterations 10 --json ) > $R/tile$1_${v}_${md%:*}.json 2> $R/tile$1_${v}_${md%:*}.err
      stamp "tile$1 $v $md rc=$?"
    done
  done
  pack
}
prof() {  # name, model, dtype, batch
  ( timeout $(left 70) ncu --clock-control none -k regex:experts_bulk --launch-skip 8 --launch-count 2 \
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
      --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      $M bench --device cuda --model $2 --dtype $3 --batch $4 --iterations 2 ) > $R/ncu_$1.txt 2>&1
  stamp "ncu $1 rc=$?"
  ( timeout $(left 70) ncu --clock-control none -k regex:experts_bulk --launch-skip 8 --launch-count 2 \
      --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
      $M bench --device cuda --model $2 --dtype $3 --batch $4 --iterations 2 ) > $R/ncusrc_$1.csv 2>&1
  stamp "ncusrc $1 rc=$?"
  python3 scripts/ncu_source_summary.py $R/ncusrc_$1.csv 25 > $R/ncusrc_$1.txt 2>&1; gzip $R/ncusrc_$1.csv
  pack
}
if grep -q H200 $R/gpu.txt; then
  tile 1
  prof deepseek-v3_fp8_8 deepseek-v3 fp8 8
  for md in mixtral-8x7b:bf16 qwen3-30b-a3b:bf16 minimax-m2:fp8 minimax-m2:bf16; do
    ( timeout $(left 40) $M bench --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1024,4096 --json ) > $R/pre_${md%:*}_${md#*:}.json 2> $R/pre_${md%:*}_${md#*:}.err
    stamp "pre $md rc=$?"
  done
  pack
  prof gpt-oss-120b_mxfp4_1 gpt-oss-120b mxfp4 1
  tile 2
else  # an H100: the pipes' use per byte, which the H200's 1.42x the bytes per SM cycle scales
  prof deepseek-v3_fp8_8 deepseek-v3 fp8 8
  prof gpt-oss-120b_mxfp4_1 gpt-oss-120b mxfp4 1
  prof gpt-oss-120b_mxfp4_32 gpt-oss-120b mxfp4 32
  prof minimax-m2_fp8_1 minimax-m2 fp8 1
fi
stamp done
pack
