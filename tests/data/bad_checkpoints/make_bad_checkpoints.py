#!/usr/bin/env python3
"""Writes the malformed safetensors files next to this script (committed; BadCheckpoint.CommittedFixtures
in tests/test_checkpoint.cpp opens each and checks the error). Also seeds for a safetensors fuzzer.
Run: python3 make_bad_checkpoints.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTER = "model.layers.0.mlp.gate.weight"


def write(name, header, data=b"", length=None):
    text = header if isinstance(header, str) else json.dumps(header)
    raw = text.encode()
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(struct.pack("<Q", len(raw) if length is None else length))
        f.write(raw)
        f.write(data)


def entry(dtype, shape, begin, end):
    return {ROUTER: {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}}


with open(os.path.join(HERE, "truncated_length.safetensors"), "wb") as f:
    f.write(b"\x10\x00\x00")  # 3 bytes: not even the header length
write("header_past_end.safetensors", "{}", length=4096)
write("bad_json.safetensors", '{"%s": {"dtype": "BF16", "shape": [2, 2' % ROUTER, b"\0" * 8)
write("offsets_out_of_range.safetensors", entry("BF16", [2, 2], 0, 8), b"\0" * 4)
write("span_mismatch.safetensors", entry("F32", [2, 3], 0, 16), b"\0" * 24)
write("shape_overflow.safetensors", entry("BF16", [2**62, 8], 0, 0))
write("begin_after_end.safetensors", entry("BF16", [1], 4, 2), b"\0" * 4)
write("unknown_dtype.safetensors", entry("Q4_WEIRD", [2, 2], 0, 2), b"\0" * 2)
