#!/usr/bin/env bash
# Session 24 call 3: the fp8 down kernel's deep ring of weights only. Build; fp8 tests; bench fp8 (deep on / off) vs bf16; all GPU tests; ncu fp8 T1; sanitizers fp8 small
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $R/build_summary.txt
tar -xzf $R/b/logs.tar.gz -C $R/b 2>/dev/null
grep -h -A3 "Compiling entry function.*experts_bulk_kernel.*Lb1EEEvNS0_13ExpertsParamsE" $(find $R/b -name build.log) | grep -E "Compiling|spill|Used" > $R/ptxas_fp8.txt
rm -rf $R/b
T=build-gpu/tests/moekit_cuda_tests
M=build-gpu/moekit
( time timeout 300 $T --gtest_filter='GpuFp8*:GpuPrefillFp8*:*Instance*' --gtest_brief=1 ) > $R/test_fp8.txt 2>&1
tail -4 $R/test_fp8.txt
bench() { echo "== $1 $2 $3"; env $3 timeout 200 $M bench --device cuda --model $2 --batch 1,8,32,128 --dtype $1 --fuse-shared auto --iterations 8 --json 2>>$R/bench_stderr.txt; }
{ for m in deepseek-v3 minimax-m2 kimi-k2; do bench fp8 $m X=1; bench fp8 $m MOEKIT_EXPERTS_DOWN_DEEP=0; bench bf16 $m X=1; done; } > $R/bench.txt
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
    print('   ', d[0].get('plan','').split('|')[5] if d[0].get('plan') else '')
PY
cat $R/table.txt
( time timeout 420 $T --gtest_brief=1 ) > $R/test_all.txt 2>&1
tail -6 $R/test_all.txt
PROFILE_MODELS=deepseek-v3 PROFILE_TOKENS=1 PROFILE_ARGS="--expert-dtype fp8" STAGES=profile OUT=$R/p bash scripts/gpu_check.sh > /dev/null 2>&1
cp $R/p/ncu.txt $R/ncu_fp8_T1.txt 2>/dev/null; rm -rf $R/p
cat $R/ncu_fp8_T1.txt | cut -c1-200
SANITIZE_FILTER='GpuFp8Small.*' STAGES=sanitize OUT=$R/s bash scripts/gpu_check.sh > /dev/null 2>&1
cp $R/s/summary.txt $R/sanitize_summary.txt; rm -rf $R/s
grep -E "rc=|SUMMARY" $R/sanitize_summary.txt
tar -czf $OUT/res.tgz -C $R .
cp $R/table.txt $OUT/
