#!/usr/bin/env bash
# Session 24 call 2: probes of the fp8 consumer (MOEKIT_FP8_PROBE 0 normal, 1 L1 loads, 2 no mma, 3 no activation loads)
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $R/build_summary.txt; rm -rf $R/b
M=build-gpu/moekit
for p in 0 1 2 3; do for m in deepseek-v3 minimax-m2; do
  echo "== probe$p $m"; MOEKIT_FP8_PROBE=$p timeout 200 $M bench --device cuda --model $m --batch 1,8,32,128 --dtype fp8 --fuse-shared auto --iterations 8 --json 2>>$R/bench_stderr.txt
done; done > $R/bench.txt
echo "== bf16 deepseek-v3"; timeout 200 $M bench --device cuda --model deepseek-v3 --batch 1,8,32,128 --dtype bf16 --fuse-shared on --iterations 8 --json >> $R/bench.txt 2>>$R/bench_stderr.txt
python3 - $R/bench.txt > $R/table.txt <<'PY'
import json,sys
cur=None;buf='';out=[]
for line in open(sys.argv[1]):
    if line.startswith('== '):
        if buf.strip(): out.append((cur,buf))
        cur=line[3:].strip();buf=''
    else: buf+=line
if buf.strip(): out.append((cur,buf))
for cur,b in out:
    try: d=json.loads(b)
    except Exception as e: print(cur,'parse error',e); continue
    print(cur, ' '.join('%d:%.1f/%.3f'%(r['batch'],r['us_per_layer'],r['bw_fraction']) for r in d))
PY
cat $R/table.txt
MOEKIT_FP8_PROBE=1 timeout 100 build-gpu/tests/moekit_cuda_tests --gtest_filter='GpuFp8*' --gtest_brief=1 > $R/test_probe1.txt 2>&1; tail -3 $R/test_probe1.txt
tar -czf $OUT/res.tgz -C $R .
cp $R/table.txt $OUT/
