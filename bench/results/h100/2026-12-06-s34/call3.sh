#!/usr/bin/env bash
# Session 34 call 3: the fast CPU backend's fp8 table kernels on this host's cores at one token,
# MiniMax-M2 (fp8 and bf16) and Kimi-K2 (fp8), beside run 1's DeepSeek-V3.
# Binaries built on the development machine (build-carry/bins.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 400 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
M=/tmp/bin/moekit
for spec in "minimax-m2 fp8" "minimax-m2 bf16" "kimi-k2 fp8"; do
  set -- $spec
  ( timeout $(left 150) $M bench --device cpu --model $1 --dtype $2 --batch 1 --fuse-shared auto --threads 0 --iterations 10 --json ) > $R/cpu_$1_$2.json 2> $R/cpu_$1_$2.err
  stamp "cpu $1 $2 rc=$?"; tail -1 $R/cpu_$1_$2.err
done
tar -C $R -czf $OUT/results.tar.gz .
