#!/usr/bin/env bash
# Session 39 call 4: cpu_ab (cpu_ab.cpp) on the tree of call 3 with the router's columns taken in units of 4
# by whichever thread is free (base; MOEKIT_TMP_ROUTER_STATIC=1: the static slices of before) and big units of
# 2 MB (base; MOEKIT_TMP_BIG_KB: others), MOEKIT_TMP_MERGE=1 (no join between gate/up and down), alternated
# forward by forward: gpt-oss-120b MXFP4 (three processes), MiniMax-M3 MXFP8, MiniMax-M2 and DeepSeek-V3 fp8.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 575 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3|Flags" > $R/host_cpu.txt
AB=build-carry/cpu_ab
CFG="base MOEKIT_TMP_ROUTER_STATIC=1 MOEKIT_TMP_BIG_KB=1024 MOEKIT_TMP_BIG_KB=3072 MOEKIT_TMP_BIG_KB=4096 MOEKIT_TMP_MERGE=1 MOEKIT_TMP_SMALL_KB=512"
for i in 1 2 3; do
  timeout $(left 60) $AB 80 $CFG > $R/ab${i}_gpt-oss-120b_mxfp4.txt 2>&1; stamp "ab$i rc=$?"; tail -9 $R/ab${i}_gpt-oss-120b_mxfp4.txt
  pack
done
UA_MODEL=minimax-m3 UA_FORMAT=mxfp8 UA_INPUTS=8 timeout $(left 90) $AB 40 base MOEKIT_TMP_ROUTER_STATIC=1 MOEKIT_TMP_BIG_KB=1024 MOEKIT_TMP_MERGE=1 > $R/ab_minimax-m3_mxfp8.txt 2>&1
stamp "m3 rc=$?"; tail -6 $R/ab_minimax-m3_mxfp8.txt; pack
UA_MODEL=minimax-m2 UA_FORMAT=fp8 UA_INPUTS=8 timeout $(left 90) $AB 40 base MOEKIT_TMP_ROUTER_STATIC=1 MOEKIT_TMP_BIG_KB=1024 MOEKIT_TMP_MERGE=1 > $R/ab_minimax-m2_fp8.txt 2>&1
stamp "m2 rc=$?"; tail -6 $R/ab_minimax-m2_fp8.txt; pack
UA_MODEL=deepseek-v3 UA_FORMAT=fp8 UA_INPUTS=4 timeout $(left 120) $AB 20 base MOEKIT_TMP_ROUTER_STATIC=1 MOEKIT_TMP_BIG_KB=1024 MOEKIT_TMP_MERGE=1 > $R/ab_deepseek-v3_fp8.txt 2>&1
stamp "dsv3 rc=$?"; tail -6 $R/ab_deepseek-v3_fp8.txt; pack
stamp done
