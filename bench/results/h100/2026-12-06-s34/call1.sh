#!/usr/bin/env bash
# Session 34 call 1: the tree of session 33 (4 grouped GEMM instances, the rule that picks them)
# on the GPU: the layer by the plan at 1-4096 tokens (DeepSeek-V3 bf16 and fp8, MiniMax-M2 fp8),
# the fp8 prefill path against the decode kernels at 32-256 tokens (the crossover), each kernel's
# timeline at 4096 tokens, every GPU test; then the fast CPU backend on this host's cores (fp8
# with the table-lookup row kernels, bf16 and MXFP4 beside it), in one run.
# Binaries built on the development machine (build-carry/bins.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
# seconds a step may take: at most $1, and none past 560 s of the call (the results still pack)
left() { local l=$(( 560 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" > $R/host_cpu.txt; cat $R/host_cpu.txt
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
M=/tmp/bin/moekit; T=/tmp/bin/moekit_cuda_tests
$M list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
stamp start
bench() {  # name, timeout, env..., -- moekit bench args
  local name=$1 lim=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  ( timeout $(left $lim) env "${envs[@]}" $M bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"; tail -1 $R/$name.err
}
# 1. the layer by the plan (the rule's instances, the crossover rules)
bench layer_deepseek-v3_bf16 90 X=1 -- --device cuda --model deepseek-v3 --dtype bf16 --batch 1,32,128,256,1024,4096 --fuse-shared auto --iterations 5
bench layer_deepseek-v3_fp8 90 X=1 -- --device cuda --model deepseek-v3 --dtype fp8 --batch 1,32,128,256,1024,4096 --fuse-shared auto --iterations 5
bench layer_minimax-m2_fp8 60 X=1 -- --device cuda --model minimax-m2 --dtype fp8 --batch 1,32,128,256,1024,4096 --fuse-shared auto --iterations 5
# 2. fp8: the prefill path forced from 1 token against the decode kernels (never), 32-256 tokens
for m in deepseek-v3 minimax-m2; do
  bench cross_${m}_fp8_prefill 60 MOEKIT_EXPERTS_GROUPED_FROM=1 -- --device cuda --model $m --dtype fp8 --batch 32,64,96,128,192,256 --fuse-shared auto --iterations 5
  bench cross_${m}_fp8_decode 60 MOEKIT_EXPERTS_GROUPED_FROM=0 -- --device cuda --model $m --dtype fp8 --batch 32,64,96,128,192,256 --fuse-shared auto --iterations 5
done
pack
# 3. each kernel's timeline at 4096 tokens
for d in bf16 fp8; do
  ( timeout $(left 40) $M bench --device cuda --model deepseek-v3 --dtype $d --batch 4096 --fuse-shared auto --iterations 3 --trace ) > $R/trace_deepseek-v3_$d.txt 2>&1
  stamp "trace $d rc=$?"
done
pack
# 4. every GPU test
( time timeout $(left 260) $T --gtest_brief=1 ) > $R/gpu_tests.txt 2>&1
stamp "gpu tests rc=$?"; grep -E "FAILED|Failure" $R/gpu_tests.txt | head -10; tail -4 $R/gpu_tests.txt
pack
# 5. the fast CPU backend on this host (all cores, and 1 thread beside)
for spec in "deepseek-v3 fp8" "deepseek-v3 bf16" "gpt-oss-120b mxfp4"; do
  set -- $spec
  bench cpu_$1_$2 70 X=1 -- --device cpu --model $1 --dtype $2 --batch 1 --fuse-shared auto --threads 0 --iterations 10
done
stamp done
pack
