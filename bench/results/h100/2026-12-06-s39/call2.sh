#!/usr/bin/env bash
# Session 39 call 2: where the tree of call 1 (new) stands. Decode of the fp8 layers
# (DeepSeek-V3, Kimi-K2, MiniMax-M2) and the MX layers (gpt-oss-120b MXFP4, MiniMax-M3 MXFP8) at
# 1 / 8 / 32 / 128 tokens, each beside its bf16 layer at 1 and 32; prefill at 1024 / 4096 tokens
# (DeepSeek-V3 bf16 and fp8, MiniMax-M3, Mixtral-8x7B, Qwen3-30B-A3B); then the fast CPU backend
# on the host's cores (gpt-oss-120b MXFP4 at one token), new and cpubase (3d67ad1: before the
# VBMI rows and the big units) alternating.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 575 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3|Flags" > $R/host_cpu.txt
for v in new cpubase; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
/tmp/new/moekit list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for m in deepseek-v3 kimi-k2 minimax-m2; do
  bench new dec_${m}_fp8 40 --device cuda --model $m --dtype fp8 --batch 1,8,32,128
done
bench new dec_deepseek-v3_bf16 40 --device cuda --model deepseek-v3 --dtype bf16 --batch 1,32
pack
bench new dec_gpt-oss-120b_mxfp4 40 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1,8,32,128
bench new dec_gpt-oss-120b_bf16 30 --device cuda --model gpt-oss-120b --dtype bf16 --batch 1,32
bench new dec_minimax-m3_mxfp8 40 --device cuda --model minimax-m3 --dtype mxfp8 --batch 1,8,32,128
bench new dec_minimax-m3_bf16 30 --device cuda --model minimax-m3 --dtype bf16 --batch 1,32
pack
for md in deepseek-v3:bf16 deepseek-v3:fp8 minimax-m3:bf16 mixtral-8x7b:bf16 qwen3-30b-a3b:bf16; do
  bench new pre_${md%:*}_${md#*:} 40 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1024,4096
done
pack
for i in 1; do
  for v in new cpubase; do
    bench $v cpu${i}_${v}_gpt-oss-120b_mxfp4 110 --device cpu --model gpt-oss-120b --dtype mxfp4 --batch 1 --threads 0 --iterations 20
    pack
  done
done
stamp done
pack
