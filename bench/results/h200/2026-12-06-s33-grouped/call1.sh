#!/usr/bin/env bash
# Session 33 call 1: the grouped GEMM instances of the prefill path alone (moekit bench
# grouped-gemm: 7 bf16 and 6 fp8 CUTLASS instances, per GEMM, at 1024 / 4096 / 16384 tokens), the
# prefill GPU tests on every instance, memcheck on the small prefill case, and the layer with the
# fastest instances at 4096 tokens (MOEKIT_EXPERTS_GROUPED_GEMM) against the rule's, in one run.
# Binaries built on the development machine (build-carry/bins.tar.xz); built here if they fail.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
# seconds a step may take: at most $1, and none past 540 s of the call (the results still pack)
left() { local l=$(( 540 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
M=/tmp/bin/moekit; T=/tmp/bin/moekit_cuda_tests
if ! $M list-kernels > /dev/null 2>&1; then
  stamp "carried binaries do not run: building"
  mkdir -p /tmp/cutlass && tar -xJf build-carry/cutlass.tar.xz -C /tmp/cutlass
  cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
    -DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library > $R/build.log 2>&1
  cmake --build /tmp/b -j 16 >> $R/build.log 2>&1; stamp "build rc=$?"
  M=/tmp/b/moekit; T=/tmp/b/tests/moekit_cuda_tests
fi
stamp start
# 1. every instance alone, per GEMM
for spec in "deepseek-v3 bf16 1024,4096,16384" "qwen3-30b-a3b bf16 1024,4096,16384" \
            "minimax-m3 bf16 1024,4096,16384" "mixtral-8x7b bf16 1024,4096,16384" \
            "gpt-oss-120b bf16 4096" "deepseek-v3 fp8 1024,4096,16384" "minimax-m2 fp8 1024,4096"; do
  set -- $spec
  timeout $(left 120) $M bench grouped-gemm --model $1 --dtype $2 --batch $3 --json > $R/gg_$1_$2.json 2> $R/gg_$1_$2.err
  stamp "grouped-gemm $1 $2 rc=$?"; tail -2 $R/gg_$1_$2.err
done
python3 - $R <<'PY' | tee $R/gg_table.txt
import json, sys, glob, os
best = {}
for f in sorted(glob.glob(sys.argv[1] + "/gg_*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    print(f"== {os.path.basename(f)}: read {d['read_gbs']:.0f} GB/s, ceiling {d['peak_tflops']:.0f} TFLOP/s, mismatches {d['mismatches']}")
    recs = d["records"]
    for key in sorted({(r["batch"], r["gemm"]) for r in recs}):
        rs = sorted([r for r in recs if (r["batch"], r["gemm"]) == key], key=lambda r: r["us"])
        base = [r for r in rs if r["kernel"] in ("grouped_bf16_128x256_coop", "grouped_fp8_128x128_coop")][0]["us"]
        line = " ".join(f"{r['kernel'].replace('grouped_','')}={r['us']:.0f}({r['peak_fraction']:.2f}/{r['bw_fraction']:.2f})" for r in rs)
        print(f"T={key[0]:5d} {key[1]:7s} best/128coop={rs[0]['us']/base:.3f} | {line}")
        if key[0] == 4096:
            model, dtype = os.path.basename(f)[3:-5].rsplit("_", 1)
            best[(model, dtype, key[1])] = rs[0]["kernel"]
json.dump({f"{m} {d} {g}": k for (m, d, g), k in best.items()}, open(sys.argv[1] + "/best4096.json", "w"), indent=1)
PY
stamp table
# 2. the layer: the rule's instances against the fastest ones of step 1 at 4096 tokens
python3 - $R > $R/ab_specs.txt <<'PY'
import json, sys
best = json.load(open(sys.argv[1] + "/best4096.json"))
for model, dtype, batches in [("deepseek-v3", "bf16", "1024,4096,16384"), ("deepseek-v3", "fp8", "1024,4096,16384"),
                              ("qwen3-30b-a3b", "bf16", "1024,4096"), ("minimax-m3", "bf16", "4096"), ("mixtral-8x7b", "bf16", "4096")]:
    up, down = best.get(f"{model} {dtype} gate_up"), best.get(f"{model} {dtype} down")
    if up and down: print(model, dtype, batches, f"{up},{down}")
PY
while read model dtype batches gemms; do
  for how in rule best; do
    env=""; [ $how = best ] && env="MOEKIT_EXPERTS_GROUPED_GEMM=$gemms"
    ( timeout $(left 100) env $env $M bench --device cuda --model $model --dtype $dtype --batch $batches --fuse-shared on --iterations 5 --json ) > $R/layer_${model}_${dtype}_$how.json 2> $R/layer_${model}_${dtype}_$how.err
    stamp "layer $model $dtype $how ($gemms) rc=$?"; tail -1 $R/layer_${model}_${dtype}_$how.err
  done
done < $R/ab_specs.txt
python3 - $R <<'PY' | tee $R/layer_table.txt
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/layer_*.json")):
    try: recs = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    for r in recs:
        print(f"{os.path.basename(f)[6:-5]:28s} T={r['batch']:5d} us={r['us_per_layer']:9.1f} bw={r['bw_fraction']:.3f} "
              f"peak={r.get('peak_fraction',0):.3f} | {r['plan'][r['plan'].find('experts'):][:150]}")
PY
# 3. the prefill tests on every instance; memcheck on the small case
( time timeout $(left 240) $T --gtest_filter='GpuPrefill*' --gtest_brief=1 ) > $R/tests_prefill.txt 2>&1
stamp "prefill tests rc=$?"; grep -E "FAILED|Failure" $R/tests_prefill.txt | head -10; tail -4 $R/tests_prefill.txt
( timeout $(left 150) compute-sanitizer --tool memcheck --print-limit 50 --error-exitcode 9 $T --gtest_filter='GpuPrefill.SmallCaseForSanitizers:GpuPrefillFp8.GroupedGemmCutlassAgainstFormula' --gtest_brief=1 ) > $R/memcheck_prefill.txt 2>&1
stamp "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/memcheck_prefill.txt | tail -3
stamp done
tar -C $R -czf $OUT/results.tar.gz . && cp $R/gg_table.txt $R/layer_table.txt $OUT/
