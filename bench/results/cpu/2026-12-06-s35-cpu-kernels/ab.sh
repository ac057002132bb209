#!/usr/bin/env bash
# Two builds of moekit alternating on this machine, two rounds: the fast CPU backend at one token.
# Usage: ab.sh A_MOEKIT B_MOEKIT OUTDIR MODEL DTYPE THREADS   (writes OUTDIR/r{1,2}_{a,b}.json)
set -euo pipefail
a=$1 b=$2 out=$3 model=$4 dtype=$5 threads=$6
export MOEKIT_CONFIG_DIR="$(cd "$(dirname "$0")/../../../.." && pwd)/configs"
for round in 1 2; do
  for which in a b; do
    bin=$a; [ $which = b ] && bin=$b
    $bin bench --device cpu --model $model --dtype $dtype --batch 1 --threads $threads \
      --iterations 30 --json > $out/r${round}_$which.json
  done
done
