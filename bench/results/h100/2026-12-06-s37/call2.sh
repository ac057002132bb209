#!/usr/bin/env bash
# Session 37 call 2: the fast CPU backend on this host's cores at one token, the thread pool
# whose workers spin between phases with the router split by its saved MACs (new) against the
# tree of session 36 (base), alternating: gpt-oss-120b MXFP4, MiniMax-M2 fp8, Kimi-K2 fp8 (the
# new records carry each phase's median time, phase_us); then
# the GPU layer of DeepSeek-V3 and Kimi-K2 fp8 at 1 / 32 / 128 tokens, twice (run to run).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 400 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" > $R/host_cpu.txt
for v in base new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
/tmp/new/moekit list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"; tail -1 $R/$name.err
}
for spec in "gpt-oss-120b mxfp4" "minimax-m2 fp8" "kimi-k2 fp8"; do
  set -- $spec
  for v in new base; do
    bench $v cpu_${v}_$1_$2 90 --device cpu --model $1 --dtype $2 --batch 1 --threads 0 --iterations 20
    pack
  done
done
for i in 1 2; do
  for m in deepseek-v3 kimi-k2; do
    bench new gpu${i}_${m}_fp8 30 --device cuda --model $m --dtype fp8 --batch 1,32,128 --iterations 20
  done
done
stamp done
pack
