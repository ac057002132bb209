#!/usr/bin/env bash
# Session 46 run 3. build-carry/dbg.tar.xz: branch s46-dbg (main with a debug timeline, not
# landed): CTA 5 of the 26th launch of each bulk kernel prints when its producers waited for and
# issued each stage, when consumer warps 0 and 3 found it full and warp 0 released it, and when
# the epilogue warp took and finished each item. build-carry/bias2.tar.xz: branch
# s46-mx-bias-stage (the MX ring's items bring their biases; stages 128-byte aligned, the copy
# into the reduction buffer only with biases); base46: main (5b7802a). bias2's MX GPU tests and
# sanitizers, then base46 and bias2 alternating, two rounds.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 420 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in dbg base46 bias2; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
for md in gpt-oss-120b:mxfp4:1 gpt-oss-120b:mxfp4:32 minimax-m3:mxfp8:1 gpt-oss-120b:bf16:1; do
  IFS=: read m d b <<< "$md"
  timeout -k 5 $(left 40) /tmp/dbg/moekit bench --device cuda --model $m --dtype $d --batch $b --iterations 20 > $R/dbg_${m}_${d}_$b.txt 2>&1
  stamp "dbg $md rc=$?"
done
pack
timeout -k 5 $(left 120) /tmp/bias2/moekit_cuda_tests --gtest_filter='GpuMx*:GpuPrefillMx*:EveryInstance/*mx*:*SelfRouted*' > $R/gpu_tests_bias2.txt 2>&1; stamp "tests bias2 rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_bias2.txt
for tool in memcheck racecheck; do
  timeout -k 5 $(left 60) compute-sanitizer --tool $tool /tmp/bias2/moekit_cuda_tests --gtest_filter='GpuMxSmall.*' > $R/${tool}_bias2.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/${tool}_bias2.txt
done
pack
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in base46 bias2; do
  for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
    bench ab${i}_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128,256 --iterations 30
  done
done; pack; done
stamp done
