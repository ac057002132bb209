#!/usr/bin/env bash
# Session 38 call 3: the fast CPU backend's MXFP4 rows with VBMI-made indices (vbmi: the tree of
# session 38) against base (3d67ad1) on gpt-oss-120b at one token on the host's cores, all
# threads, alternating, two rounds (again: call 2 saw both binaries vary 1.2x between rounds);
# first the row kernels alone (mxfp4_rows_ab.cpp) on one core and on every core at once.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 300 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
lscpu > $R/host_cpu.txt
for v in base vbmi; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
stamp start
build-carry/mxfp4_rows_ab > $R/rows_one_core.txt 2>&1; cat $R/rows_one_core.txt
for c in $(seq 0 15); do $(command -v taskset >/dev/null && echo taskset -c $c) build-carry/mxfp4_rows_ab > $R/rows_core$c.txt 2>&1 & done; wait
stamp "rows on 16 cores at once"; grep -h "rows 40000 n 1" $R/rows_core*.txt
for i in 1 2; do
  for v in base vbmi; do
    n=cpu${i}_${v}_gpt-oss-120b_mxfp4
    ( timeout $(left 150) /tmp/$v/moekit bench --device cpu --model gpt-oss-120b --dtype mxfp4 --batch 1 --threads 0 --iterations 20 --json ) > $R/$n.json 2> $R/$n.err
    stamp "$n rc=$?"; tail -1 $R/$n.err
    pack
  done
done
stamp done
