#!/usr/bin/env bash
# Session 27 call 1: the fp8 producers' L2 prefetch of each chunk's weight scales (this tree)
# against the tree without it (base), and two probes on this tree (wrong results by design:
# MOEKIT_FP8_PROBE=1 the consumers' weight scales constant, =2 also their activation codes and
# scales, so the consumers touch no global memory); fp8 GPU tests of this tree; ncu at 1 token.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
REPO=$PWD
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
CUT=/tmp/cutlass/cutlass_library
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=$CUT"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
side() {  # side NAME PATCH_ARGS CUDA_FLAGS: a copy of this tree, patched, the CLI built
  mkdir -p /tmp/$1 && tar --exclude=./build-gpu --exclude=./build-ab --exclude=./build --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C /tmp/$1
  cd /tmp/$1 && eval "$2" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
    -DMOEKIT_CUTLASS_DIR=$CUT "-DCMAKE_CUDA_FLAGS=$3" > /dev/null && ninja -C build moekit > /dev/null
  echo "$1 build rc=$?"
}
( side base "patch -p1 -R < $REPO/bench/results/h200/2026-12-03-s27-fp8-scales/run1_prefetch.patch" "" ) > $R/side_base.txt 2>&1 &
( side p1 "patch -p1 < $REPO/bench/results/h200/2026-12-03-s27-fp8-scales/run1_probe.patch" "-DMOEKIT_FP8_PROBE=1" ) > $R/side_p1.txt 2>&1 &
( side p2 "patch -p1 < $REPO/bench/results/h200/2026-12-03-s27-fp8-scales/run1_probe.patch" "-DMOEKIT_FP8_PROBE=2" ) > $R/side_p2.txt 2>&1 &
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
stamp build; tail -3 $R/b/summary.txt
tar -xzf $R/b/logs.tar.gz -C $R/b 2>/dev/null
grep -h -A3 "Compiling entry function.*experts_bulk_kernel.*Lb1EEEvNS0_13ExpertsParamsE" $(find $R/b -name build.log) | grep -E "Compiling|spill|Used" > $R/ptxas_fp8.txt
T=build-gpu/tests/moekit_cuda_tests
( timeout 60 $T --gtest_filter='*Fp8*:*fp8*' --gtest_brief=1 ) > $R/test_fp8.txt 2>&1
stamp "fp8 tests"; tail -3 $R/test_fp8.txt
wait; stamp side builds; cat $R/side_*.txt | grep rc=
bench() { echo "== $1 $2 $3"; timeout 60 $3 bench --device cuda --model $2 --batch 1,8,32 --dtype $1 --fuse-shared auto --iterations 8 --json 2>>$R/bench_stderr.txt; }
NEW=build-gpu/moekit; BASE=/tmp/base/build/moekit
{ for m in deepseek-v3 minimax-m2; do bench fp8 $m $BASE; bench fp8 $m $NEW; done
  for m in deepseek-v3 minimax-m2; do bench fp8 $m /tmp/p1/build/moekit; bench fp8 $m /tmp/p2/build/moekit; done
  bench bf16 deepseek-v3 $NEW; bench fp8 deepseek-v3 $BASE; bench fp8 deepseek-v3 $NEW; } > $R/bench.txt
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
PROFILE_MODELS=deepseek-v3 PROFILE_TOKENS=1 PROFILE_SOURCE=1 PROFILE_ARGS="--expert-dtype fp8" \
  STAGES=profile OUT=$R/p timeout 110 bash scripts/gpu_check.sh > /dev/null 2>&1
stamp profile; cp $R/p/ncu.txt $R/ncu_fp8_T1.txt 2>/dev/null; cp $R/p/ncu_source.txt $R/ncu_source_fp8_T1.txt 2>/dev/null
cut -c1-160 $R/ncu_fp8_T1.txt | head -20; head -30 $R/ncu_source_fp8_T1.txt | cut -c1-160
rm -rf $R/b $R/p
cp $R/table.txt $R/bench.txt $R/test_fp8.txt $R/ptxas_fp8.txt $R/ncu_fp8_T1.txt $R/ncu_source_fp8_T1.txt $OUT/ 2>/dev/null
tar -czf $OUT/res.tgz -C $R .
