#!/usr/bin/env bash
# Session 38 call 1 (built in session 37): x quantised to e4m3 by the routing kernel before its PDL wait (new) against
# the quantiser launch before the router (base: the tree before, 3d67ad1): the fp8, engine fp8 and
# routing GPU tests (the whole GPU suite), compute-sanitizer memcheck on the small fp8 shapes, then DeepSeek-V3 and MiniMax-M2
# fp8 (then Kimi-K2) at 1 / 8 / 16 / 32 tokens, alternating, two rounds; between them, the fast
# CPU backend's MXFP4 rows with VBMI-made indices (vbmi: the tree of session 38) against base on
# gpt-oss-120b at one token on the host's cores, alternating, two rounds.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 570 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3|Flags" > $R/host_cpu.txt
for v in base new vbmi; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
/tmp/new/moekit list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
T=/tmp/new/moekit_cuda_tests
timeout $(left 160) $T > $R/gpu_tests.txt 2>&1
stamp "tests rc=$?"; grep -E "PASSED|FAILED" $R/gpu_tests.txt | head -5
for tool in memcheck; do
  timeout $(left 40) compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_filter='GpuFp8Small*' > $R/$tool.txt 2>&1
  stamp "$tool rc=$?"; tail -2 $R/$tool.txt
done
pack
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
cpu_ab() {
  for i in 1 2; do
    for v in base vbmi; do
      bench $v cpu${i}_${v}_gpt-oss-120b_mxfp4 60 --device cpu --model gpt-oss-120b --dtype mxfp4 --batch 1 --threads 0 --iterations 20
    done
    pack
  done
}
for m in deepseek-v3 minimax-m2 cpu kimi-k2; do
  [ $m = cpu ] && { cpu_ab; continue; }
  for i in 1 2; do
    for v in base new; do
      bench $v ab${i}_${v}_${m} 25 --device cuda --model $m --dtype fp8 --batch 1,8,16,32 --iterations 20
    done
  done
  pack
done
bench new trace_deepseek-v3_fp8 40 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
stamp done
pack
