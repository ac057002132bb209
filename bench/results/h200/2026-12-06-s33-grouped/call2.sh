#!/usr/bin/env bash
# Session 33 call 2: the table cut to the instances that won a GEMM of call 1 (bf16 128x256
# cooperative and 64x256 ping-pong; fp8 128x128 cooperative, its 1x2 cluster, 64x128 ping-pong);
# the whole layer (moekit bench, graph replay) with each pair of instances for the gate/up and the
# down GEMM forced (MOEKIT_EXPERTS_GROUPED_GEMM), per model and batch, in one run; the first pair
# again at the end (drift); the prefill GPU tests on the cut table.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { local l=$(( 430 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
M=/tmp/bin/moekit; T=/tmp/bin/moekit_cuda_tests
$M list-kernels | grep grouped_
b128=grouped_bf16_128x256_coop; b64=grouped_bf16_64x256_pingpong
f128=grouped_fp8_128x128_coop; f64=grouped_fp8_64x128_pingpong; fc=grouped_fp8_128x128_coop_c1x2
run() {  # run MODEL DTYPE BATCHES UP DOWN TAG
  ( timeout $(left 60) env MOEKIT_EXPERTS_GROUPED_GEMM=$4,$5 $M bench --device cuda --model $1 --dtype $2 --batch $3 \
      --fuse-shared on --iterations 10 --json ) > $R/layer_$1_$2_$6.json 2> $R/layer_$1_$2_$6.err
  stamp "layer $1 $2 $4,$5 rc=$?"
}
for m in deepseek-v3 minimax-m3 qwen3-30b-a3b mixtral-8x7b; do
  for up in $b128 $b64; do for down in $b128 $b64; do
    run $m bf16 512,1024,2048,4096,16384 $up $down "${up#grouped_bf16_}-${down#grouped_bf16_}"
  done; done
done
for m in deepseek-v3 minimax-m2; do
  for up in $f128 $f64; do for down in $f128 $f64 $fc; do
    run $m fp8 256,512,1024,2048,4096,16384 $up $down "${up#grouped_fp8_}-${down#grouped_fp8_}"
  done; done
done
run deepseek-v3 bf16 512,1024,2048,4096,16384 $b128 $b128 "again-128x256_coop-128x256_coop"
run deepseek-v3 fp8 256,512,1024,2048,4096,16384 $f128 $f128 "again-128x128_coop-128x128_coop"
python3 - $R <<'PY' | tee $R/layer_grid.txt
import json, sys, glob, os, collections
rows = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/layer_*.json")):
    name = os.path.basename(f)[6:-5]
    model, dtype, tag = name.split("_", 2)
    try: recs = json.load(open(f))
    except Exception as e: print(name, "unreadable", e); continue
    for r in recs: rows[(model, dtype, r["batch"])][tag] = (r["us_per_layer"], r.get("peak_fraction", 0), r["bw_fraction"])
for key in sorted(rows):
    d = rows[key]; best = min(d, key=lambda t: d[t][0])
    print(f"{key[0]:14s} {key[1]} T={key[2]:5d} best {best:40s} " + " ".join(f"{t}={v[0]:.0f}" for t, v in sorted(d.items())))
PY
( time timeout $(left 200) $T --gtest_filter='GpuPrefill*' --gtest_brief=1 ) > $R/tests_prefill.txt 2>&1
stamp "prefill tests rc=$?"; grep -E "FAILED|Failure" $R/tests_prefill.txt | head -10; tail -4 $R/tests_prefill.txt
stamp done
tar -C $R -czf $OUT/results.tar.gz . && cp $R/layer_grid.txt $OUT/
