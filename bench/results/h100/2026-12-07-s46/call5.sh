#!/usr/bin/env bash
# Session 46 run 5: probes of the MX consumers (wrong results by design; branch s46-mx-probes,
# not landed). build-carry/landed.tar.xz: fe258e9's moekit (run 3's bias2); p1: the packed words
# go straight into the mma (no bit moves, no multiplies); p2: the weights come from registers
# instead of the stage (no shared-memory loads of weights); p3: both. The four alternating on
# gpt-oss-120b MXFP4 at 1 and 32 tokens and MiniMax-M3 MXFP8 at 1 token, one round, and the
# timelines at one token.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 150 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in landed p1 p2 p3; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1; do for v in landed p1 p2 p3; do
  bench ab${i}_${v}_gpt-oss-120b_mxfp4 20 $v --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1,32 --iterations 30
  bench ab${i}_${v}_minimax-m3_mxfp8 20 $v --device cuda --model minimax-m3 --dtype mxfp8 --batch 1 --iterations 30
done; pack; done
for v in landed p1 p2 p3; do
  bench trace_${v}_gpt-oss-120b_mxfp4 15 $v --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1 --iterations 20 --trace
done
pack
stamp done
