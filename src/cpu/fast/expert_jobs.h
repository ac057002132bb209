// The fast CPU layer's jobs (fast_experts.cpp): one MLP over a set of tokens, where its weights
// are in each expert format, and the rows one unit of work projects.
//
// bf16 weights go straight into the kernels. fp8 weights (LayerWeights::expert_dtype() F8_E4M3)
// run weight-only, each weight bf16(fp8 x tile scale) (the value of a bf16 load). At decode token
// counts an ISA with a fused fp8 row kernel (kernels.h dot_rows_fp8_f32 / _bf16) makes the
// weights in registers; otherwise each unit dequantises its rows, kFp8ChunkRows at a time, into a
// per-thread bf16 buffer that stays in cache (kernels.h dequant_fp8_row) and runs the bf16
// kernels on it.
// Chunks are multiples of the kernels' 4-row tiles and start at the unit's first row, and the
// fused kernels sum as the bf16 ones do, so y equals the bf16 path's on the dequantised checkpoint
// bit for bit, while the weights cross the memory bus as fp8 bytes. MX weights (expert_format()
// Mxfp4 / Mxfp8, W4A16 / W8A16) take the same two ways (mx_rows.h: fused MX row kernels at decode
// token counts, gate/up on the activations' type; else rows dequantised into a per-thread
// buffer), so y equals the bf16 path's on the same checkpoint loaded as bf16, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/fast/kernels.h"
#include "cpu/fast/mx_rows.h"
#include "moekit/weights.h"

namespace moekit::cpu_fast::detail {

// One MLP to run over a set of tokens: a routed expert, a fused shared slot, or the unfused
// shared MLP (width Is).
struct Job {
  const Bf16* gate = nullptr;  // [inter, H]
  const Bf16* up = nullptr;    // [inter, H]
  const Bf16* down = nullptr;  // [H, down_stride]
  // fp8 weights instead (same shapes, e4m3 codes) with their 128x128 tile scales: rows of
  // ceil(H/128) scales for gate/up, of ceil(down_stride/128) for down.
  const uint8_t* gate8 = nullptr;
  const uint8_t* up8 = nullptr;
  const uint8_t* down8 = nullptr;
  const float* gate_scale = nullptr;
  const float* up_scale = nullptr;
  const float* down_scale = nullptr;
  // MX weights instead (ExpertView's mx fields; gate/up rows of H columns, down of down_stride).
  MxMatrix gate_mx, up_mx, down_mx;
  int inter = 0;
  int down_stride = 0;
  const float* b_gate = nullptr;
  const float* b_up = nullptr;
  const float* b_down = nullptr;
  int expert = -1;   // routed expert or fused slot id; -1 = the unfused shared MLP
  int count = 0;     // tokens routed to it
  size_t first = 0;  // index of its first token in the flat token/weight/pointer arrays
  size_t act = 0;    // offset of its [count, inter] gate/activation block; up follows it
};

// Points a routed expert's (or fused slot's) job at its weights, materialising them on first use
// (thread-safe: LayerWeights builds each expert once).
void attach_weights(const LayerWeights& w, Job& job);

// Points the unfused shared MLP's job (inter = down_stride = Is set) at the layer's shared
// weights in its expert format; throws naming the layer when they are missing.
void attach_shared_weights(const LayerWeights& w, Job& job);

// Gate and up rows [i0, i1) of a job against its tokens: g[j * inter + i] and u[j * inter + i]
// for i in [i0, i1), j < count, g and u the job's [count, inter] blocks. The tokens are bf16
// (xb, for the kernels' dot_rows_bf16) when xb is non-null, else fp32 (xf); both point at the
// job's first token.
void project_gate_up(const Kernels& kern, const Job& job, int H, int i0, int i1,
                     const float* const* xf, const Bf16* const* xb, float* g, float* u);

// Down rows [r0, r1) of a job against its activations (act: count rows of inter floats):
// out[j * H + r] for r in [r0, r1), out the job's [count, H] block (no bias).
void project_down(const Kernels& kern, const Job& job, int H, int r0, int r1,
                  const float* const* act, float* out);

}  // namespace moekit::cpu_fast::detail
