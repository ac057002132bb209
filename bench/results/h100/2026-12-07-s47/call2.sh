#!/usr/bin/env bash
# Session 47 run 2. build-carry/main47.tar.xz: main's moekit (fe258e9's kernels). ncu's
# scheduler, warp-state, instruction and source (SASS) sections on the MX bulk kernels of
# gpt-oss-120b MXFP4 at 32 and 1 tokens, and MiniMax-M3 MXFP8 at 32: whether the consumers are
# bound by issue slots or by their stalls, and at which instructions.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 400 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
ncu --version | tail -1
for v in main47; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
prof() {  # name, model, dtype, batch
  ( timeout -k 5 $(left 120) ncu --clock-control none -k regex:bulk --launch-skip 20 --launch-count 2 \
      --section SchedulerStats --section WarpStateStats --section InstructionStats --section SourceCounters \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --import-source no -o $R/$1 -f \
      /tmp/main47/moekit bench --device cuda --model $2 --dtype $3 --batch $4 --iterations 2 ) > $R/$1.log 2>&1
  stamp "$1 rc=$?"
  ncu -i $R/$1.ncu-rep --page details > $R/$1_details.txt 2>&1
  ncu -i $R/$1.ncu-rep --page source --csv --print-source sass > $R/$1_sass.csv 2>&1
  stamp "$1 export rc=$?"; pack
}
prof ncu_mxfp4_32 gpt-oss-120b mxfp4 32
prof ncu_mxfp4_1 gpt-oss-120b mxfp4 1
prof ncu_mxfp8_32 minimax-m3 mxfp8 32
stamp done
