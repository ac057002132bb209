#!/usr/bin/env bash
# Session 27 call 2: the fp8 one-token rings (the stage carries the e4m3 activation row and the
# chunk's scales). The fp8 and instance GPU tests; fp8 bench with the rings against the same
# binary without them (MOEKIT_EXPERTS_ONE_TOKEN_RING=0: the rings of weights only, the previous
# plan), bf16 beside; memcheck and racecheck on GpuFp8Small; ncu at one token.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
stamp build; tail -3 $R/b/summary.txt
tar -xzf $R/b/logs.tar.gz -C $R/b 2>/dev/null
grep -h -A3 "Compiling entry function.*experts_bulk_kernel.*Lb1EEEvNS0_13ExpertsParamsE" $(find $R/b -name build.log) | grep -E "Compiling|spill|Used" > $R/ptxas_fp8.txt
T=build-gpu/tests/moekit_cuda_tests
( timeout 150 $T --gtest_filter='GpuFp8*:EngineFp8Gpu*:EveryInstance*' --gtest_brief=1 ) > $R/test_fp8.txt 2>&1
stamp "fp8 + instance tests"; grep -E "FAILED|Failure" $R/test_fp8.txt | head; tail -3 $R/test_fp8.txt
bench() { echo "== $*"; timeout 60 env $1 build-gpu/moekit bench --device cuda --model $3 --batch 1,8,32 --dtype $2 --fuse-shared auto --iterations 8 --json 2>>$R/bench_stderr.txt; }
{ for m in deepseek-v3 minimax-m2 kimi-k2; do bench MOEKIT_EXPERTS_ONE_TOKEN_RING=0 fp8 $m; bench X=1 fp8 $m; done
  bench X=1 bf16 deepseek-v3; bench MOEKIT_EXPERTS_ONE_TOKEN_RING=0 fp8 deepseek-v3; bench X=1 fp8 deepseek-v3; } > $R/bench.txt
stamp bench
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
for tool in memcheck racecheck; do
  ( timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='GpuFp8Small.*' --gtest_brief=1 ) > $R/${tool}_fp8.txt 2>&1
  stamp "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $R/${tool}_fp8.txt | tail -3
done
PROFILE_MODELS=deepseek-v3 PROFILE_TOKENS=1 PROFILE_SOURCE=1 PROFILE_ARGS="--expert-dtype fp8" \
  STAGES=profile OUT=$R/p timeout 100 bash scripts/gpu_check.sh > /dev/null 2>&1
stamp profile; cp $R/p/ncu.txt $R/ncu_fp8_T1.txt 2>/dev/null; cp $R/p/ncu_source.txt $R/ncu_source_fp8_T1.txt 2>/dev/null
cut -c1-160 $R/ncu_fp8_T1.txt | head -12; head -24 $R/ncu_source_fp8_T1.txt | cut -c1-160
rm -rf $R/b $R/p
cp $R/table.txt $R/bench.txt $R/test_fp8.txt $R/ptxas_fp8.txt $R/ncu_source_fp8_T1.txt $OUT/ 2>/dev/null
tar -czf $OUT/res.tgz -C $R .
