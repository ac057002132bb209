#!/usr/bin/env bash
# Session 25 call 7: where the extension's libstdc++ symbols come from (diagnostic only).
set -uo pipefail
cd "$(dirname "$0")/.."
S=/tmp/pyinst/moekit/_moekit_ops.so
ls -la $S; g++ --version | head -1; nvcc --version | tail -2
nm -D --defined-only $S | c++filt | grep -E "std::basic_ostream|std::locale|num_put|codecvt" | head -12
nm -D --defined-only $S | wc -l
readelf -d $S | grep -E "NEEDED|RPATH|RUNPATH"
python3 -c "import torch, moekit; print(open('/proc/self/maps').read())" 2>&1 | grep -E "libstdc|libgcc_s" | awk '{print $6}' | sort -u
grep -rn "static-libstdc\|static-libgcc" build-py 2>/dev/null | head -3
grep -o -- "-static[a-z+-]*" build-py/*/build.ninja 2>/dev/null | sort | uniq -c | head
ls build-py 2>/dev/null; find / -name "build.ninja" -path "*build-py*" 2>/dev/null | head -2
