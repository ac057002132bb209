#!/usr/bin/env bash
# Session 36 call 1: where issues 29, 30 and 31 stand with the tree of session 35, in one run:
# the layer by the plan from 1 to 16384 tokens (bf16: DeepSeek-V3, MiniMax-M3, Mixtral-8x7B,
# Qwen3-30B-A3B), fp8 at 1-128 and 4096 tokens (DeepSeek-V3, Kimi-K2, MiniMax-M2), the MX formats
# beside their bf16 layers at 1-128 tokens (gpt-oss-120b MXFP4, MiniMax-M3 MXFP8), then the fast
# CPU backend on this host's cores at one token.
# Binaries built on the development machine (build-carry/bins.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 565 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" > $R/host_cpu.txt; cat $R/host_cpu.txt
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
M=/tmp/bin/moekit
$M list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
bench() {  # name, timeout, -- moekit bench args
  local name=$1 lim=$2; shift 2
  ( timeout $(left $lim) $M bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"; tail -1 $R/$name.err
}
ALL=1,8,32,128,256,512,1024,2048,4096,8192,16384
for m in deepseek-v3 minimax-m3 mixtral-8x7b qwen3-30b-a3b; do
  bench layer_${m}_bf16 75 --device cuda --model $m --dtype bf16 --batch $ALL --iterations 5
  pack
done
for m in deepseek-v3 kimi-k2 minimax-m2; do
  bench layer_${m}_fp8 50 --device cuda --model $m --dtype fp8 --batch 1,8,32,128,4096 --iterations 10
done
pack
for spec in "gpt-oss-120b mxfp4" "gpt-oss-120b bf16" "minimax-m3 mxfp8"; do
  set -- $spec
  bench mx_$1_$2 40 --device cuda --model $1 --dtype $2 --batch 1,8,32,128 --iterations 20
done
pack
for spec in "deepseek-v3 fp8" "gpt-oss-120b mxfp4" "minimax-m3 mxfp8"; do
  set -- $spec
  bench cpu_$1_$2 60 --device cpu --model $1 --dtype $2 --batch 1 --threads 0 --iterations 10
done
stamp done
pack
