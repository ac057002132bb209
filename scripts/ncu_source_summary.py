#!/usr/bin/env python3
"""Summarise `ncu --page source --csv --print-source sass` output (gpu_check.sh stage profile,
PROFILE_SOURCE=1): per kernel, the warp instructions executed, the stall-reason mix of the warp
samples, and the instructions with the most samples (with their execution counts, which tell the
code's role: a consumer instruction runs once per stage and consumer warp, a producer one once per
stage), and per mbarrier (by its shared-memory offset) the waits executed (retries included) and
the samples on the branch after each wait, which tell who waits on whom (the bulk kernels'
barriers lie in the order full, empty, reduction full, reduction empty: experts_bulk_kernel.cuh).
Usage: ncu_source_summary.py FILE.csv[.gz] [top]"""
import csv
import gzip
import re
import sys

REASONS = ["stall_barrier", "stall_branch_resolving", "stall_dispatch", "stall_drain", "stall_imc",
           "stall_lg", "stall_long_sb", "stall_math", "stall_membar", "stall_mio", "stall_misc",
           "stall_no_inst", "stall_not_selected", "stall_selected", "stall_short_sb", "stall_sleep",
           "stall_tex", "stall_wait"]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def kernels(path):
    opener = gzip.open if path.endswith(".gz") else open
    out, cur = [], None
    with opener(path, "rt") as f:
        for line in f:
            if not line.startswith('"'):
                continue  # the application's own output and ncu's notes
            row = next(csv.reader([line]))
            if row[0] == "Kernel Name":
                cur = {"name": row[1], "rows": []}
                out.append(cur)
            elif cur is not None and row[0] == "Address":
                cur["col"] = {name: i for i, name in enumerate(row)}
            elif cur is not None:
                cur["rows"].append(row)
    return out


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    for k in kernels(path):
        col, rows = k["col"], k["rows"]
        samples = col["Warp Stall Sampling (All Samples)"]
        executed = col["Instructions Executed"]
        total = sum(number(r[samples]) for r in rows) or 1.0
        print(f"== {k['name'][:150]}")
        print(f"   warp instructions executed {sum(number(r[executed]) for r in rows):.0f},"
              f" warp samples {total:.0f}")
        mix = {r: sum(number(row[col[r]]) for row in rows) for r in REASONS if r in col}
        ranked = sorted(mix.items(), key=lambda kv: -kv[1])
        print("   stalls: " + ", ".join(f"{r[6:]} {100 * v / total:.1f}%" for r, v in ranked
                                       if v / total > 0.005))
        for r in sorted(rows, key=lambda r: -number(r[samples]))[:top]:
            print(f"   {100 * number(r[samples]) / total:5.1f}%  exec {number(r[executed]):>10.0f}"
                  f"  {r[1].strip()[:80]}")
        # an mbarrier wait is a TRYWAIT and, within a few instructions, the branch taken while
        # its phase is incomplete (to a retry loop with a TRYWAIT of its own): the samples on
        # that branch are the warps' waiting there
        waits = {}
        for i, r in enumerate(rows):
            m = re.search(r"TRYWAIT \S+ \[[^]]*\+0x([0-9a-f]+)\]", r[1])
            if not m:
                continue
            w = waits.setdefault(int(m.group(1), 16), [0.0, 0.0])
            w[0] += number(r[executed])
            branch = next((b for b in rows[i + 1:i + 4] if "BRA" in b[1]), None)
            if branch is not None:
                w[1] += number(branch[samples])
        if waits:
            print("   mbarrier waits (smem offset: executed, samples on the branch after it): " +
                  ", ".join(f"0x{off:x}: {w[0]:.0f}, {100 * w[1] / total:.1f}%"
                            for off, w in sorted(waits.items())))


if __name__ == "__main__":
    main()
