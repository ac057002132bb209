#!/usr/bin/env bash
# Session 39 call 5: moekit bench --device cpu at one token on the host's cores, automatic iterations: new (gate/up
# and down in one run of the threads, big units of 2 MB, the reference's iterations capped), main before it
# (cab6836) and cpubase (3d67ad1: before session 38's VBMI rows and units), alternating: gpt-oss-120b MXFP4 (two
# rounds), MiniMax-M2 fp8; MiniMax-M3 MXFP8 (new, then main).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 380 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3|Flags" > $R/host_cpu.txt
for v in new main cpubase; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
bench() {  # binary, name, timeout, -- moekit bench args
  local bin=$1 name=$2 lim=$3; shift 3
  ( timeout $(left $lim) /tmp/$bin/moekit bench "$@" --json ) > $R/$name.json 2> $R/$name.err
  stamp "$name rc=$?"
}
for i in 1 2; do
  for v in new main cpubase; do
    bench $v cpu${i}_${v}_gpt-oss-120b_mxfp4 70 --device cpu --model gpt-oss-120b --dtype mxfp4 --batch 1
  done
  pack
done
for v in new main; do
  bench $v cpu_${v}_minimax-m2_fp8 80 --device cpu --model minimax-m2 --dtype fp8 --batch 1
  pack
done
for v in new main; do
  bench $v cpu_${v}_minimax-m3_mxfp8 150 --device cpu --model minimax-m3 --dtype mxfp8 --batch 1
  pack
done
stamp done
