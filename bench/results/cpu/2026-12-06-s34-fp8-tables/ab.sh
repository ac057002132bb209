#!/usr/bin/env bash
# The fast CPU backend's fp8 decode kernels before (the tree at 1c8f56e, built in a worktree) and
# after (the AVX-512 table kernels) on this machine, one after the other, DeepSeek-V3 fp8 at one
# token, 2 threads (and 1, the bench's scaling row). Usage: ab.sh BEFORE_MOEKIT AFTER_MOEKIT OUTDIR
set -euo pipefail
before=$1 after=$2 out=$3
export MOEKIT_CONFIG_DIR="$(cd "$(dirname "$0")/../../../.." && pwd)/configs"
for how in before after; do
  bin=$before; [ $how = after ] && bin=$after
  $bin bench --device cpu --model deepseek-v3 --dtype fp8 --batch 1 --fuse-shared on --threads 2 \
    --iterations 10 --json > $out/fp8_$how.json
done
