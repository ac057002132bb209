#!/usr/bin/env bash
# Session 45 run 2. build-carry/new.tar.xz: the branch as it lands (the gate/up kernel self-routes
# at one token with the shared experts fused too, bf16 and fp8, MX with a shared expert keeping
# its routing kernel; claims 1 item ahead where the lists are in registers, MX 2; no knob);
# build-carry/base.tar.xz: the tree before (afc38f7's moekit). On any GPU: the self-routing, fp8,
# small-layer and instance GPU tests (run 1's failure was the fp8 test's launch count asked of the
# unfused DeepSeek-V3 layer, which fp8 does not hold); memcheck and racecheck on the fp8
# self-routing test; base against new at 1 and 8 tokens, two rounds, alternating. On an H200
# then: new's fp8 and MX decode layers at 1-128 tokens.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 420 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
pack() { tar -C $R -czf $OUT/results.tar.gz .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in new base; do mkdir -p /tmp/$v; tar -xJf build-carry/$v.tar.xz -C /tmp/$v; done
S=/tmp/new/moekit_cuda_tests
timeout -k 5 $(left 90) $S --gtest_filter='*SelfRouted*:EveryInstance/*self_route*:GpuFp8.*:GpuLayerSmall.OneTokenRings:GpuLayerSmall.Bulk*' > $R/gpu_tests.txt 2>&1; stamp "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|FAILED  \]" $R/gpu_tests.txt
for tool in memcheck racecheck; do
  timeout -k 5 $(left 45) compute-sanitizer --tool $tool $S --gtest_filter='GpuFp8.SelfRouted*' > $R/$tool.txt 2>&1; stamp "$tool rc=$?"
  tail -2 $R/$tool.txt
done
pack
for i in 1 2; do for v in base new; do
  for md in deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8 deepseek-v4-flash:fp8 glm-5:fp8 gpt-oss-120b:mxfp4 qwen3-30b-a3b:bf16 deepseek-v2-lite:bf16; do
    ( timeout -k 5 $(left 20) /tmp/$v/moekit bench --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8 --iterations 30 --json ) > $R/bn${i}_${v}_${md%:*}_${md#*:}.json 2> $R/bn${i}_${v}_${md%:*}_${md#*:}.err
    stamp "bn${i}_${v}_$md rc=$?"
  done
done; pack; done
( timeout -k 5 $(left 20) /tmp/new/moekit bench --device cuda --model deepseek-v3 --dtype fp8 --batch 1 --iterations 20 --trace --json ) > $R/trace_new_deepseek-v3_fp8.json 2> $R/trace_new_deepseek-v3_fp8.err
pack
grep -q H200 $R/gpu.txt || { stamp done; exit 0; }
for md in deepseek-v3:fp8 kimi-k2:fp8 minimax-m2:fp8 gpt-oss-120b:mxfp4 minimax-m3:mxfp8; do
  ( timeout -k 5 $(left 30) /tmp/new/moekit bench --device cuda --model ${md%:*} --dtype ${md#*:} --batch 1,8,32,128 --iterations 20 --json ) > $R/dec_${md%:*}_${md#*:}.json 2> $R/dec_${md%:*}_${md#*:}.err
  stamp "dec_$md rc=$?"
done
stamp done
pack
