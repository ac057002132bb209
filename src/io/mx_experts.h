// Keeping OCP MX weights as they are stored (LoadOptions::expert_format Mxfp4 / Mxfp8): the
// checks and copies that turn a checkpoint's packed matrices and e8m0 scale bytes into
// ExpertView's mx fields (weights.h). Used by load_checkpoint_weights (checkpoint_experts_mx.cpp).
//
// Bytes are used in place in the mapping when one tensor holds a matrix's rows contiguously (a
// gpt-oss down_proj_blocks slice, an mxfp8 per-expert w2 or stacked gate_up slice) and copied
// otherwise (gpt-oss's interleaved gate/up rows into gate rows then up rows; separate gate and up
// tensors into one block). Scale bytes follow their rows the same way. Every matrix is checked
// once, when its expert is materialised: no e8m0 byte 255 (NaN), no e4m3fn NaN code (mxfp8), and
// no 32-element block whose largest element times its scale overflows fp32 (and so bf16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/lazy_experts.h"
#include "io/matrix_source.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit::io {

// The value of an e8m0 byte below 255: 2^(s - 127) (s = 0 is the fp32 subnormal 2^-127).
float mx_scale_value(uint8_t s);
// The value of an element code: e2m1 (the low 4 bits, Mxfp4) or e4m3fn (Mxfp8).
float mx_element_value(ExpertFormat f, uint8_t code);

// Throws, naming `what`, the row and the 32-column block, at the first e8m0 byte 255, e4m3fn NaN
// code (Mxfp8) or block whose largest |element| x 2^(s-127) is not a finite fp32. q holds rows
// of mx_row_bytes(f, cols) bytes with row stride ldq, scale rows of cols/32 bytes, stride lds.
void check_mx_rows(ExpertFormat f, const uint8_t* q, size_t ldq, const uint8_t* scale, size_t lds,
                   size_t rows, size_t cols, const std::string& what);

// One row of an MX matrix (cols a multiple of 32) as bf16: out[c] = bf16(element(c) x 2^(s[c/32]-127)), round to nearest
// even (exact unless the product is below bf16's normal range, 2^-126).
void mx_decode_row(ExpertFormat f, const uint8_t* q, const uint8_t* scale, size_t cols, Bf16* out);

// Quantises one bf16 row of `cols` (a multiple of 32) elements to an MX format as OCP MX v1.0
// §6.3 does: per 32 elements the e8m0 exponent floor(log2 amax) - emax (emax 2 for e2m1, 8 for
// e4m3; byte 127 for an all-zero block), then each element / 2^exponent rounded to nearest even,
// saturating at the largest element (6, 448). q gets mx_row_bytes(f, cols) bytes (e2m1 pairs low
// nibble first), scale cols / 32 bytes. For save_checkpoint's MX forms.
void mx_quantize_row(ExpertFormat f, const Bf16* row, size_t cols, uint8_t* q, uint8_t* scale);

// Throws unless m is an mxfp8 matrix (F8_E4M3 with a [rows, cols/32] e8m0 scale); `what` names
// its role.
void require_mxfp8(const MatrixSrc& m, const std::string& what);
// The matrix's bytes / scale bytes in the mapping.
const uint8_t* mx_bytes(const MatrixSrc& m);
const uint8_t* mx_scale_bytes(const MatrixSrc& m);

// One MLP of `width` intermediate columns in mxfp8 into out (ExpertView's mx layout): with up
// null, `gate` is a stacked [2*width, hidden] gate_up whose bytes and scales are used in place;
// else gate and up are [width, hidden] matrices copied into one block. down in place. Checked as
// check_mx_rows (w13_what / w2_what name the matrices in those errors).
void build_mxfp8_mlp(const MatrixSrc& gate, const MatrixSrc* up, const MatrixSrc& down,
                     size_t width, size_t hidden, const std::string& w13_what,
                     const std::string& w2_what, ExpertStorage& out);

// gpt-oss MXFP4 expert: gate_up rows [2I, H/2] (blocks) and [2I, H/32] (scales) interleaved
// (row 2i gate i, row 2i+1 up i) are de-interleaved into gate rows then up rows; down rows
// [H, I/2] and [H, I/32] are used in place.
void build_gpt_oss_mxfp4(const uint8_t* gate_up_blocks, const uint8_t* gate_up_scales,
                         const uint8_t* down_blocks, const uint8_t* down_scales, size_t inter,
                         size_t hidden, const std::string& w13_what, const std::string& w2_what,
                         ExpertStorage& out);

// Fused shared slot j in an MX format (DESIGN.md §2): gate rows [jI,(j+1)I), up rows Is+[jI,
// (j+1)I) of the shared w13 and down columns [jI,(j+1)I) of the shared w2, with their scale
// bytes (jI is a multiple of 32: the MX loader requires I % 32 == 0).
void repack_shared_slot_mx(const MoeSpec& spec, const LayerWeights& w, int slot,
                           ExpertStorage& out);

}  // namespace moekit::io
