// The fp8 path's quantising kernels (prefill_kernels.h): the permute that writes x as e4m3 with
// per-(row, 128 channels) scales, and the activation that writes h the same way, both by the
// rule of cpu_reference::quantize_activation_fp8 bit for bit (cuda/common/fp8_quantize.cuh).
// h is quantised from its bf16 value, as the reference and the models' bf16 activation give it.
//
// Grid mapping: a warp a segment of a row (kSegmentGroups groups), 16 lanes (a half-warp) per
// 128-value group, 8 values a lane (one 16-byte bf16 load); the half-warps take the segment's
// groups in turn, and a group's amax is a 4-step xor shuffle inside its half-warp.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/fp8_quantize.cuh"
#include "cuda/experts/experts_common.cuh"
#include "cuda/prefill/prefill_kernels.h"
#include "cuda/prefill/prefill_vec.cuh"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

using experts_detail::activate;
using prefill_detail::for_each_row_segment;
using prefill_detail::load_bf16x8;
using prefill_detail::load_gate_up_x8;
using prefill_detail::segment_grid;
using prefill_detail::segments;

constexpr int kLanesPerGroup = kFp8GroupLanes;
constexpr int kThreads = 256;
// 128-value groups of a warp's segment of a row (4 a half-warp)
constexpr int kSegmentGroups = 8;
static_assert(kThreads % 32 == 0 && kLanesPerGroup == 16, "a group is one half of a warp");

struct PermuteFp8Args {
  const __nv_bfloat16* x;  // [T, H]
  const int* pos_of_pair;  // [pairs]
  uint8_t* xq;             // [P, H]
  float* xq_scale;         // [P, H/128]
  long long pairs;
  int hidden, slots;
  bool ue8m0;
};

// group (q, b): x[q / slots][128 b, 128 b + 128) -> xq[pos(q)], xq_scale[pos(q)][b]
__global__ void prefill_permute_fp8_kernel(PermuteFp8Args a) {
  const int blocks = a.hidden / kPrefillFp8Block;
  const int segs = segments(blocks, kSegmentGroups);
  for_each_row_segment(a.pairs, segs, [&](long long q, int seg, int lane) {
    const int pos = a.pos_of_pair[q];
    if (pos < 0) return;
    const int part = lane % kLanesPerGroup;
    const __nv_bfloat16* src = a.x + (q / a.slots) * a.hidden;
    const int end = min(blocks, (seg + 1) * kSegmentGroups);
    for (int b = seg * kSegmentGroups + lane / kLanesPerGroup; b < end; b += 32 / kLanesPerGroup) {
      const int c = b * kPrefillFp8Block + part * 8;
      float v[8];
      load_bf16x8(src + c, v);
      uint2 codes;
      const float s = quantize_group_fp8(v, a.ue8m0, &codes);
      *reinterpret_cast<uint2*>(a.xq + static_cast<long long>(pos) * a.hidden + c) = codes;
      if (part == 0) a.xq_scale[static_cast<long long>(pos) * blocks + b] = s;
    }
  });
}

struct ActFp8Args {
  const __nv_bfloat16* gu;  // [P, 2I]
  const float* b13;         // [rows, 2I] or null
  const int* row_expert;
  const int* total_rows;
  uint8_t* hq;      // [P, I]
  float* hq_scale;  // [P, I/128]
  long long max_rows;
  int inter;
  Activation act;
  float limit, alpha, beta;
  bool ue8m0;
};

// group (r, b): act(gate, up) of columns [128 b, 128 b + 128) of row r in fp32, rounded to
// bf16, quantised
__global__ void prefill_activation_fp8_kernel(ActFp8Args a) {
  const long long rows = min(static_cast<long long>(*a.total_rows), a.max_rows);
  const int blocks = a.inter / kPrefillFp8Block;
  const int segs = segments(blocks, kSegmentGroups);
  for_each_row_segment(rows, segs, [&](long long r, int seg, int lane) {
    const int part = lane % kLanesPerGroup;
    const __nv_bfloat16* row = a.gu + r * 2 * a.inter;
    const float* bias =
        a.b13 != nullptr ? a.b13 + static_cast<long long>(a.row_expert[r]) * 2 * a.inter : nullptr;
    const int end = min(blocks, (seg + 1) * kSegmentGroups);
    for (int b = seg * kSegmentGroups + lane / kLanesPerGroup; b < end; b += 32 / kLanesPerGroup) {
      const int j = b * kPrefillFp8Block + part * 8;
      float g[8], u[8], h[8];
      load_gate_up_x8(row, bias, a.inter, j, g, u);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        h[k] = __bfloat162float(
            __float2bfloat16_rn(activate(a.act, g[k], u[k], a.limit, a.alpha, a.beta)));
      }
      uint2 codes;
      const float s = quantize_group_fp8(h, a.ue8m0, &codes);
      *reinterpret_cast<uint2*>(a.hq + r * a.inter + j) = codes;
      if (part == 0) a.hq_scale[r * blocks + b] = s;
    }
  });
}

}  // namespace

void launch_prefill_permute_fp8(const PrefillParams& p, const PrefillWorkspace& ws,
                                cudaStream_t stream) {
  PermuteFp8Args a;
  a.x = p.x;
  a.pos_of_pair = ws.pos_of_pair;
  a.xq = ws.xq;
  a.xq_scale = ws.xq_scale;
  a.pairs = static_cast<long long>(p.tokens) * p.slots;
  a.hidden = p.hidden;
  a.slots = p.slots;
  a.ue8m0 = p.ue8m0;
  const int segs = segments(p.hidden / kPrefillFp8Block, kSegmentGroups);
  prefill_permute_fp8_kernel<<<segment_grid(a.pairs, segs, kThreads), kThreads, 0, stream>>>(a);
  MK_CUDA_CHECK(cudaGetLastError());
}

void launch_prefill_activation_fp8(const PrefillParams& p, const PrefillWorkspace& ws,
                                   cudaStream_t stream) {
  ActFp8Args a;
  a.gu = ws.gu;
  a.b13 = p.b13;
  a.row_expert = ws.row_expert;
  a.total_rows = ws.total_rows;
  a.hq = ws.hq;
  a.hq_scale = ws.hq_scale;
  a.max_rows = static_cast<long long>(p.tokens) * p.slots;
  a.inter = p.inter;
  a.act = p.activation;
  a.limit = p.limit;
  a.alpha = p.alpha;
  a.beta = p.beta;
  a.ue8m0 = p.ue8m0;
  const int segs = segments(p.inter / kPrefillFp8Block, kSegmentGroups);
  prefill_activation_fp8_kernel<<<segment_grid(a.max_rows, segs, kThreads), kThreads, 0, stream>>>(
      a);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit::cuda
