#!/usr/bin/env bash
# Session 43 run 3, for an H200 (elsewhere the fp8 part only, then ncu's per-instruction
# samples of main's gpt-oss-120b MXFP4 kernels at one token, with the four mma chains).
# Branch s43-fp8-next-stage ("stage": the fp8 consumers of the ring of weights only load the
# next stage's activations during the stage's mma, the item's next chunk or, after its last,
# the first chunk of its task's next tile; not measured): its fp8 GPU tests and racecheck.
# main (6cf4f26), branch s43-fp8-next-chunk ("new": the next chunk only; slower on the H100,
# run 2) and stage on DeepSeek-V3, Kimi-K2 and MiniMax-M2 fp8 at 1 / 8 / 32 / 128 tokens,
# alternating, two rounds (issue 30's H200 targets). On an H200 then: main's gpt-oss-120b MXFP4
# and MiniMax-M3 MXFP8 at 1 / 8 / 32 / 128 (issue 31's); ncu's per-instruction samples of main's
# DeepSeek-V3 fp8 kernels at one token (what bounds them there); session 41's tile A/B (the
# 128-row cooperative grouped GEMM forced against the plan), one round.
# Carry build-carry/{main,new,stage}.tar.xz (stage's moekit_cuda_tests too).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 520 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main new stage; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
prof() {  # name, -- moekit bench args: ncu's per-instruction samples of main's expert kernels
  local name=$1; shift
  ( timeout -k 5 $(left 90) ncu --clock-control none -k regex:experts_bulk --launch-skip 8 --launch-count 2 \
      --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
      /tmp/main/moekit bench --device cuda "$@" --iterations 2 --weight-sets 1 ) > $R/ncusrc_$name.csv 2>&1
  stamp "ncu $name rc=$?"
  pkill -9 -x moekit
  python3 scripts/ncu_source_summary.py $R/ncusrc_$name.csv 25 > $R/ncusrc_$name.txt 2>&1; gzip $R/ncusrc_$name.csv
  pack
}
timeout -k 5 $(left 60) /tmp/stage/moekit_cuda_tests --gtest_filter='GpuFp8*:EngineFp8Gpu*:EveryInstance/*fp8*' > $R/stage_gpu_tests.txt 2>&1; stamp "stage tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/stage_gpu_tests.txt | head
timeout -k 5 $(left 40) compute-sanitizer --tool racecheck /tmp/stage/moekit_cuda_tests --gtest_filter='GpuFp8Small*' > $R/stage_racecheck.txt 2>&1; stamp "stage racecheck rc=$?"
tail -2 $R/stage_racecheck.txt
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in main new stage; do
  for m in deepseek-v3 kimi-k2 minimax-m2; do
    bench $v ab${i}_${v}_${m}_fp8 30 --device cuda --model $m --dtype fp8 --batch 1,8,32,128 --iterations 20
  done
done; pack; done
if ! grep -q H200 $R/gpu.txt; then
  # elsewhere: who waits on whom in main's MXFP4 kernels with the four mma chains
  prof main_gpt-oss-120b_mxfp4_1 --model gpt-oss-120b --dtype mxfp4 --batch 1
  exit 0
fi
bench main dec_gpt-oss-120b_mxfp4 30 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1,8,32,128 --iterations 20
bench main dec_minimax-m3_mxfp8 30 --device cuda --model minimax-m3 --dtype mxfp8 --batch 1,8,32,128 --iterations 20
pack
prof main_deepseek-v3_fp8_1 --model deepseek-v3 --dtype fp8 --batch 1
for v in plan coop; do
  for md in mixtral-8x7b:1024,2048,4096 qwen3-30b-a3b:4096 qwen2-57b-a14b:4096; do
    ( [ $v = coop ] && export MOEKIT_EXPERTS_GROUPED_GEMM=grouped_bf16_128x256_coop
      timeout -k 5 $(left 30) /tmp/main/moekit bench --device cuda --model ${md%:*} --dtype bf16 --batch ${md#*:} --iterations 10 --json ) > $R/tile1_${v}_${md%:*}.json 2> $R/tile1_${v}_${md%:*}.err
    stamp "tile1 $v $md rc=$?"
  done
done
stamp done
pack
