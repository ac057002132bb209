#!/usr/bin/env bash
# Session 39 call 1: the fp8 gate/up kernel writes h's e4m3 copy itself (new: no quantiser kernel
# between the two GEMMs) against main before it (base, cab6836): the fp8, engine-fp8, layer and
# instance GPU tests, memcheck and racecheck on GpuFp8Small; DeepSeek-V3, Kimi-K2 and MiniMax-M2
# fp8 at 1 / 8 / 32 tokens, base and new alternating, two rounds; new's timeline at one token.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 575 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3|Flags" > $R/host_cpu.txt
for v in base new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
/tmp/new/moekit list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
T=/tmp/new/moekit_cuda_tests
timeout $(left 120) $T --gtest_filter='GpuFp8*:EngineFp8Gpu*:GpuLayer.*:GpuLayerInstance*' > $R/gpu_tests.txt 2>&1
stamp "tests rc=$?"; grep -E "PASSED|FAILED" $R/gpu_tests.txt | head -20
for tool in memcheck racecheck; do
  timeout $(left 45) compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter='GpuFp8Small*' > $R/$tool.txt 2>&1
  stamp "$tool rc=$?"; tail -2 $R/$tool.txt
done
pack
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for m in deepseek-v3 minimax-m2 kimi-k2; do
  for i in 1 2; do
    for v in base new; do
      bench $v ab${i}_${v}_${m} 25 --device cuda --model $m --dtype fp8 --batch 1,8,32 --iterations 20
    done
  done
  pack
done
bench new trace_deepseek-v3_fp8 30 --device cuda --model deepseek-v3 --dtype fp8 --batch 1,8 --iterations 20 --trace
stamp done
pack
