#!/usr/bin/env bash
# Session 35 call 1: where the prefill layer's time goes at 4096 tokens (each kernel's time under
# ncu, caches flushed, clocks left alone, beside the layer's graph-replay time), and what limits the
# MXFP4 decode kernels (ncu's scheduler, warp-state and instruction sections) at 1 and 32 tokens.
# Binaries built on the development machine (build-carry/bins.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
which ncu; ncu --version | tail -1
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
M=/tmp/bin/moekit; T=/tmp/bin/moekit_cuda_tests
$M list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
# 1. the layer at 4096 tokens (graph replay), then each of its kernels under ncu
layer_and_ncu() {
  ( timeout $(left 60) $M bench --device cuda --model $1 --dtype $2 --batch 4096 --fuse-shared auto --iterations 5 --json ) > $R/layer_$1_$2.json 2> $R/layer_$1_$2.err
  stamp "layer $1 $2 rc=$?"; tail -1 $R/layer_$1_$2.err
  ( timeout $(left 70) ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
      $M bench --device cuda --model $1 --dtype $2 --batch 4096 --fuse-shared auto --iterations 1 ) > $R/ncu_$1_$2.csv 2> $R/ncu_$1_$2.err
  stamp "ncu $1 $2 rc=$?"; tail -2 $R/ncu_$1_$2.err
  pack
}
layer_and_ncu deepseek-v3 bf16
# 2. the MXFP4 decode kernels at 1 and 32 tokens: the layer, then ncu's sections on the bulk kernels
for b in 1 32; do
  ( timeout $(left 40) $M bench --device cuda --model gpt-oss-120b --dtype mxfp4 --batch $b --iterations 20 --json ) > $R/layer_gpt-oss-120b_mxfp4_$b.json 2> $R/layer_gpt-oss-120b_mxfp4_$b.err
  stamp "layer mxfp4 $b rc=$?"; tail -1 $R/layer_gpt-oss-120b_mxfp4_$b.err
  ( timeout $(left 90) ncu --clock-control none -k regex:bulk --launch-skip 20 --launch-count 4 \
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      $M bench --device cuda --model gpt-oss-120b --dtype mxfp4 --batch $b --iterations 2 ) > $R/ncu_mxfp4_$b.txt 2>&1
  stamp "ncu mxfp4 $b rc=$?"
  pack
done
for spec in "deepseek-v3 fp8" "minimax-m3 bf16" "qwen3-30b-a3b bf16" "mixtral-8x7b bf16"; do layer_and_ncu $spec; done
stamp done
pack
