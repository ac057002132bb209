#!/usr/bin/env bash
# Session 44 run 2 (any GPU). Branch s44-shared-down-l2 ("new"), three changes at one token,
# each with its knob: (a) the fp8 one-token gate/up kernel's CTAs prefetch the fused shared
# expert's down rows into L2 after their shared items, before the routing wait
# (MOEKIT_EXPERTS_SHARED_DOWN_L2: 0 off, 1 normal priority, 2 evict-last); (b) the fp8 one-token
# gate/up kernel routes its token itself at E <= 256 without shared experts (MiniMax-M2;
# MOEKIT_EXPERTS_SELF_ROUTE=0 turns it off); (c) the fp8 one-token down kernel's consumers
# quantise h into their CTA's own rows, no quantiser launch (MOEKIT_EXPERTS_H_IN_DOWN=0 turns it
# off). Its fp8, self-route and instance GPU tests, memcheck and racecheck on the small fp8
# layers; then main (3b2436d) and new alternating, two rounds: DeepSeek-V3 and Kimi-K2 fp8 (new,
# and new with each of (a) off / evict-last and (c) off), MiniMax-M2 fp8 (new, and (b) off, (c)
# off) at one token, main and new at 8; new's timelines at one token, all on and all off.
# Carry build-carry/{main,new}.tar.xz (new's moekit_cuda_tests too).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 500 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
T=/tmp/new/moekit_cuda_tests
timeout -k 5 $(left 90) $T --gtest_filter='GpuFp8*:EngineFp8Gpu*:EveryInstance/*fp8*:*SelfRoute*:*self_route*' > $R/new_gpu_tests.txt 2>&1; stamp "new tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/new_gpu_tests.txt | head
timeout -k 5 $(left 60) compute-sanitizer --tool memcheck $T --gtest_filter='GpuFp8Small*:EveryInstance/*one_token_fp8*' > $R/new_memcheck.txt 2>&1; stamp "memcheck rc=$?"
tail -2 $R/new_memcheck.txt
timeout -k 5 $(left 60) compute-sanitizer --tool racecheck $T --gtest_filter='GpuFp8Small*:EveryInstance/*one_token_fp8*' > $R/new_racecheck.txt 2>&1; stamp "racecheck rc=$?"
tail -2 $R/new_racecheck.txt
pack
bench() {  # name, timeout, env..., -- moekit bench args (env: KEY=VALUE words, then the binary's name)
  local name=$1 lim=$2; shift 2
  local envs=(); while [[ $1 == *=* ]]; do envs+=("$1"); shift; done
  local bin=$1; shift
  ( env "${envs[@]}" timeout -k 5 $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do
  for m in deepseek-v3 kimi-k2 minimax-m2; do
    bench ab${i}_main_${m} 20 main --device cuda --model $m --dtype fp8 --batch 1,8 --iterations 30
    bench ab${i}_new_${m} 20 new --device cuda --model $m --dtype fp8 --batch 1,8 --iterations 30
    bench ab${i}_new-hq0_${m} 20 MOEKIT_EXPERTS_H_IN_DOWN=0 new --device cuda --model $m --dtype fp8 --batch 1 --iterations 30
    if [ $m = minimax-m2 ]; then
      bench ab${i}_new-sr0_${m} 20 MOEKIT_EXPERTS_SELF_ROUTE=0 new --device cuda --model $m --dtype fp8 --batch 1 --iterations 30
    else
      for l2 in 0 2; do
        bench ab${i}_new-l2${l2}_${m} 20 MOEKIT_EXPERTS_SHARED_DOWN_L2=$l2 new --device cuda --model $m --dtype fp8 --batch 1 --iterations 30
      done
    fi
  done
  pack
done
OFF="MOEKIT_EXPERTS_SHARED_DOWN_L2=0 MOEKIT_EXPERTS_SELF_ROUTE=0 MOEKIT_EXPERTS_H_IN_DOWN=0"
for m in deepseek-v3 minimax-m2; do
  bench trace_new_$m 20 new --device cuda --model $m --dtype fp8 --batch 1 --iterations 20 --trace
  bench trace_new-off_$m 20 $OFF new --device cuda --model $m --dtype fp8 --batch 1 --iterations 20 --trace
done
stamp done
pack
