#!/usr/bin/env bash
# Session 26 call 1: build (this tree; the base = this tree without the fp8 early release, CLI only);
# every GPU test; the Python package's pytest on the GPU (tiny models of width 64); fp8 bench
# base vs new, bf16 beside; racecheck on the fp8 small cases; initcheck on an EP case.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
CUT=/tmp/cutlass/cutlass_library
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=$CUT"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $R/build_summary.txt; stamp build; cat $R/build_summary.txt | tail -4
tar -xzf $R/b/logs.tar.gz -C $R/b 2>/dev/null
grep -h -A3 "Compiling entry function.*experts_bulk_kernel.*Lb1EEEvNS0_13ExpertsParamsE" $(find $R/b -name build.log) | grep -E "Compiling|spill|Used" > $R/ptxas_fp8.txt
( mkdir -p /tmp/base && tar --exclude=./build-gpu --exclude=./build-ab --exclude=./.git -cf - . | tar -xf - -C /tmp/base
  cd /tmp/base && patch -p1 -R < $REPO/build-ab/fp8_release.patch
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON -DMOEKIT_CUTLASS_DIR=$CUT > /dev/null && ninja -C build moekit > /dev/null; echo "base build rc=$?"
  rm -rf /tmp/pyinst; cd $REPO
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
   --no-deps --target /tmp/pyinst $REPO -Cminimum-version=1.1 -Ccmake.define.MOEKIT_CUDA=ON \
   -Ccmake.define.MOEKIT_CUTLASS_DIR=$CUT; echo "py build rc=$?" ) > $R/side_builds.txt 2>&1 &
SP=$!
T=build-gpu/tests/moekit_cuda_tests
( time timeout 240 $T --gtest_brief=1 ) > $R/test_all.txt 2>&1
stamp gtest; grep -E "FAILED|Failure" $R/test_all.txt | head -20; tail -6 $R/test_all.txt
wait $SP; stamp side builds; tail -4 $R/side_builds.txt
( cd python/tests && PYTHONPATH=/tmp/pyinst timeout 120 python3 -m pytest -q -p no:cacheprovider -rs ) > $R/pytest_gpu.txt 2>&1
stamp pytest; tail -12 $R/pytest_gpu.txt
bench() { echo "== $1 $2 $3"; timeout 60 $3 bench --device cuda --model $2 --batch 1,8,32 --dtype $1 --fuse-shared auto --iterations 8 --json 2>>$R/bench_stderr.txt; }
NEW=build-gpu/moekit; BASE=/tmp/base/build/moekit
{ for m in deepseek-v3 minimax-m2 kimi-k2; do bench fp8 $m $BASE; bench fp8 $m $NEW; done; bench bf16 deepseek-v3 $NEW; bench fp8 deepseek-v3 $BASE; bench fp8 deepseek-v3 $NEW; } > $R/bench.txt
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
( time timeout 70 compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter='GpuFp8Small.*' --gtest_brief=1 ) > $R/racecheck_fp8.txt 2>&1
stamp "racecheck rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $R/racecheck_fp8.txt | tail -3
( time timeout 80 compute-sanitizer --tool initcheck --error-exitcode 9 $T --gtest_filter='Models/EpLocal.*/qwen3*' --gtest_brief=1 ) > $R/initcheck_ep.txt 2>&1
stamp "initcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/initcheck_ep.txt | tail -3; grep "Device Frame" $R/initcheck_ep.txt | sort | uniq -c | head
rm -rf $R/b
tar -czf $OUT/res.tgz -C $R .
cp $R/table.txt $R/test_all.txt $R/pytest_gpu.txt $OUT/
