#!/usr/bin/env bash
# Session 43 run 2: two consumer changes ("new": main at 924b1b6 with both) against main
# (924b1b6, run 1's new). The fp8 consumers of the ring of weights only with one n-tile load the
# item's next chunk's activation fragments and scales while the stage's mma run (DeepSeek-V3's
# and Kimi-K2's gate/up items hold two chunks); the MX consumers run four mma chains instead of
# two. new's GPU tests of the fp8, MX and bf16 layers, memcheck and racecheck on the small fp8
# and MX layers; DeepSeek-V3, Kimi-K2, MiniMax-M2 fp8 at 8 / 32 tokens, gpt-oss-120b MXFP4 and
# MiniMax-M3 MXFP8 at 1 / 8 / 32 / 128, main and new alternating, two rounds; ncu's
# per-instruction samples of new's DeepSeek-V3 fp8 kernels at 8 tokens.
# Carry build-carry/{main,new}.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 470 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 100) /tmp/new/moekit_cuda_tests --gtest_filter='GpuFp8*:EngineFp8Gpu*:GpuMx*:EngineMx*:GpuPrefillMxSmall*:GpuLayer*:EveryInstance/*:AllFamilies/*' > $R/new_gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/new_gpu_tests.txt | head
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in main new; do
  for md in deepseek-v3:fp8:8,32 kimi-k2:fp8:8,32 minimax-m2:fp8:8,32 gpt-oss-120b:mxfp4:1,8,32,128 minimax-m3:mxfp8:1,8,32,128; do
    IFS=: read m d b <<< "$md"
    bench $v ab${i}_${v}_${m}_$d 25 --device cuda --model $m --dtype $d --batch $b --iterations 20
  done
done; pack; done
for tool in memcheck racecheck; do
  timeout -k 5 $(left 50) compute-sanitizer --tool $tool /tmp/new/moekit_cuda_tests --gtest_filter='GpuMxSmall*:GpuFp8Small*' > $R/new_$tool.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/new_$tool.txt
done
pack
( timeout -k 5 $(left 90) ncu --clock-control none -k regex:experts_bulk --launch-skip 8 --launch-count 2 \
    --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
    /tmp/new/moekit bench --device cuda --model deepseek-v3 --dtype fp8 --batch 8 --iterations 2 --weight-sets 1 ) > $R/ncusrc_new_deepseek-v3_fp8_8.csv 2>&1
stamp "ncu rc=$?"
python3 scripts/ncu_source_summary.py $R/ncusrc_new_deepseek-v3_fp8_8.csv 25 > $R/ncusrc_new_deepseek-v3_fp8_8.txt 2>&1; gzip $R/ncusrc_new_deepseek-v3_fp8_8.csv
pkill -9 -x moekit
stamp done
pack
