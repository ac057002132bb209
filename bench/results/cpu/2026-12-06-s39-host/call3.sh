#!/usr/bin/env bash
# Session 39 call 3: the fast CPU backend on the host's cores. cpu_ab (cpu_ab.cpp, built against the tree of main
# with temporary hooks: MOEKIT_TMP_MERGE, _PF_BYTES, _BIG_KB, _SMALL_KB, _ROUTER_PARTS; UA_T threads) alternates
# configurations forward by forward; then moekit bench --device cpu, main (cab6836) and cpubase (3d67ad1) alternating.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 575 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3|Flags" > $R/host_cpu.txt
for v in main cpubase; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
AB=build-carry/cpu_ab
CFG="base MOEKIT_TMP_MERGE=1 MOEKIT_TMP_PF_BYTES=8192 MOEKIT_TMP_PF_BYTES=2048 MOEKIT_TMP_BIG_KB=2048 MOEKIT_TMP_BIG_KB=512 MOEKIT_TMP_SMALL_KB=128 MOEKIT_TMP_ROUTER_PARTS=4 MOEKIT_TMP_ROUTER_PARTS=8 UA_T=15 UA_T=12 MOEKIT_TMP_MERGE=1,MOEKIT_TMP_BIG_KB=2048"
for i in 1 2; do
  timeout $(left 80) $AB 60 $CFG > $R/ab${i}_gpt-oss-120b_mxfp4.txt 2>&1; stamp "ab$i rc=$?"; tail -14 $R/ab${i}_gpt-oss-120b_mxfp4.txt
  pack
done
UA_MODEL=minimax-m3 UA_FORMAT=mxfp8 UA_INPUTS=8 timeout $(left 80) $AB 40 base MOEKIT_TMP_MERGE=1 MOEKIT_TMP_BIG_KB=2048 MOEKIT_TMP_PF_BYTES=8192 > $R/ab_minimax-m3_mxfp8.txt 2>&1
stamp "ab m3 rc=$?"; tail -6 $R/ab_minimax-m3_mxfp8.txt; pack
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for v in main cpubase; do
  bench $v cpu2_${v}_gpt-oss-120b_mxfp4 110 --device cpu --model gpt-oss-120b --dtype mxfp4 --batch 1 --threads 0 --iterations 20
  pack
done
bench main cpu_main_minimax-m3_mxfp8 200 --device cpu --model minimax-m3 --dtype mxfp8 --batch 1 --threads 0 --iterations 20
stamp done
pack
