#!/usr/bin/env python3
"""Compare the machine code of the kernels of two sets of cubins, kernel by kernel.

Each kernel's code is the `.text.<mangled name>` section of a cubin (an ELF file). The kernels of
the --base cubins are compared with those of the --new cubins (each side the union of its files):
per kernel, `identical` (the same bytes), `differing`, `only-in-base` or `only-in-new`. A kernel
of the base that is meant to be gone names a substring with --gone; it is reported `gone`.

With --base-log / --new-log (the output of `nvcc -Xptxas -v` for those cubins) it also prints
each kernel's registers, spill stores and spill loads on both sides, and flags any change.

With --rename REGEX=REPLACEMENT the new side's names are rewritten first, so that kernels
whose mangled name changed but not their code still pair up (e.g. a template parameter turned
from int into an enum: --rename 'LNS_4plan4RingE(\d)E=Li\1E').

Exit status: 0 when every kernel of the base that is not gone is identical in the new set and
the new set has no kernel the base lacks; 1 otherwise; 2 on a bad input.

Usage:
  compare_cubins.py --base base.cubin --new a.cubin b.cubin c.cubin \\
      --gone experts_bulk_fused_kernel --base-log base.ptxas --new-log a.ptxas b.ptxas c.ptxas

The cubins come from the project's compile flags (build/compile_commands.json) with -c -o and the
dependency flags replaced by -cubin -o X.cubin, and -Xptxas -v added for the log, e.g. for the
expert kernels (one translation unit at a time; the base at an older commit: git worktree add):
  nvcc -DMOEKIT_WITH_CUDA=1 -Iinclude -Isrc -O3 -DNDEBUG -Xcompiler=-fPIC \\
      -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -std=c++20 \\
      -x cu -Xptxas -v -cubin src/cuda/experts/experts_bulk_down.cu -o down.cubin 2> down.ptxas
"""

import argparse
import re
import shutil
import struct
import subprocess
import sys

TEXT_PREFIX = ".text."


class InputError(Exception):
    pass


def elf_sections(path):
    """{section name: bytes} of an ELF64 little-endian file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise InputError(f"{path}: not an ELF file (expected the magic 7f 45 4c 46)")
    if data[4] != 2 or data[5] != 1:
        raise InputError(f"{path}: expected a 64-bit little-endian ELF (class {data[4]}, "
                         f"data {data[5]})")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize != 64:
        raise InputError(f"{path}: expected section headers of 64 bytes, got {shentsize}")
    headers = []
    for i in range(shnum):
        name, stype, flags, addr, offset, size, link, info, align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        headers.append((name, stype, offset, size, info))
    if shstrndx >= shnum:
        raise InputError(f"{path}: section name table index {shstrndx} >= {shnum} sections")
    _, _, str_off, str_size, _ = headers[shstrndx]
    strtab = data[str_off:str_off + str_size]
    sections = {}
    for name, stype, offset, size, info in headers:
        end = strtab.index(b"\0", name)
        sname = strtab[name:end].decode("ascii", "replace")
        # SHT_NOBITS (8) occupies no bytes in the file
        sections[sname] = b"" if stype == 8 else data[offset:offset + size]
    return sections


def kernels_of(paths):
    """{mangled name: (code bytes, file)} over the cubins; a name in two files is an error."""
    out = {}
    for path in paths:
        for name, code in elf_sections(path).items():
            if not name.startswith(TEXT_PREFIX):
                continue
            kernel = name[len(TEXT_PREFIX):]
            if kernel in out:
                raise InputError(f"{kernel}: in both {out[kernel][1]} and {path}")
            out[kernel] = (code, path)
    return out


PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
PTXAS_FUNC = re.compile(r"Function properties for (\S+)")
PTXAS_SPILL = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGS = re.compile(r"Used (\d+) registers")


def ptxas_stats(paths):
    """{mangled name: (registers, spill stores, spill loads)} from `ptxas -v` logs."""
    stats = {}
    for path in paths:
        current = None
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = PTXAS_ENTRY.search(line)
                if m:
                    current = m.group(1)
                    stats[current] = [None, 0, 0]
                    continue
                m = PTXAS_FUNC.search(line)
                if m:
                    # properties of a non-entry function are not the kernel's
                    if m.group(1) != current:
                        current = None
                    continue
                if current is None:
                    continue
                m = PTXAS_SPILL.search(line)
                if m:
                    stats[current][1] = int(m.group(2))
                    stats[current][2] = int(m.group(3))
                    continue
                m = PTXAS_REGS.search(line)
                if m:
                    stats[current][0] = int(m.group(1))
                    current = None
    return {k: tuple(v) for k, v in stats.items()}


def demangler():
    """A function from mangled to readable names (cu++filt or c++filt, if installed)."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None:
        return lambda names: {n: n for n in names}

    def run(names):
        names = list(names)
        res = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True,
                             check=False)
        lines = res.stdout.splitlines()
        if res.returncode != 0 or len(lines) != len(names):
            return {n: n for n in names}
        return dict(zip(names, lines))

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", nargs="+", required=True, help="the reference cubins")
    ap.add_argument("--new", nargs="+", required=True, help="the cubins to check")
    ap.add_argument("--gone", action="append", default=[],
                    help="a substring of the mangled names of base kernels meant to be removed")
    ap.add_argument("--base-log", nargs="*", default=[], help="ptxas -v output of the base")
    ap.add_argument("--new-log", nargs="*", default=[], help="ptxas -v output of the new side")
    ap.add_argument("--mangled", action="store_true", help="print mangled names only")
    ap.add_argument("--rename", action="append", default=[], metavar="REGEX=REPLACEMENT",
                    help="rewrite the new side's mangled names (re.sub) before matching, e.g. "
                         "for a template parameter whose type changed")
    args = ap.parse_args()
    try:
        base = kernels_of(args.base)
        new = kernels_of(args.new)
        base_stats = ptxas_stats(args.base_log)
        new_stats = ptxas_stats(args.new_log)
        for rule in args.rename:
            if "=" not in rule:
                raise InputError(f"--rename {rule!r}: expected REGEX=REPLACEMENT")
            pattern, repl = rule.split("=", 1)
            new = {re.sub(pattern, repl, k): v for k, v in new.items()}
            new_stats = {re.sub(pattern, repl, k): v for k, v in new_stats.items()}
    except (InputError, OSError, re.error) as e:
        print(f"compare_cubins: {e}", file=sys.stderr)
        return 2
    if not base:
        print(f"compare_cubins: no {TEXT_PREFIX}* sections in {' '.join(args.base)}",
              file=sys.stderr)
        return 2

    names = sorted(set(base) | set(new))
    readable = {n: n for n in names} if args.mangled else demangler()(names)
    counts = {}
    regs_changed = []
    failed = False
    for name in names:
        if name in base and name in new:
            b, n = base[name][0], new[name][0]
            if b == n:
                verdict = "identical"
            else:
                verdict = "differing"
                failed = True
            detail = f"{len(b)} / {len(n)} bytes"
        elif name in base:
            if any(g in name for g in args.gone):
                verdict = "gone"
            else:
                verdict = "only-in-base"
                failed = True
            detail = f"{len(base[name][0])} bytes"
        else:
            verdict = "only-in-new"
            failed = True
            detail = f"{len(new[name][0])} bytes"
        sb, sn = base_stats.get(name), new_stats.get(name)
        if sb or sn:
            fmt = lambda s: "-" if s is None else f"{s[0]} regs, spills {s[1]}/{s[2]}"
            detail += f"; base {fmt(sb)}, new {fmt(sn)}"
            if sb and sn and sb != sn:
                detail += "  <-- ptxas stats changed"
                regs_changed.append(name)
        counts[verdict] = counts.get(verdict, 0) + 1
        print(f"{verdict:13} {readable[name]}  ({detail})")

    print()
    print("summary: " + ", ".join(f"{counts[v]} {v}" for v in
                                  ("identical", "differing", "gone", "only-in-base",
                                   "only-in-new") if v in counts))
    if regs_changed:
        print(f"ptxas stats changed for {len(regs_changed)} kernel(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
