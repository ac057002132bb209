#!/usr/bin/env bash
# Session 40 call 2: the routing kernel's warm pass (branch s40-routing-warm, through its temporary
# hook MOEKIT_TMP_ROUTING_WARM=16): the routing and layer GPU tests with it on, then decode of
# DeepSeek-V3 / Kimi-K2 / MiniMax-M2 fp8 and DeepSeek-V3 bf16 at 1 / 8 tokens, off and on
# alternating, two rounds, and its timeline. Then the fast CPU backend on the host's cores,
# main against new (the down bias added in the down units; the combine sums w * down). phase_probe (phase_probe.cpp, linked
# against the CPU-only libmoekit.a of each tree): the forward's phases, router_logits after a
# forward and again, the routing alone and an empty parallel round trip, medians; then
# `moekit bench --device cpu` of both, alternating.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" > $R/host_cpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
MOEKIT_TMP_ROUTING_WARM=16 timeout $(left 120) /tmp/new/moekit_cuda_tests --gtest_filter='GpuRouting*:GpuLayer.*:GpuLayerSmall*:GpuFp8*:EngineGpu*' > $R/warm_gpu_tests.txt 2>&1; stamp "warm tests rc=$?"
grep -E "PASSED|FAILED" $R/warm_gpu_tests.txt
gbench() {  # name, warm (0: off), timeout, -- moekit bench args
  local name=$1 warm=$2 lim=$3; shift 3
  if [ $warm = 0 ]; then unset MOEKIT_TMP_ROUTING_WARM; else export MOEKIT_TMP_ROUTING_WARM=$warm; fi
  ( timeout $(left $lim) /tmp/new/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"; unset MOEKIT_TMP_ROUTING_WARM
}
for md in deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8 deepseek-v3:bf16; do
  for i in 1 2; do for w in 0 16; do
    gbench warm${i}_${w}_${md%:*}_${md#*:} $w 15 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8 --iterations 20
  done; done
done
gbench trace_warm_deepseek-v3_fp8 16 15 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
gbench trace_base_deepseek-v3_fp8 0 15 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
pack
for i in 1 2; do for v in main new; do
  for m in gpt-oss-120b minimax-m2; do
    timeout $(left 60) /tmp/new/phase_probe_$v $m 0 60 >> $R/probe_$m.txt 2>&1; stamp "probe $v $m rc=$?"
  done
done; done
cat $R/probe_*.txt
pack
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in main new; do
  bench $v cpu${i}_${v}_gpt-oss-120b_mxfp4 40 --device cpu --model gpt-oss-120b --dtype mxfp4 --batch 1 --threads 0 --iterations 40
done; done
for v in main new; do
  bench $v cpu_${v}_minimax-m2_fp8 40 --device cpu --model minimax-m2 --dtype fp8 --batch 1 --threads 0 --iterations 40
done
stamp done
pack
