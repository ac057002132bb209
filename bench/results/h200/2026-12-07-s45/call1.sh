#!/usr/bin/env bash
# Session 45 run 1. One binary, branch s45-claim-ahead (on s45-self-route-shared: the gate/up
# kernel self-routes at one token with the shared experts fused too; and the experiment
# MOEKIT_EXPERTS_CLAIM_AHEAD, the items a producer claims ahead of the one it issues where its
# lists are in registers: 2, the tree before, 1 or 0), carried as build-carry/new.tar.xz (moekit
# and moekit_cuda_tests). On any GPU: its GPU tests of the self-routing, fp8, MX and small layers
# and the instances, again with claims 0 and 1 items ahead; memcheck and racecheck on the
# self-routing tests; the A/B at one token with MOEKIT_EXPERTS_SELF_ROUTE=0 (the routing kernel
# and the plain gate/up instance: main's plan and kernels) against the default on the layers whose
# plan changes, and the claim look-ahead 2 / 1 / 0, two rounds each, alternating; the timelines of
# DeepSeek-V3 fp8 at one token for each; the down kernel's dynamic tail at one token (DOWN_TAIL=20
# against 0: DeepSeek-V3, Kimi-K2 fp8); the tree before (build-carry/base.tar.xz, afc38f7's
# moekit) against this binary at its defaults. On an H200 then: the decode layers at 1-128 tokens.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
mkdir -p /tmp/new; tar -xJf build-carry/new.tar.xz -C /tmp/new
S=/tmp/new/moekit_cuda_tests
timeout -k 5 $(left 120) $S --gtest_filter='*SelfRouted*:EveryInstance/*self_route*:GpuFp8*:GpuMx*:GpuLayerSmall*' > $R/gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests.txt
for ca in 0 1; do
  MOEKIT_EXPERTS_CLAIM_AHEAD=$ca timeout -k 5 $(left 45) $S --gtest_filter='*SelfRouted*:GpuFp8.*:GpuLayerSmall.Bulk*' > $R/gpu_tests_ca$ca.txt 2>&1; stamp "tests claim_ahead=$ca rc=$?"
  grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_ca$ca.txt
done
for tool in memcheck racecheck; do
  MOEKIT_EXPERTS_CLAIM_AHEAD=0 timeout -k 5 $(left 60) compute-sanitizer --tool $tool $S --gtest_filter='*SelfRouted*' > $R/$tool.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/$tool.txt
done
pack
bench() {  # name, timeout, env..., -- moekit bench args
  local name=$1 lim=$2; shift 2
  local envs=(); while [[ $1 == *=* ]]; do envs+=("$1"); shift; done
  ( env "${envs[@]}" timeout -k 5 $(left $lim) /tmp/new/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
SR_MODELS="deepseek-v3:fp8 glm-4.5:fp8 deepseek-v4-flash:fp8 glm-5:fp8 minimax-m3:mxfp8 qwen2-57b-a14b:bf16 deepseek-v2-lite:bf16 minimax-m3:bf16"
for i in 1 2; do for sr in 0 1; do
  for md in $SR_MODELS; do
    bench sr${i}_${sr}_${md%:*}_${md#*:} 20 MOEKIT_EXPERTS_SELF_ROUTE=$sr --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1 --iterations 30
  done
done; pack; done
CA_MODELS="deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8 gpt-oss-120b:mxfp4 minimax-m3:mxfp8 qwen3-30b-a3b:bf16 deepseek-v3:bf16"
for i in 1 2; do for ca in 2 1 0; do
  for md in $CA_MODELS; do
    bench ca${i}_${ca}_${md%:*}_${md#*:} 20 MOEKIT_EXPERTS_CLAIM_AHEAD=$ca --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,2 --iterations 30
  done
done; pack; done
# the down kernel's dynamic tail at one token (its fp8 instance on the ring of weights only)
for i in 1 2; do for dt in 0 20; do for m in deepseek-v3 kimi-k2; do
  bench dt${i}_${dt}_${m}_fp8 20 MOEKIT_EXPERTS_DOWN_TAIL=$dt --device cuda --model $m --dtype fp8 --batch 1 --iterations 30
done; done; done
for v in sr0 ca2 ca1 ca0; do
  e=MOEKIT_EXPERTS_CLAIM_AHEAD=${v#ca}; [ $v = sr0 ] && e=MOEKIT_EXPERTS_SELF_ROUTE=0
  bench trace_${v}_deepseek-v3_fp8 20 $e --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
done
pack
# the tree before (base, afc38f7) against this binary at its defaults (claims 2 ahead), where the
# plan is the same: the cost of the look-ahead's run-time test
mkdir -p /tmp/base; tar -xJf build-carry/base.tar.xz -C /tmp/base
for i in 1 2; do for v in base new; do
  for md in kimi-k2:fp8 minimax-m2:fp8 gpt-oss-120b:mxfp4 deepseek-v3:bf16; do
    ( timeout -k 5 $(left 20) /tmp/$v/moekit bench --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8 --iterations 30 --json ) > $R/bn${i}_${v}_${md%:*}_${md#*:}.json 2> $R/bn${i}_${v}_${md%:*}_${md#*:}.err
    stamp "bn${i}_${v}_$md rc=$?"
  done
done; pack; done
grep -q H200 $R/gpu.txt || { stamp done; exit 0; }
for md in deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8 gpt-oss-120b:mxfp4 minimax-m3:mxfp8 deepseek-v3:bf16 qwen3-30b-a3b:bf16; do
  bench dec_${md%:*}_${md#*:} 30 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 20
done
stamp done
pack
