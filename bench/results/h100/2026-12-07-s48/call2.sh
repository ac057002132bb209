#!/usr/bin/env bash
# Session 48 run 2. build-carry: m48 (main 1c3d9a1), g48 (branch s48-mx-groups: the MXFP4
# consumers as two groups of four warps taking alternate items, where a slot's fills stay one
# group's; every other kernel's machine code is m48's), y48 (branch s48-mx-groups8: the same for
# MXFP8 too, which groups MiniMax-M3's gate/up items of three fills). GPU tests of g48 (MX),
# racecheck and memcheck on its small MX shapes; m48, g48 and y48 alternating on the MX layers,
# three rounds; the kernel timeline of m48 and g48 at one token; y48's GPU tests and racecheck.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 300 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in m48 g48 y48; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 90) /tmp/g48/moekit_cuda_tests --gtest_filter='EveryInstance/*mx*:GpuMx*:GpuPrefillMxSmall*' > $R/gpu_tests_g48.txt 2>&1; rc=$?; stamp "tests g48 rc=$rc"
variants="m48 g48 y48"; [ $rc -ne 0 ] && variants="m48 y48"  # (a failing or hanging g48 is not timed)
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_g48.txt | head
sanitize() {  # binary, tool
  timeout -k 5 $(left 45) compute-sanitizer --tool $2 /tmp/$1/moekit_cuda_tests --gtest_filter='GpuMxSmall*' > $R/${2}_$1.txt 2>&1; stamp "$2 $1 rc=$?"
  tail -2 $R/${2}_$1.txt
}
sanitize g48 racecheck
sanitize g48 memcheck
pack
bench() {  # name, timeout, binary, -- moekit bench args
  local name=$1 lim=$2 v=$3; shift 3
  ( timeout -k 5 $(left $lim) /tmp/$v/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
mx_round() {
  for v in $variants; do
    for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
      bench ab${1}_${v}_${md%:*}_${md#*:} 30 $v --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 30
    done
  done
  pack
}
mx_round 1
for v in m48 g48; do
  ( timeout -k 5 $(left 20) /tmp/$v/moekit bench --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1 --iterations 20 --trace ) > $R/trace_${v}_gpt-oss-120b_mxfp4.txt 2>&1
  stamp "trace $v rc=$?"
done
pack
mx_round 2
timeout -k 5 $(left 90) /tmp/y48/moekit_cuda_tests --gtest_filter='EveryInstance/*mx*:GpuMx*:GpuPrefillMxSmall*' > $R/gpu_tests_y48.txt 2>&1; stamp "tests y48 rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests_y48.txt | head
sanitize y48 racecheck
pack
mx_round 3
stamp done
