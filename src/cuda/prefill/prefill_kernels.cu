// The prefill path's kernels around its grouped GEMMs (prefill_kernels.h): permute, activation,
// combine, and the workspace's carve (the plan is prefill_plan.cu). Every loop over rows is
// bounded by the host's token count and reads the plan's device total, so no host
// synchronisation is needed between the launches.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
#include "cuda/experts/experts_common.cuh"
#include "cuda/prefill/prefill_kernels.h"
#include "cuda/prefill/prefill_vec.cuh"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// 16-byte units of a permute segment (2 KB: 4 a lane) and h columns of an activation segment (4
// times 8 a lane)
constexpr int kPermuteSegmentUnits = 128;
constexpr int kActSegmentCols = 1024;

// xs[pos(q)] = x[q / slots] for every pair q in pair order, a warp a segment of a row: x is read
// once, in order (a token's slots are neighbours), the rows written where the plan placed them
__global__ void prefill_permute_kernel(const uint4* __restrict__ x,
                                       const int* __restrict__ pos_of_pair, uint4* __restrict__ xs,
                                       long long pairs, int units, int slots) {
  const int segs = prefill_detail::segments(units, kPermuteSegmentUnits);
  prefill_detail::for_each_row_segment(pairs, segs, [&](long long q, int seg, int lane) {
    const int pos = pos_of_pair[q];
    if (pos < 0) return;
    const uint4* src = x + (q / slots) * units;
    uint4* dst = xs + static_cast<long long>(pos) * units;
    const int end = min(units, (seg + 1) * kPermuteSegmentUnits);
#pragma unroll
    for (int c = seg * kPermuteSegmentUnits + lane; c < end; c += 32) dst[c] = src[c];
  });
}

// The gated nonlinearity: the decode kernels' own (experts_common.cuh, DESIGN.md §1).
using experts_detail::activate;
using prefill_detail::add_f32x8;
using prefill_detail::for_each_row_segment;
using prefill_detail::load_bf16x8;
using prefill_detail::load_gate_up_x8;
using prefill_detail::segment_grid;
using prefill_detail::segments;
using prefill_detail::store_bf16x8;
using prefill_detail::stride_grid;

struct ActArgs {
  const __nv_bfloat16* gu;
  const float* b13;
  const int* row_expert;
  const int* total_rows;
  __nv_bfloat16* h;
  long long max_rows;
  int inter;
  Activation act;
  float limit, alpha, beta;
};

// a warp a segment of a row, 8 consecutive h columns a lane at a time
__global__ void prefill_activation_kernel(ActArgs a) {
  const long long rows = min(static_cast<long long>(*a.total_rows), a.max_rows);
  const int segs = segments(a.inter, kActSegmentCols);
  for_each_row_segment(rows, segs, [&](long long r, int seg, int lane) {
    const __nv_bfloat16* row = a.gu + r * 2 * a.inter;
    const float* b =
        a.b13 != nullptr ? a.b13 + static_cast<long long>(a.row_expert[r]) * 2 * a.inter : nullptr;
    const int end = min(a.inter, (seg + 1) * kActSegmentCols);
#pragma unroll
    for (int j = seg * kActSegmentCols + 8 * lane; j < end; j += 8 * 32) {
      float g[8], u[8], h[8];
      load_gate_up_x8(row, b, a.inter, j, g, u);
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = activate(a.act, g[k], u[k], a.limit, a.alpha, a.beta);
      store_bf16x8(a.h + r * a.inter + j, h);
    }
  });
}

struct CombineArgs {
  const __nv_bfloat16* partial;
  const float* b2;
  const int* pos_of_pair;
  const int32_t* ids;
  const float* weights;
  const float* shared_partial;
  const float* shared_scale;
  __nv_bfloat16* y;
  int tokens, hidden, slots;
};

// y[t, c..c+7] = sum over slots s in order of w[t,s] * (partial[pos] + b2[id]), + the shared
// MLP's scaled output, rounded to bf16
__global__ void prefill_combine_kernel(CombineArgs a) {
  const int octs = a.hidden / 8;
  const long long n = static_cast<long long>(a.tokens) * octs;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = i / octs;
    const int c = static_cast<int>(i - t * octs) * 8;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < a.slots; ++s) {
      const long long q = t * a.slots + s;
      const int pos = a.pos_of_pair[q];
      if (pos < 0) continue;
      float v[8];
      load_bf16x8(a.partial + static_cast<long long>(pos) * a.hidden + c, v);
      if (a.b2 != nullptr)
        add_f32x8(a.b2 + static_cast<long long>(a.ids[q]) * a.hidden + c, 1.0f, v);
      const float w = a.weights[q];
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += w * v[k];
    }
    if (a.shared_partial != nullptr)
      add_f32x8(a.shared_partial + t * a.hidden + c, a.shared_scale[t], acc);
    store_bf16x8(a.y + t * a.hidden + c, acc);
  }
}

}  // namespace

PrefillWorkspace prefill_carve(void* base, int max_tokens, int slots, int rows, int hidden,
                               int inter, bool fp8, int mx_chunk) {
  PrefillWorkspace ws;
  const size_t P = static_cast<size_t>(max_tokens) * slots;
  const size_t R = static_cast<size_t>(rows);
  char* b = static_cast<char*>(base);
  size_t at = 0;
  auto take = [&](size_t bytes) -> void* {
    void* p = b != nullptr ? b + at : nullptr;
    at = align_up(at + bytes, 256);
    return p;
  };
  ws.pos_of_pair = static_cast<int*>(take(P * 4));
  ws.row_expert = static_cast<int*>(take(P * 4));
  ws.total_rows = static_cast<int*>(take(4));
  ws.plan_ctas = prefill_plan_ctas(static_cast<long long>(P));
  ws.plan_counts = static_cast<int*>(take(static_cast<size_t>(ws.plan_ctas) * R * 4));
  ws.gu = static_cast<__nv_bfloat16*>(take(P * 2 * inter * 2));
  ws.partial = static_cast<__nv_bfloat16*>(take(P * hidden * 2));
  if (fp8) {
    ws.xq = static_cast<uint8_t*>(take(P * hidden));
    ws.xq_scale = static_cast<float*>(take(P * (hidden / kPrefillFp8Block) * 4));
    ws.hq = static_cast<uint8_t*>(take(P * inter));
    ws.hq_scale = static_cast<float*>(take(P * (inter / kPrefillFp8Block) * 4));
    for (PrefillFp8GroupArrays* g : {&ws.gate_up8, &ws.down8}) {
      g->problems = static_cast<PrefillProblem*>(take(R * sizeof(PrefillProblem)));
      g->a = static_cast<const uint8_t**>(take(R * 8));
      g->b = static_cast<const uint8_t**>(take(R * 8));
      g->scale_a = static_cast<const float**>(take(R * 8));
      g->scale_b = static_cast<const float**>(take(R * 8));
      g->d = static_cast<__nv_bfloat16**>(take(R * 8));
      g->stride_a = static_cast<int64_t*>(take(R * 8));
      g->stride_b = static_cast<int64_t*>(take(R * 8));
      g->stride_d = static_cast<int64_t*>(take(R * 8));
    }
  } else {
    ws.xs = static_cast<__nv_bfloat16*>(take(P * hidden * 2));
    ws.h = static_cast<__nv_bfloat16*>(take(P * inter * 2));
    for (PrefillGroupArrays* g : {&ws.gate_up, &ws.down}) {
      g->problems = static_cast<PrefillProblem*>(take(R * sizeof(PrefillProblem)));
      g->a = static_cast<const __nv_bfloat16**>(take(R * 8));
      g->b = static_cast<const __nv_bfloat16**>(take(R * 8));
      g->d = static_cast<__nv_bfloat16**>(take(R * 8));
      g->stride_a = static_cast<int64_t*>(take(R * 8));
      g->stride_b = static_cast<int64_t*>(take(R * 8));
      g->stride_d = static_cast<int64_t*>(take(R * 8));
    }
    if (mx_chunk > 0) {
      const size_t matrix = static_cast<size_t>(2) * inter * hidden;  // w13's, w2's the half
      ws.mx_weights = static_cast<__nv_bfloat16*>(take(static_cast<size_t>(mx_chunk) * matrix * 2));
    }
  }
  ws.gemm_workspace_bytes = prefill_gemm_workspace_bytes(rows);
  ws.gemm_workspace[0] = take(ws.gemm_workspace_bytes);
  ws.gemm_workspace[1] = take(ws.gemm_workspace_bytes);
  ws.total_bytes = at;
  return ws;
}

void launch_prefill_permute(const PrefillParams& p, const PrefillWorkspace& ws,
                            cudaStream_t stream) {
  const long long pairs = static_cast<long long>(p.tokens) * p.slots;
  const int units = p.hidden / 8;
  const int segs = segments(units, kPermuteSegmentUnits);
  prefill_permute_kernel<<<segment_grid(pairs, segs, 256), 256, 0, stream>>>(
      reinterpret_cast<const uint4*>(p.x), ws.pos_of_pair, reinterpret_cast<uint4*>(ws.xs), pairs,
      units, p.slots);
  MK_CUDA_CHECK(cudaGetLastError());
}

void launch_prefill_activation(const PrefillParams& p, const PrefillWorkspace& ws,
                               cudaStream_t stream) {
  ActArgs a;
  a.gu = ws.gu;
  a.b13 = p.b13;
  a.row_expert = ws.row_expert;
  a.total_rows = ws.total_rows;
  a.h = ws.h;
  a.max_rows = static_cast<long long>(p.tokens) * p.slots;
  a.inter = p.inter;
  a.act = p.activation;
  a.limit = p.limit;
  a.alpha = p.alpha;
  a.beta = p.beta;
  const int segs = segments(p.inter, kActSegmentCols);
  prefill_activation_kernel<<<segment_grid(a.max_rows, segs, 256), 256, 0, stream>>>(a);
  MK_CUDA_CHECK(cudaGetLastError());
}

void launch_prefill_combine(const PrefillParams& p, const PrefillWorkspace& ws,
                            cudaStream_t stream) {
  CombineArgs a;
  a.partial = ws.partial;
  a.b2 = p.b2;
  a.pos_of_pair = ws.pos_of_pair;
  a.ids = p.ids;
  a.weights = p.weights;
  a.shared_partial = p.shared_partial;
  a.shared_scale = p.shared_scale;
  a.y = p.y;
  a.tokens = p.tokens;
  a.hidden = p.hidden;
  a.slots = p.slots;
  const long long n = static_cast<long long>(p.tokens) * (p.hidden / 8);
  prefill_combine_kernel<<<stride_grid(n, 256), 256, 0, stream>>>(a);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit::cuda
