// The prefill path's kernels around its grouped GEMMs (prefill_kernels.h): plan, permute,
// activation, combine. Every loop over rows is bounded by the host's token count and reads the
// plan's device total, so no host synchronisation is needed between the launches.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "cuda/common/cuda_check.h"
#include "cuda/experts/experts_common.cuh"
#include "cuda/prefill/prefill_kernels.h"
#include "cuda/prefill/prefill_vec.cuh"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

constexpr int kPlanThreads = 1024;
constexpr int kPlanWarps = kPlanThreads / 32;
constexpr int kPlanSmemBudget = 200 * 1024;  // per-warp counters + the per-expert totals
constexpr int kPlanLoads = 8;                // ids each lane loads before using them

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// The number of warps whose pair ranges the plan counts separately for `rows` experts: each holds
// a row of `rows` counters in shared memory.
int plan_warps(int rows) {
  const int fit = (kPlanSmemBudget - rows * 4) / (rows * 4);
  return std::max(1, std::min(kPlanWarps, fit));
}

struct PlanArgs {
  const int32_t* ids;
  long long pairs;
  int rows, warps, hidden, inter;
  const __nv_bfloat16* w13;
  const __nv_bfloat16* w2;
  int weight_groups;  // the experts w13 / w2 hold: group e's at e % weight_groups
  // fp8 block-scale weights: the fp8 group arrays are written instead of the bf16 ones
  bool fp8;
  const uint8_t* w13_fp8;
  const float* w13_scale;
  const uint8_t* w2_fp8;
  const float* w2_scale;
  bool row_experts;  // write row_expert (the activation reads it for the expert biases only)
  PrefillWorkspace ws;
  int* error_flag;
};

// Exclusive scan over the block of one int per thread; *total gets the sum (every thread).
__device__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inc = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, inc, off);
    if (lane >= off) inc += u;
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const int s = warp_sums[lane];
    int si = s;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, si, off);
      if (lane >= off) si += u;
    }
    warp_sums[lane] = si - s;  // exclusive prefix of the warp totals
    if (lane == 31) warp_sums[32] = si;
  }
  __syncthreads();
  const int result = warp_sums[warp] + inc - v;
  *total = warp_sums[32];
  __syncthreads();  // (warp_sums is reused by the caller's next scan)
  return result;
}

// counts[w][e]: the pairs of warp w's contiguous range routed to e; becomes the first row of
// those pairs. Warp w then places its range's pairs in pair order (match_any ranks inside each
// 32-pair step), so the permutation is stable: expert order, then pair order.
__global__ void __launch_bounds__(kPlanThreads) prefill_plan_kernel(PlanArgs a) {
  extern __shared__ int smem[];
  int* counts = smem;                      // [warps][rows]
  int* offsets = smem + a.warps * a.rows;  // [rows]
  __shared__ int warp_sums[33];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rows = a.rows;
  for (int i = tid; i < a.warps * rows; i += kPlanThreads) counts[i] = 0;
  __syncthreads();

  const long long begin = warp < a.warps ? a.pairs * warp / a.warps : 0;
  const long long end = warp < a.warps ? a.pairs * (warp + 1) / a.warps : 0;
  // (one CTA: its loads are latency-bound, so each lane has kPlanLoads of them in flight)
  for (long long q0 = begin; q0 < end; q0 += 32 * kPlanLoads) {
    int ids[kPlanLoads];
#pragma unroll
    for (int i = 0; i < kPlanLoads; ++i) {
      const long long q = q0 + 32 * i + lane;
      ids[i] = q < end ? a.ids[q] : 0;
    }
#pragma unroll
    for (int i = 0; i < kPlanLoads; ++i) {
      if (q0 + 32 * i + lane >= end) break;
      const int e = ids[i];
      if (e >= 0 && e < rows) {
        atomicAdd(&counts[warp * rows + e], 1);
      } else if (a.error_flag != nullptr) {
        *a.error_flag = 1;
      }
    }
  }
  __syncthreads();

  // per expert: each warp's first row inside the expert's segment, and the segment's length
  for (int e = tid; e < rows; e += kPlanThreads) {
    int run = 0;
    for (int w = 0; w < a.warps; ++w) {
      const int c = counts[w * rows + e];
      counts[w * rows + e] = run;
      run += c;
    }
    offsets[e] = run;
  }
  __syncthreads();
  // segment offsets: exclusive scan of the lengths in expert order (<= 2 experts per thread)
  const int per = (rows + kPlanThreads - 1) / kPlanThreads;
  const int e0 = tid * per;
  int local = 0;
  for (int i = 0; i < per; ++i) {
    if (e0 + i < rows) local += offsets[e0 + i];
  }
  int total = 0;
  int run = block_exclusive_scan(local, warp_sums, &total);
  const PrefillWorkspace& ws = a.ws;
  const int H = a.hidden, I = a.inter;
  for (int i = 0; i < per; ++i) {
    const int e = e0 + i;
    if (e >= rows) break;
    const int n = offsets[e];
    const long long off = run;
    run += n;
    offsets[e] = static_cast<int>(off);
    if (a.fp8) {
      // scale grids: activations [rows of xq / hq, K/128], weights [N/128, K/128] per expert
      const int hb = H / kPrefillFp8Block, ib = I / kPrefillFp8Block;
      ws.gate_up8.problems[e] = {n, 2 * I, H};
      ws.gate_up8.a[e] = ws.xq + off * H;
      ws.gate_up8.scale_a[e] = ws.xq_scale + off * hb;
      ws.gate_up8.b[e] = a.w13_fp8 + static_cast<long long>(e) * 2 * I * H;
      ws.gate_up8.scale_b[e] = a.w13_scale + static_cast<long long>(e) * 2 * ib * hb;
      ws.gate_up8.d[e] = ws.gu + off * 2 * I;
      ws.gate_up8.stride_a[e] = H;
      ws.gate_up8.stride_b[e] = H;
      ws.gate_up8.stride_d[e] = 2 * I;
      ws.down8.problems[e] = {n, H, I};
      ws.down8.a[e] = ws.hq + off * I;
      ws.down8.scale_a[e] = ws.hq_scale + off * ib;
      ws.down8.b[e] = a.w2_fp8 + static_cast<long long>(e) * H * I;
      ws.down8.scale_b[e] = a.w2_scale + static_cast<long long>(e) * hb * ib;
      ws.down8.d[e] = ws.partial + off * H;
      ws.down8.stride_a[e] = I;
      ws.down8.stride_b[e] = I;
      ws.down8.stride_d[e] = H;
      continue;
    }
    ws.gate_up.problems[e] = {n, 2 * I, H};
    ws.gate_up.a[e] = ws.xs + off * H;
    const long long we = e % a.weight_groups;
    ws.gate_up.b[e] = a.w13 + we * 2 * I * H;
    ws.gate_up.d[e] = ws.gu + off * 2 * I;
    ws.gate_up.stride_a[e] = H;
    ws.gate_up.stride_b[e] = H;
    ws.gate_up.stride_d[e] = 2 * I;
    ws.down.problems[e] = {n, H, I};
    ws.down.a[e] = ws.h + off * I;
    ws.down.b[e] = a.w2 + we * H * I;
    ws.down.d[e] = ws.partial + off * H;
    ws.down.stride_a[e] = I;
    ws.down.stride_b[e] = I;
    ws.down.stride_d[e] = H;
  }
  if (tid == 0) *ws.total_rows = total;
  __syncthreads();
  for (int i = tid; i < a.warps * rows; i += kPlanThreads) counts[i] += offsets[i % rows];
  __syncthreads();

  // placement, warp by warp over its range in pair order
  const unsigned lower = (1u << lane) - 1u;
  for (long long q0 = begin; q0 < end; q0 += 32 * kPlanLoads) {
    int ids[kPlanLoads];
#pragma unroll
    for (int i = 0; i < kPlanLoads; ++i) {
      const long long q = q0 + 32 * i + lane;
      ids[i] = q < end ? a.ids[q] : -1;
    }
#pragma unroll
    for (int i = 0; i < kPlanLoads; ++i) {
      const long long q = q0 + 32 * i + lane;
      const bool in = q < end;
      const int e = ids[i] >= 0 && ids[i] < rows ? ids[i] : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, e);
      if (e >= 0) {
        const int pos = counts[warp * rows + e] + __popc(peers & lower);
        ws.pos_of_pair[q] = pos;
        if (a.row_experts) ws.row_expert[pos] = e;
      } else if (in) {
        ws.pos_of_pair[q] = -1;
      }
      __syncwarp();
      if (e >= 0 && (peers & lower) == 0) counts[warp * rows + e] += __popc(peers);
      __syncwarp();
    }
  }
}

// xs[pos(q)] = x[q / slots] for every pair q in pair order, 16 bytes a thread: x is read once,
// in order (a token's slots are neighbours), the rows written where the plan placed them
__global__ void prefill_permute_kernel(const uint4* __restrict__ x,
                                       const int* __restrict__ pos_of_pair, uint4* __restrict__ xs,
                                       long long pairs, int units, int slots) {
  const long long n = pairs * units;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long q = i / units;
    const int c = static_cast<int>(i - q * units);
    const int pos = pos_of_pair[q];
    if (pos >= 0) xs[static_cast<long long>(pos) * units + c] = x[(q / slots) * units + c];
  }
}

// The gated nonlinearity: the decode kernels' own (experts_common.cuh, DESIGN.md §1).
using experts_detail::activate;
using prefill_detail::add_f32x8;
using prefill_detail::load_bf16x8;
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

// 8 consecutive h columns a thread
__global__ void prefill_activation_kernel(ActArgs a) {
  const long long rows = min(static_cast<long long>(*a.total_rows), a.max_rows);
  const int octs = a.inter / 8;
  const long long n = rows * octs;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = i / octs;
    const int j = static_cast<int>(i - r * octs) * 8;
    const __nv_bfloat16* row = a.gu + r * 2 * a.inter;
    float g[8], u[8], h[8];
    load_bf16x8(row + j, g);
    load_bf16x8(row + a.inter + j, u);
    if (a.b13 != nullptr) {
      const float* b = a.b13 + static_cast<long long>(a.row_expert[r]) * 2 * a.inter;
      add_f32x8(b + j, 1.0f, g);
      add_f32x8(b + a.inter + j, 1.0f, u);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = activate(a.act, g[k], u[k], a.limit, a.alpha, a.beta);
    store_bf16x8(a.h + r * a.inter + j, h);
  }
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

void launch_prefill_plan(const PrefillParams& p, const PrefillWorkspace& ws, cudaStream_t stream) {
  MK_CHECK(p.rows >= 1 && p.rows <= kPrefillMaxRows,
           "prefill plan counts 1.." << kPrefillMaxRows << " weight rows, got " << p.rows);
  PlanArgs a;
  a.ids = p.ids;
  a.pairs = static_cast<long long>(p.tokens) * p.slots;
  a.rows = p.rows;
  a.warps = plan_warps(p.rows);
  a.hidden = p.hidden;
  a.inter = p.inter;
  const bool mx = p.mx != ExpertFormat::Bf16;
  a.w13 = mx ? ws.mx_weights : p.w13;
  a.w2 = mx ? ws.mx_weights : p.w2;
  a.weight_groups = mx ? p.mx_chunk : p.rows;
  a.fp8 = p.w13_fp8 != nullptr;
  a.w13_fp8 = p.w13_fp8;
  a.w13_scale = p.w13_scale;
  a.w2_fp8 = p.w2_fp8;
  a.w2_scale = p.w2_scale;
  // (one SM issues every store of this kernel: a scattered store per pair is its largest cost)
  a.row_experts = p.b13 != nullptr;
  a.ws = ws;
  a.error_flag = p.error_flag;
  const size_t smem = static_cast<size_t>(a.warps + 1) * p.rows * sizeof(int);
  static std::once_flag once;
  std::call_once(once, [] {
    MK_CUDA_CHECK(cudaFuncSetAttribute(
        prefill_plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPlanSmemBudget));
  });
  prefill_plan_kernel<<<1, kPlanThreads, smem, stream>>>(a);
  MK_CUDA_CHECK(cudaGetLastError());
}

void launch_prefill_permute(const PrefillParams& p, const PrefillWorkspace& ws,
                            cudaStream_t stream) {
  const long long pairs = static_cast<long long>(p.tokens) * p.slots;
  const int units = p.hidden / 8;
  prefill_permute_kernel<<<stride_grid(pairs * units, 256), 256, 0, stream>>>(
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
  prefill_activation_kernel<<<stride_grid(a.max_rows * (p.inter / 8), 256), 256, 0, stream>>>(a);
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
