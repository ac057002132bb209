#!/usr/bin/env bash
# Session 40 call 1 (asked for an H200; an H100 came): the fp8 row quantiser in CTAs of 64 threads (q64, branch s39-quantiser-64)
# against main (256 threads): q64's GpuFp8 tests, DeepSeek-V3 / MiniMax-M2 / Kimi-K2 fp8 at 1 / 8
# tokens and DeepSeek-V3 fp8 at 4096, alternating, two rounds; q64's one-token timeline. Then where
# main stands on this GPU: decode of every shipped format and bf16, prefill at 1024 / 4096, and the
# host CPU's gpt-oss-120b MXFP4 at one token.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 570 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" > $R/host_cpu.txt
for v in main q64; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
/tmp/main/moekit list-kernels > $R/list_kernels.txt 2>&1 || { stamp "carried binaries do not run"; cat $R/list_kernels.txt; pack; exit 1; }
timeout $(left 40) /tmp/q64/moekit_cuda_tests --gtest_filter='GpuFp8*:EngineFp8Gpu*' > $R/q64_gpu_tests.txt 2>&1; stamp "q64 tests rc=$?"
grep -E "PASSED|FAILED" $R/q64_gpu_tests.txt
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for m in deepseek-v3 minimax-m2 kimi-k2; do
  for i in 1 2; do for v in main q64; do
    bench $v ab${i}_${v}_${m} 15 --device cuda --model $m --dtype fp8 --batch 1,8 --iterations 20
  done; done
done
pack
for i in 1 2; do for v in main q64; do
  bench $v ab${i}_${v}_deepseek-v3_4096 20 --device cuda --model deepseek-v3 --dtype fp8 --batch 4096
done; done
bench q64 trace_q64_deepseek-v3_fp8 15 --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace
pack
for m in deepseek-v3 kimi-k2 minimax-m2; do
  bench main dec_${m}_fp8 30 --device cuda --model $m --dtype fp8 --batch 1,8,32,128
done
bench main dec_deepseek-v3_bf16 30 --device cuda --model deepseek-v3 --dtype bf16 --batch 1,32,128
bench main dec_qwen3-30b-a3b_bf16 30 --device cuda --model qwen3-30b-a3b --dtype bf16 --batch 1,8,32,128
bench main dec_gpt-oss-120b_mxfp4 30 --device cuda --model gpt-oss-120b --dtype mxfp4 --batch 1,8,32,128
bench main dec_gpt-oss-120b_bf16 30 --device cuda --model gpt-oss-120b --dtype bf16 --batch 1,32
bench main dec_minimax-m3_mxfp8 30 --device cuda --model minimax-m3 --dtype mxfp8 --batch 1,8,32,128
bench main dec_minimax-m3_bf16 30 --device cuda --model minimax-m3 --dtype bf16 --batch 1,32
pack
for md in deepseek-v3:bf16 deepseek-v3:fp8 minimax-m3:bf16 mixtral-8x7b:bf16 qwen3-30b-a3b:bf16 minimax-m2:fp8; do
  bench main pre_${md%:*}_${md#*:} 40 --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1024,4096,16384
done
pack
bench main cpu_gpt-oss-120b_mxfp4 40 --device cpu --model gpt-oss-120b --dtype mxfp4 --batch 1 --threads 0 --iterations 20
bench main cpu_minimax-m2_fp8 40 --device cpu --model minimax-m2 --dtype fp8 --batch 1 --threads 0 --iterations 20
stamp done
pack
