#!/usr/bin/env bash
# Session 45 run 3. build-carry/new.tar.xz: the branch as it lands, without the claim look-ahead
# (run 2: not kept): the gate/up kernel self-routes at one token with the shared experts fused
# too (bf16 and fp8; MX with a shared expert keeps its routing kernel). build-carry/base.tar.xz:
# the tree before (afc38f7's moekit). The self-routing and one-token-ring GPU tests, then base
# against new at 1 and 8 tokens, two rounds, alternating: the layers whose plan changes at one
# token (DeepSeek-V3, DeepSeek-V4-Flash, GLM-5, GLM-4.5 fp8; DeepSeek-V2-Lite bf16) and two whose
# plan does not (Kimi-K2, MiniMax-M2 fp8).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 200 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in new base; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
timeout -k 5 $(left 40) /tmp/new/moekit_cuda_tests --gtest_filter='*SelfRouted*:GpuLayerSmall.OneTokenRings' > $R/gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests.txt
pack
for i in 1 2; do for v in base new; do
  for md in deepseek-v3:fp8 deepseek-v4-flash:fp8 glm-5:fp8 glm-4.5:fp8 deepseek-v2-lite:bf16 kimi-k2:fp8 minimax-m2:fp8; do
    ( timeout -k 5 $(left 20) /tmp/$v/moekit bench --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8 --iterations 30 --json ) > $R/bn${i}_${v}_${md%:*}_${md#*:}.json 2> $R/bn${i}_${v}_${md%:*}_${md#*:}.err
    stamp "bn${i}_${v}_$md rc=$?"
  done
done; pack; done
stamp done
