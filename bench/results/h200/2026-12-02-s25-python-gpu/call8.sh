#!/usr/bin/env bash
# Session 25 call 8: the extension's link line, and which input defines the libstdc++ symbols.
set -uo pipefail
cd build-py/cp312-cp312-linux_x86_64
L=$(ninja -t commands moekit_torch 2>/dev/null | tail -1)
echo "$L" | tr ' ' '\n' | grep -vE "\.o$" | head -40
eval "${L/ -o / -Wl,-y,_ZNSo9_M_insertIlEERSoT_ -Wl,-y,_ZNKSt19__codecvt_utf8_baseIDiE10do_unshiftER11__mbstate_tPcS3_RS3_ -o }" 2>&1 | head -10
