// Keeping fp8 block-scale weights as they are stored (LoadOptions::expert_format = Fp8Block): the
// checks and copies that turn a checkpoint's F8_E4M3 matrices and their scale tensors into
// ExpertView's fp8 fields (weights.h). Used by load_checkpoint_weights
// (checkpoint_experts_fp8.cpp).
//
// The e4m3 bytes are used in place in the mapping when one tensor holds the whole matrix (a
// per-expert down_proj, a stacked gate_up_proj slice) and copied byte for byte otherwise (gate and
// up of separate tensors into one [2I, H] block); scales are always read into fp32 (a few KB per
// expert), each one checked: finite and > 0, and a power of two when the config says
// scale_fmt "ue8m0". Weight bytes are checked for the e4m3fn NaN codes (0x7f, 0xff).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/lazy_experts.h"
#include "io/matrix_source.h"
#include "moekit/spec.h"

namespace moekit::io {

// Throws unless m is an F8_E4M3 matrix with a 128x128 block scale; `what` names its role.
void require_fp8(const MatrixSrc& m, const std::string& what);

// The matrix's e4m3 bytes [rows, cols] in the mapping.
const uint8_t* fp8_bytes(const MatrixSrc& m);

// The matrix's scale grid [ceil(rows/128), ceil(cols/128)] as fp32 into out, each value checked.
void read_fp8_scales(const MatrixSrc& m, bool ue8m0, float* out);

// Throws naming the first e4m3fn NaN code of q[rows, cols] (row, column and `what`).
void check_fp8_codes(const uint8_t* q, size_t rows, size_t cols, const std::string& what);

// One MLP of `width` intermediate columns in fp8 into out (ExpertView's fp8 layout): with up
// null, `gate` is a stacked [2*width, hidden] gate_up (width % 128 == 0) whose bytes are used in
// place; else gate and up are [width, hidden] matrices whose bytes are copied into one block.
// down [hidden, width] in place. Every scale is read and checked, the bytes checked for NaN codes
// (w13_what / w2_what name the matrices in those errors).
void build_fp8_mlp(const MatrixSrc& gate, const MatrixSrc* up, const MatrixSrc& down, size_t width,
                   size_t hidden, bool ue8m0, const std::string& w13_what,
                   const std::string& w2_what, ExpertStorage& out);

// Fused shared slot j in fp8 (DESIGN.md §2): gate rows [jI,(j+1)I), up rows Is+[jI,(j+1)I) of the
// shared w13 and down columns [jI,(j+1)I) of the shared w2, with their scale tiles. The slot's
// edges must fall on tile edges (j*I % 128 == 0 for every slot: I % 128 == 0, or one slot),
// else an error naming I and the slot.
void repack_shared_slot_fp8(const MoeSpec& spec, const LayerWeights& w, int slot,
                            ExpertStorage& out);

}  // namespace moekit::io
