#!/usr/bin/env bash
# Session 41 run 3 (the command as it was passed to the device tool, on run 2's warm machine):
# the bf16 prefill layer with the 128-row cooperative grouped GEMM forced against the plan's
# choice, alternating, two rounds: Mixtral-8x7B at 512 / 1024 tokens, Qwen2-57B-A14B at 2048 /
# 4096, MiniMax-M3 at 4096. /tmp/main/moekit is run 2's carried binary of main.
export MOEKIT_CONFIG_DIR=$PWD/configs; mkdir -p $OUT/r; M=/tmp/main/moekit; [ -x $M ] || { mkdir -p /tmp/main; tar -xJf build-carry/main.tar.xz -C /tmp/main; }; nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/r/gpu.txt; for i in 1 2; do for v in plan coop; do for md in mixtral-8x7b:512,1024 qwen2-57b-a14b:2048,4096 minimax-m3:4096; do ( [ $v = coop ] && export MOEKIT_EXPERTS_GROUPED_GEMM=grouped_bf16_128x256_coop; timeout 40 $M bench --device cuda --model ${md%:*} --dtype bf16 --batch ${md#*:} --iterations 10 --json ) > $OUT/r/tile${i}_${v}_${md%:*}.json 2> $OUT/r/tile${i}_${v}_${md%:*}.err; echo "$i $v $md rc=$?"; done; done; done; tar -C $OUT/r -czf $OUT/results.tar.gz .
