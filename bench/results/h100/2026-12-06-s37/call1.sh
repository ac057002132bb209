#!/usr/bin/env bash
# Session 37 call 1: the fast CPU backend on this host's cores at one token with the thread pool
# whose workers spin between phases (new: router threshold 1e6 MACs; alt: 1e5) against the tree
# of session 36 (base), gpt-oss-120b MXFP4 and DeepSeek-V3 fp8; the kernel timeline of one
# forward (--trace) of the fp8 and MXFP4 GPU layers at 1 token and more.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 570 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" > $R/host_cpu.txt
for v in base new alt; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
/tmp/new/moekit list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"; tail -1 $R/$name.err
}
for v in base new alt; do
  bench $v cpu_${v}_gpt-oss-120b_mxfp4 90 --device cpu --model gpt-oss-120b --dtype mxfp4 --batch 1 --threads 0 --iterations 20
done
pack
bench new trace_deepseek-v3_fp8 50 --device cuda --model deepseek-v3 --dtype fp8 --batch 1,128 --iterations 20 --trace
bench new trace_minimax-m2_fp8 40 --device cuda --model minimax-m2 --dtype fp8 --batch 1,32 --iterations 20 --trace
bench new trace_gpt-oss-120b_mxfp4 40 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1,32 --iterations 20 --trace
pack
for v in base new; do
  bench $v cpu_${v}_deepseek-v3_fp8 130 --device cpu --model deepseek-v3 --dtype fp8 --batch 1 --threads 0 --iterations 10
  pack
done
bench new cpu_new_minimax-m2_fp8 100 --device cpu --model minimax-m2 --dtype fp8 --batch 1 --threads 0 --iterations 10
stamp done
pack
