#!/usr/bin/env bash
# Session 43 run 1: session 42's prepared A/B (its call3.sh) of branch s42-fp8-acts-l1 ("new":
# main at 5ab15e2 with the gate/up consumers of the rings of weights only loading x8 and its
# scales (fp8) or x (bf16) through L1) against main at 5ab15e2. new's GPU tests of the layer and
# memcheck on the small layers; DeepSeek-V3, Kimi-K2 and MiniMax-M2 fp8 at 1 / 8 / 32 tokens and
# Qwen3-30B-A3B and DeepSeek-V3 bf16 at 8 / 32, main and new alternating, two rounds; ncu's
# per-instruction samples of new's DeepSeek-V3 fp8 gate/up kernel at 8 tokens. On an H200 also
# session 41's tile A/B (its call4.sh, one round). Carry build-carry/{main,new}.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 100) /tmp/new/moekit_cuda_tests --gtest_filter='GpuFp8*:EngineFp8Gpu*:GpuLayer*:EveryInstance/*:AllFamilies/*' > $R/new_gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/new_gpu_tests.txt | head
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in main new; do
  for md in deepseek-v3:fp8:1,8,32 kimi-k2:fp8:1,8,32 minimax-m2:fp8:1,8,32 qwen3-30b-a3b:bf16:8,32 deepseek-v3:bf16:8,32; do
    IFS=: read m d b <<< "$md"
    bench $v ab${i}_${v}_${m}_$d 25 --device cuda --model $m --dtype $d --batch $b --iterations 20
  done
done; pack; done
timeout -k 5 $(left 60) compute-sanitizer --tool memcheck /tmp/new/moekit_cuda_tests --gtest_filter='GpuLayerSmall*:GpuFp8Small*' > $R/new_memcheck.txt 2>&1; stamp "memcheck rc=$?"
tail -2 $R/new_memcheck.txt
pack
( timeout -k 5 $(left 90) ncu --clock-control none -k regex:experts_bulk --launch-skip 8 --launch-count 2 \
    --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
    /tmp/new/moekit bench --device cuda --model deepseek-v3 --dtype fp8 --batch 8 --iterations 2 --weight-sets 1 ) > $R/ncusrc_new_deepseek-v3_fp8_8.csv 2>&1
stamp "ncu rc=$?"
python3 scripts/ncu_source_summary.py $R/ncusrc_new_deepseek-v3_fp8_8.csv 25 > $R/ncusrc_new_deepseek-v3_fp8_8.txt 2>&1; gzip $R/ncusrc_new_deepseek-v3_fp8_8.csv
pkill -9 -x moekit; pack
if grep -q H200 $R/gpu.txt; then
  for v in plan coop; do
    for md in mixtral-8x7b:1024,2048,4096 qwen3-30b-a3b:4096 qwen2-57b-a14b:4096; do
      ( [ $v = coop ] && export MOEKIT_EXPERTS_GROUPED_GEMM=grouped_bf16_128x256_coop
        timeout -k 5 $(left 30) /tmp/main/moekit bench --device cuda --model ${md%:*} --dtype bf16 --batch ${md#*:} --iterations 10 --json ) > $R/tile1_${v}_${md%:*}.json 2> $R/tile1_${v}_${md%:*}.err
      stamp "tile1 $v $md rc=$?"
    done
  done
fi
stamp done
pack
