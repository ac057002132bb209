#!/usr/bin/env bash
# Session 40 call 3: call 2's GPU part again (its new binary had held a stale object), with new
# rebuilt and cut to the device time left: the routing kernel's warm pass (branch
# s40-routing-warm, hook MOEKIT_TMP_ROUTING_WARM=16) on DeepSeek-V3 / Kimi-K2 / MiniMax-M2 fp8 at
# 1 / 8 tokens, off and on alternating, two rounds; the CPU thread pool's phases (phase_probe of
# new, and of pool: one done word per worker); both timelines; the GPU tests with the warm pass;
# on an H200 only, where main stands (call 1's set) in what time is left.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 200 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
gbench() {  # name, warm (0: off), timeout, -- moekit bench args
  local name=$1 warm=$2 lim=$3; shift 3
  if [ $warm = 0 ]; then unset MOEKIT_TMP_ROUTING_WARM; else export MOEKIT_TMP_ROUTING_WARM=$warm; fi
  ( timeout $(left $lim) /tmp/new/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"; unset MOEKIT_TMP_ROUTING_WARM
}
for md in deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8; do
  for i in 1 2; do for w in 0 16; do
    gbench warm${i}_${w}_${md%:*}_${md#*:} $w 15 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8 --iterations 20
  done; done
done
pack
# the CPU thread pool: one done word per worker (pool) against the shared counter (new), in-process phases
for i in 1 2; do for v in new pool; do
  timeout $(left 30) /tmp/new/phase_probe_$v gpt-oss-120b 0 60 >> $R/probe_gpt-oss-120b.txt 2>&1; stamp "probe $v rc=$?"
done; done
cat $R/probe_gpt-oss-120b.txt
pack
gbench trace_warm_deepseek-v3_fp8 16 15 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
gbench trace_base_deepseek-v3_fp8 0 15 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
MOEKIT_TMP_ROUTING_WARM=16 timeout $(left 120) /tmp/new/moekit_cuda_tests --gtest_filter='GpuRouting*:GpuLayer.*:GpuLayerSmall*:GpuFp8*:EngineGpu*' > $R/warm_gpu_tests.txt 2>&1; stamp "warm tests rc=$?"
grep -E "PASSED|FAILED" $R/warm_gpu_tests.txt
pack
grep -q H200 $R/gpu.txt || { stamp "not an H200: no state run"; exit 0; }
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for m in deepseek-v3 kimi-k2 minimax-m2; do
  bench main dec_${m}_fp8 30 --device cuda --model $m --dtype fp8 --batch 1,8,32,128
done
bench main dec_deepseek-v3_bf16 30 --device cuda --model deepseek-v3 --dtype bf16 --batch 1,32,128
bench main dec_gpt-oss-120b_mxfp4 30 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1,8,32,128
bench main dec_gpt-oss-120b_bf16 30 --device cuda --model gpt-oss-120b --dtype bf16 --batch 1,32
bench main dec_minimax-m3_mxfp8 30 --device cuda --model minimax-m3 --dtype mxfp8 --batch 1,8,32,128
bench main dec_minimax-m3_bf16 30 --device cuda --model minimax-m3 --dtype bf16 --batch 1,32
bench main dec_qwen3-30b-a3b_bf16 30 --device cuda --model qwen3-30b-a3b --dtype bf16 --batch 1,8,32,128
pack
for md in deepseek-v3:bf16 deepseek-v3:fp8 minimax-m3:bf16 mixtral-8x7b:bf16 qwen3-30b-a3b:bf16 minimax-m2:fp8; do
  bench main pre_${md%:*}_${md#*:} 40 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1024,4096,16384
done
stamp done
pack
