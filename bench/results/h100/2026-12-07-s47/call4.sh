#!/usr/bin/env bash
# Session 47 run 4. build-carry: main47 (main's moekit, fe258e9's kernels), d47 (branch s47-div
# e2276c4: the pair-to-row division as a multiply and shift, every expert instance), dx47 (branch
# s47-mx-nozero: d47 and the MX consumers zeroing no register: a lane past the count reads the
# first token's row, a piece past the row's end a zero factor), dxs47 (branch s47-mx-onestep: dx47
# and the two-multiply test only in layers whose e8m0 bytes may need it). GPU tests of dxs47 (MX;
# d47's division passed every instance's test in run 3, as pd47), sanitizers on dxs47's small MX
# shapes; then main47, d47 and dxs47 alternating on the MX layers, two rounds, and main47 / d47 on
# the fp8 layers (DeepSeek-V3, MiniMax-M2), one round between them (dx47 not run: the device
# time left).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 170 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main47 d47 dxs47; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 60) /tmp/dxs47/moekit_cuda_tests --gtest_filter='EveryInstance/*mx*:GpuMx*:GpuPrefillMxSmall*' > $R/gpu_tests_dxs47.txt 2>&1; stamp "tests dxs47 rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_dxs47.txt | head
for tool in memcheck racecheck; do
  timeout -k 5 $(left 40) compute-sanitizer --tool $tool /tmp/dxs47/moekit_cuda_tests --gtest_filter='GpuMxSmall*' > $R/${tool}_dxs47.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/${tool}_dxs47.txt
done
pack
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
mx_round() {
  for v in main47 d47 dxs47; do
    for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
      bench ab${1}_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 30
    done
  done
  pack
}
mx_round 1
for v in main47 d47; do
  for md in deepseek-v3:fp8 minimax-m2:fp8; do
    bench ab1_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 20
  done
done
pack
mx_round 2
pack
stamp done
