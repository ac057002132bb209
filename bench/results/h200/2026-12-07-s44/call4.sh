#!/usr/bin/env bash
# Session 44 run 4 (prepared, not run: no device time was left). On any GPU: main (86a66a5)'s
# GPU tests of the self-routing gate/up kernels (GpuMx.SelfRoutedGateUpAtOneToken as fixed after
# run 3, GpuFp8.SelfRoutedGateUpAtOneToken, the instances), memcheck and racecheck on the two
# tests. On an H200 then: main's fp8 and MX decode layers at 1 / 8 / 32 / 128 tokens (issues 30
# and 31's targets, with the self-routing kernels); branch s44-shared-down-l2 ("l2", 4a74036) at
# one token with its in-kernel h quantisation off, the shared expert's down rows prefetched into
# L2 or not (MOEKIT_EXPERTS_SHARED_DOWN_L2=1 / 0), DeepSeek-V3 and Kimi-K2 fp8, two rounds: on the
# H200 the shared items may leave the stream idle during the routing, unlike the H100 (run 2).
# And main against the tree before the self-routing fp8 and MX kernels ("base", 3b2436d) at one
# token on MiniMax-M2 fp8 and gpt-oss-120b MXFP4, two rounds, alternating.
# Before those, on any GPU: branch s44-self-route-shared ("srs", f4b0bc1: the gate/up kernel
# self-routes with the shared expert fused too; not measured): its self-route, fp8, MX and
# small-layer GPU tests, memcheck and racecheck on the self-route tests, and srs against main at
# one token on DeepSeek-V3 and GLM-4.5 fp8, MiniMax-M3 MXFP8, Qwen2-57B-A14B and
# DeepSeek-V2-Lite bf16, two rounds, alternating, with srs's DeepSeek-V3 fp8 timeline.
# Then ncu's samples of main's MiniMax-M2 fp8 kernels at one token (any GPU).
# Carry build-carry/{main,l2,base,srs}.tar.xz (main, srs: moekit and moekit_cuda_tests; l2,
# base: moekit).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main l2 base srs; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
T=/tmp/main/moekit_cuda_tests
timeout -k 5 $(left 60) $T --gtest_filter='GpuMx.SelfRouted*:GpuFp8.SelfRouted*:EveryInstance/*self_route*' > $R/gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests.txt
for tool in memcheck racecheck; do
  timeout -k 5 $(left 60) compute-sanitizer --tool $tool $T --gtest_filter='GpuMx.SelfRouted*:GpuFp8.SelfRouted*' > $R/$tool.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/$tool.txt
done
pack
bench() {  # name, timeout, env..., binary, -- moekit bench args
  local name=$1 lim=$2; shift 2
  local envs=(); while [[ $1 == *=* ]]; do envs+=("$1"); shift; done
  local bin=$1; shift
  ( env "${envs[@]}" timeout -k 5 $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
S=/tmp/srs/moekit_cuda_tests
timeout -k 5 $(left 90) $S --gtest_filter='*SelfRouted*:EveryInstance/*self_route*:GpuFp8*:GpuMx*:GpuLayerSmall*' > $R/srs_gpu_tests.txt 2>&1; stamp "srs tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/srs_gpu_tests.txt
for tool in memcheck racecheck; do
  timeout -k 5 $(left 45) compute-sanitizer --tool $tool $S --gtest_filter='*SelfRouted*' > $R/srs_$tool.txt 2>&1; stamp "srs $tool rc=$?"
  tail -2 $R/srs_$tool.txt
done
for i in 1 2; do for v in main srs; do
  for md in deepseek-v3:fp8 glm-4.5:fp8 minimax-m3:mxfp8 qwen2-57b-a14b:bf16 deepseek-v2-lite:bf16; do
    bench srs${i}_${v}_${md%:*}_${md#*:} 20 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1 --iterations 30
  done
done; pack; done
bench trace_srs_deepseek-v3_fp8 20 srs --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
pack
# ncu's per-instruction samples of main's MiniMax-M2 fp8 kernels at one token: its gate/up stream
# streams at ~0.77 of the H100's read probe (75.5 MB in ~31 us, run 3's timeline), a 48 KB stage an item
( timeout -k 5 $(left 90) ncu --clock-control none -k regex:experts_bulk --launch-skip 8 --launch-count 2 \
    --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
    /tmp/main/moekit bench --device cuda --model minimax-m2 --dtype fp8 --batch 1 --iterations 2 \
    --weight-sets 1 ) > $R/ncusrc_main_minimax-m2_fp8_1.csv 2>&1
stamp "ncu rc=$?"
pkill -9 -x moekit
python3 scripts/ncu_source_summary.py $R/ncusrc_main_minimax-m2_fp8_1.csv 25 > $R/ncusrc_main_minimax-m2_fp8_1.txt 2>&1
gzip $R/ncusrc_main_minimax-m2_fp8_1.csv
pack
grep -q H200 $R/gpu.txt || exit 0
for md in deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8 gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
  bench dec_main_${md%:*}_${md#*:} 30 main --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 20
done
pack
for i in 1 2; do for m in deepseek-v3 kimi-k2; do for l2 in 0 1; do
  bench ab${i}_l2-${l2}_$m 20 MOEKIT_EXPERTS_H_IN_DOWN=0 MOEKIT_EXPERTS_SHARED_DOWN_L2=$l2 l2 --device cuda --model $m --dtype fp8 --batch 1 --iterations 30
done; done; pack; done
for i in 1 2; do for v in base main; do
  bench sr${i}_${v}_minimax-m2 20 $v --device cuda --model minimax-m2 --dtype fp8 --batch 1 --iterations 30
  bench sr${i}_${v}_gpt-oss-120b 20 $v --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1 --iterations 30
done; done
pack
bench trace_l2-1_deepseek-v3 20 MOEKIT_EXPERTS_H_IN_DOWN=0 l2 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
bench trace_l2-0_deepseek-v3 20 MOEKIT_EXPERTS_H_IN_DOWN=0 MOEKIT_EXPERTS_SHARED_DOWN_L2=0 l2 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
stamp done
pack
