#!/usr/bin/env bash
# Session 27 call 3: the fp8 down kernel at one token (bulk_down_one_token_deep_fp8, 65% of DRAM
# under ncu): its combine in passes (run3_passes.patch, a candidate) and two probes, wrong results
# by design: no combine (run3_probe_no_combine.patch), and no scale copies in either one-token
# ring (run3_probe_no_scale_copies.patch: two to three fewer bulk copies per stage). Each tree's
# CLI built from this tree (HEAD) patched; fp8 at one token, each model in turn.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
REPO=$PWD
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
CUT=/tmp/cutlass/cutlass_library
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
P=$REPO/bench/results/h200/2026-12-03-s27-fp8-scales
side() {  # side NAME PATCH: a copy of this tree, patched, the CLI built
  mkdir -p /tmp/$1 && tar --exclude=./build-gpu --exclude=./build-ab --exclude=./build --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C /tmp/$1
  cd /tmp/$1 && { [ -z "$2" ] || patch -p1 < $2; } && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
    -DMOEKIT_CUTLASS_DIR=$CUT > /dev/null && ninja -C build moekit > /dev/null
  echo "$1 build rc=$?"
}
( side head "" ) > $R/side_head.txt 2>&1 &
( side passes $P/run3_passes.patch ) > $R/side_passes.txt 2>&1 &
( side nocombine $P/run3_probe_no_combine.patch ) > $R/side_nocombine.txt 2>&1 &
( side noscales $P/run3_probe_no_scale_copies.patch ) > $R/side_noscales.txt 2>&1 &
wait; stamp builds; cat $R/side_*.txt | grep rc=
bench() { echo "== $1 $2"; timeout 40 /tmp/$1/build/moekit bench --device cuda --model $2 --batch 1 --dtype fp8 --fuse-shared auto --iterations 8 --json 2>>$R/bench_stderr.txt; }
{ for m in deepseek-v3 kimi-k2 minimax-m2 deepseek-v3; do for t in head passes nocombine noscales; do bench $t $m; done; done; } > $R/bench.txt
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
cp $R/table.txt $R/bench.txt $OUT/
