#!/usr/bin/env bash
# Session 50 run 1 (an H100 came; results in run1/). build-carry: s50 (branch
# s50-mx-direct: main 686f204 and the packed MX prefill GEMM, run_prefill_gemm_mx, never run on
# a GPU). Its MX GPU tests (the packed GEMM against the reference, the layer's packed ways, the
# MXFP4 consumer groups' EveryInstance cases), racecheck and memcheck on the small MX shapes; the
# MX prefill path widened (MOEKIT_EXPERTS_MX_GEMM=0) against the packed GEMM (64, 128) on
# gpt-oss-120b MXFP4 and MiniMax-M3 MXFP8 at 256-4096 tokens beside their bf16 layers; then the
# consumer groups' A/B at 1-8 tokens (MOEKIT_EXPERTS_MX_GROUPS) and the rest of the GPU suite.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
source scripts/device_call.sh
gpu_info
B=$(carried s50)
MX='EveryInstance/*mx*:GpuMx*:GpuMxSmall*:GpuPrefillMxSmall*'
gtest gpu_tests_mx 150 $B/moekit_cuda_tests "$MX"
for tool in racecheck memcheck; do
  gtest $tool 60 $B/moekit_cuda_tests 'GpuPrefillMxSmall.PackedGemm*:GpuMxSmall*' \
    compute-sanitizer --tool $tool
done
pack
for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
  for g in 0 64 128; do
    MOEKIT_EXPERTS_MX_GEMM=$g bench mxgemm${g}_${md%:*} 45 $B/moekit --device cuda --model ${md%:*} \
      --dtype ${md#*:} --batch 256,512,1024,2048,4096 --iterations 10
  done
  bench bf16_${md%:*} 40 $B/moekit --device cuda --model ${md%:*} --dtype bf16 \
    --batch 256,512,1024,2048,4096 --iterations 10
  pack
done
for g in 0 1; do
  MOEKIT_EXPERTS_MX_GROUPS=$g bench groups_g${g}_gpt-oss-120b 30 $B/moekit --device cuda \
    --model gpt-oss-120b --dtype mxfp4 --batch 1,2,3,4,5,6,7,8,32,128 --iterations 30
done
pack
gtest gpu_tests_rest 300 $B/moekit_cuda_tests "-$MX"
pack
stamp done
