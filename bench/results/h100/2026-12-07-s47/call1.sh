#!/usr/bin/env bash
# Session 47 run 1. build-carry/dbg47.tar.xz: a debug timeline (branch s47-dbg, not for main):
# CTA 5 of the 26th launch of each MX kernel records, per stage, when consumer warp 0 found it
# full, finished the item's start, had its activations, its weights and scales, its mma, and
# released it (SM clocks). build-carry/main47.tar.xz: main's moekit (fe258e9's kernels): the
# issues' layers on this GPU (fp8 and MX at 1-128 tokens, bf16 beside them, prefill at 4096).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 480 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in dbg47 main47; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for md in gpt-oss-120b:mxfp4:1 gpt-oss-120b:mxfp4:32 minimax-m3:mxfp8:1 minimax-m3:mxfp8:32; do
  IFS=: read m d b <<< "$md"
  ( timeout -k 5 $(left 30) /tmp/dbg47/moekit bench --device cuda --model $m --dtype $d --batch $b --iterations 30 ) > $R/dbg_${m}_${d}_$b.txt 2>&1
  stamp "dbg $m $d $b rc=$?"
done
pack
grep -h "c_\|cons0\|end" $R/dbg_gpt-oss-120b_mxfp4_1.txt | head -20
for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8 gpt-oss-120b:bf16 minimax-m3:bf16 deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8; do
  bench base_${md%:*}_${md#*:} 40 main47 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 30
done
pack
for md in deepseek-v3:bf16 minimax-m3:bf16 qwen3-30b-a3b:bf16 mixtral-8x7b:bf16 deepseek-v3:fp8; do
  bench prefill_${md%:*}_${md#*:} 60 main47 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 4096 --iterations 5
done
pack
stamp done
