#!/usr/bin/env bash
# Session 42 run 2: the epilogue warp's biases loaded once per item, before its reduction (new:
# the tree of main with that change) against main (d57b2d1), where run 1's per-instruction
# samples (an H100) put the MXFP4 consumers waiting on the epilogue's reduction buffers. new's
# GPU tests and memcheck on the small layers; gpt-oss-120b MXFP4 and bf16 (biases) at 1 / 8 / 32
# / 128 tokens, main and new alternating, two rounds; DeepSeek-V3 fp8 (no biases) once each.
# On an H200 also: the 128-row cooperative grouped GEMM forced against the plan's 64-row
# ping-pong (Mixtral-8x7B 1024 / 2048 / 4096, Qwen3-30B-A3B and Qwen2-57B-A14B at 4096), and the
# prefill session 40's run 3 did not reach. Carry build-carry/{main,new}.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 430 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in main new; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout $(left 150) /tmp/new/moekit_cuda_tests > $R/new_gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/new_gpu_tests.txt | head
pack
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do for v in main new; do
  bench $v ab${i}_${v}_gpt-oss-120b_mxfp4 25 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1,8,32,128 --iterations 20
  bench $v ab${i}_${v}_gpt-oss-120b_bf16 25 --device cuda --model gpt-oss-120b --dtype bf16 --batch 1,8,32,128 --iterations 20
done; pack; done
for v in main new; do
  bench $v ab1_${v}_deepseek-v3_fp8 25 --device cuda --model deepseek-v3 --dtype fp8 --batch 1,8,32 --iterations 20
done
pack
timeout $(left 60) compute-sanitizer --tool memcheck /tmp/new/moekit_cuda_tests --gtest_filter='GpuLayerSmall*:GpuMxSmall*' > $R/new_memcheck.txt 2>&1; stamp "memcheck rc=$?"
tail -2 $R/new_memcheck.txt
pack
if grep -q H200 $R/gpu.txt; then
  for v in plan coop; do
    for md in mixtral-8x7b:1024,2048,4096 qwen3-30b-a3b:4096 qwen2-57b-a14b:4096; do
      ( [ $v = coop ] && export MOEKIT_EXPERTS_GROUPED_GEMM=grouped_bf16_128x256_coop
        timeout $(left 30) /tmp/main/moekit bench --device cuda --model ${md%:*} --dtype bf16 --batch ${md#*:} --iterations 10 --json ) > $R/tile1_${v}_${md%:*}.json 2> $R/tile1_${v}_${md%:*}.err
      stamp "tile1 $v $md rc=$?"
    done
  done
  pack
  for md in mixtral-8x7b:bf16 qwen3-30b-a3b:bf16 minimax-m2:fp8; do
    bench main pre_${md%:*}_${md#*:} 30 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1024,4096
  done
fi
stamp done
pack
