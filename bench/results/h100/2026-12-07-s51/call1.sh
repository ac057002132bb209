#!/usr/bin/env bash
# Session 51 run 1 (ran with CAP=450; its results in run1/). build-carry: m51 (main bcab674: the
# packed MX GEMM on mma.sync, a 3-stage ring; the plan takes it up to 128 routed tokens per
# expert and the MXFP4 consumer groups from 2 tokens) and w51 (branch s51-mx-wgmma 9831c67: main
# with the packed MX GEMM on Hopper's warpgroup mma, A fragments from registers, the activations
# from a ring as deep as shared memory holds). w51's packed-GEMM and MX layer tests first; then,
# alternating in one run, both binaries' packed GEMM at tiles of 64 and 128 on gpt-oss-120b
# MXFP4 and MiniMax-M3 MXFP8 at 1024-4096 tokens; w51's whole GPU suite (main's defaults but for
# that kernel); racecheck on w51's packed GEMM last.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
source scripts/device_call.sh
gpu_info
M=$(carried m51)
W=$(carried w51)
gtest gpu_tests_packed 40 $W/moekit_cuda_tests 'GpuPrefillMxSmall*:GpuMxSmall*:GpuMx.GraphReplay*'
pack
# run_md NAME BINARY TILE MODEL DTYPE: the MX layer at 1024-4096 tokens, MOEKIT_EXPERTS_MX_GEMM=TILE
run_md() {
  MOEKIT_EXPERTS_MX_GEMM=$3 bench "$1" 30 "$2" --device cuda --model "$4" --dtype "$5" \
    --batch 1024,2048,4096 --iterations 10
}
for md in gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
  m=${md%:*} d=${md#*:}
  for tile in 64 128; do
    run_md mma${tile}_$m $M/moekit $tile $m $d
    run_md wgmma${tile}_$m $W/moekit $tile $m $d
  done
  pack
done
gtest gpu_tests_all 240 $W/moekit_cuda_tests '*'
pack
gtest racecheck 40 $W/moekit_cuda_tests 'GpuPrefillMxSmall.PackedGemm*' compute-sanitizer \
  --tool racecheck
pack
stamp done
