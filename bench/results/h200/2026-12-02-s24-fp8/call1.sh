#!/usr/bin/env bash
# Session 24 call 1: build; fp8 GPU tests first, then all GPU tests; bench fp8 vs bf16; ncu fp8 T1; sanitizers on fp8 small
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
( time timeout 300 $T --gtest_filter='GpuFp8*:GpuPrefillFp8*' --gtest_brief=1 ) > $R/test_fp8.txt 2>&1
tail -5 $R/test_fp8.txt
for d in fp8 bf16; do for m in deepseek-v3 minimax-m2 kimi-k2; do
  echo "== $d $m"; timeout 200 $M bench --device cuda --model $m --batch 1,8,32,128 --dtype $d --fuse-shared auto --iterations 8 --json 2>>$R/bench_stderr.txt
done; done > $R/bench.txt
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
    for r in d:
        print(cur, r['batch'], round(r['us_per_layer'],1), round(r['bw_fraction'],3), r.get('plan','').split('|')[4:6] if r['batch']==1 else '')
PY
cat $R/table.txt
( time timeout 400 $T --gtest_brief=1 ) > $R/test_all.txt 2>&1
tail -8 $R/test_all.txt
PROFILE_MODELS=deepseek-v3 PROFILE_TOKENS=1 PROFILE_ARGS="--expert-dtype fp8" PROFILE_SOURCE=1 STAGES=profile OUT=$R/p bash scripts/gpu_check.sh > /dev/null 2>&1
cp $R/p/ncu.txt $R/ncu_fp8_T1.txt 2>/dev/null; cp $R/p/ncu_source.txt $R/ncu_source_fp8_T1.txt 2>/dev/null; rm -rf $R/p
SANITIZE_FILTER='GpuFp8Small.*' STAGES=sanitize OUT=$R/s bash scripts/gpu_check.sh > /dev/null 2>&1
cp $R/s/summary.txt $R/sanitize_summary.txt; rm -rf $R/s
cuobjdump -sass build-gpu/libmoekit.a 2>/dev/null | awk '/Function :.*experts_bulk_kernel.*Lb1EEEvNS/{f=1} f&&/Function :/&&!/Lb1EEEvNS/{f=0} f' | grep -oE "(HMMA|F2FP|LOP3|SHF|PRMT|IMAD|LDS|LDG)[A-Z0-9._]*" | sort | uniq -c | sort -rn | head -20 > $R/sass_mix.txt
ls -la $R
tar -czf $OUT/res.tgz -C $R .
cp $R/table.txt $R/sass_mix.txt $OUT/ 2>/dev/null
