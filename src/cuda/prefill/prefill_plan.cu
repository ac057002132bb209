// The prefill path's plan (prefill_kernels.h, step 1): per-expert counts, segment offsets, the
// stable permutation of the pairs and both GEMMs' group arrays, in two launches over the same
// split of the pairs into CTA ranges: the count kernel writes each range's per-expert counts, the
// place kernel turns them into offsets and places its range's pairs. Every loop is bounded by
// the host's pair count, so no host synchronisation is needed.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "cuda/common/cuda_check.h"
#include "cuda/prefill/prefill_kernels.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

constexpr int kPlanThreads = 1024;
constexpr int kPlanWarps = kPlanThreads / 32;
constexpr int kPlanSmemBudget = 200 * 1024;  // per-warp counters + the per-expert arrays
constexpr int kPlanLoads = 8;                // ids each lane loads before using them

// The number of warps whose pair ranges the place kernel counts separately for `rows` experts:
// each holds a row of `rows` counters in shared memory, beside two per-expert arrays.
int plan_warps(int rows) {
  const int fit = (kPlanSmemBudget - 2 * rows * 4) / (rows * 4);
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

// The pairs [begin, end) of range `part` of `parts` (CTA ranges, or warp ranges inside one).
__device__ void part_range(long long begin, long long end, int part, int parts, long long& b,
                           long long& e) {
  const long long n = end - begin;
  b = begin + n * part / parts;
  e = begin + n * (part + 1) / parts;
}

// Adds one to counts[id] for every pair of [begin, end) whose id is in range, the lanes of a
// warp (or the threads of a CTA, stride) kPlanLoads ids at a time; flags the others.
__device__ void count_range(const PlanArgs& a, long long begin, long long end, int lane, int stride,
                            int* counts) {
  for (long long q0 = begin; q0 < end; q0 += static_cast<long long>(stride) * kPlanLoads) {
    int ids[kPlanLoads];
#pragma unroll
    for (int i = 0; i < kPlanLoads; ++i) {
      const long long q = q0 + static_cast<long long>(stride) * i + lane;
      ids[i] = q < end ? a.ids[q] : 0;
    }
#pragma unroll
    for (int i = 0; i < kPlanLoads; ++i) {
      if (q0 + static_cast<long long>(stride) * i + lane >= end) break;
      const int e = ids[i];
      if (e >= 0 && e < a.rows) {
        atomicAdd(&counts[e], 1);
      } else if (a.error_flag != nullptr) {
        *a.error_flag = 1;
      }
    }
  }
}

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

// plan_counts[c][e]: the pairs of CTA c's range routed to e.
__global__ void __launch_bounds__(kPlanThreads) prefill_count_kernel(PlanArgs a) {
  extern __shared__ int counts[];  // [rows]
  for (int e = threadIdx.x; e < a.rows; e += kPlanThreads) counts[e] = 0;
  __syncthreads();
  long long begin, end;
  part_range(0, a.pairs, blockIdx.x, gridDim.x, begin, end);
  count_range(a, begin, end, threadIdx.x, kPlanThreads, counts);
  __syncthreads();
  int* out = a.ws.plan_counts + static_cast<size_t>(blockIdx.x) * a.rows;
  for (int e = threadIdx.x; e < a.rows; e += kPlanThreads) out[e] = counts[e];
}

// Expert e's group arrays: n rows from row `off` of the permuted buffers.
__device__ void write_group(const PlanArgs& a, int e, int n, long long off) {
  const PrefillWorkspace& ws = a.ws;
  const int H = a.hidden, I = a.inter;
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
    return;
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

// Every CTA: the segment offsets from all ranges' counts (CTA 0 also writes the group arrays and
// the total), then its own range's pairs, warp by warp in pair order (match_any ranks inside each
// 32-pair step): the permutation is stable, expert order, then pair order.
__global__ void __launch_bounds__(kPlanThreads) prefill_place_kernel(PlanArgs a) {
  extern __shared__ int smem[];
  const int rows = a.rows;
  int* counts = smem;                    // [warps][rows]
  int* offsets = smem + a.warps * rows;  // [rows]
  int* before = offsets + rows;          // [rows]: earlier CTAs' pairs of each expert
  __shared__ int warp_sums[33];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < a.warps * rows; i += kPlanThreads) counts[i] = 0;
  for (int e = tid; e < rows; e += kPlanThreads) offsets[e] = before[e] = 0;
  __syncthreads();
  // every range's counts, kPlanLoads loads in flight a thread: offsets[e] the total of e,
  // before[e] the part of it in the ranges before this CTA's
  const int cells = static_cast<int>(gridDim.x) * rows;
  for (int i0 = 0; i0 < cells; i0 += kPlanThreads * kPlanLoads) {
    int v[kPlanLoads];
#pragma unroll
    for (int j = 0; j < kPlanLoads; ++j) {
      const int i = i0 + j * kPlanThreads + tid;
      v[j] = i < cells ? a.ws.plan_counts[i] : 0;
    }
#pragma unroll
    for (int j = 0; j < kPlanLoads; ++j) {
      const int i = i0 + j * kPlanThreads + tid;
      if (i >= cells || v[j] == 0) continue;
      const int c = i / rows, e = i - c * rows;
      atomicAdd(&offsets[e], v[j]);
      if (c < static_cast<int>(blockIdx.x)) atomicAdd(&before[e], v[j]);
    }
  }
  __syncthreads();

  // segment offsets: exclusive scan of the totals in expert order (<= 2 experts per thread)
  const int per = (rows + kPlanThreads - 1) / kPlanThreads;
  const int e0 = tid * per;
  int local = 0;
  for (int i = 0; i < per; ++i) {
    if (e0 + i < rows) local += offsets[e0 + i];
  }
  int total = 0;
  int run = block_exclusive_scan(local, warp_sums, &total);
  for (int i = 0; i < per; ++i) {
    const int e = e0 + i;
    if (e >= rows) break;
    const int n = offsets[e];
    if (blockIdx.x == 0) write_group(a, e, n, run);
    offsets[e] = run + before[e];  // this CTA's first row in e's segment
    run += n;
  }
  if (blockIdx.x == 0 && tid == 0) *a.ws.total_rows = total;

  // this CTA's range, split into warp ranges counted apart
  long long cta_begin, cta_end, begin = 0, end = 0;
  part_range(0, a.pairs, blockIdx.x, gridDim.x, cta_begin, cta_end);
  if (warp < a.warps) {
    part_range(cta_begin, cta_end, warp, a.warps, begin, end);
    count_range(a, begin, end, lane, 32, counts + warp * rows);
  }
  __syncthreads();
  // per expert: each warp's first row inside the CTA's part of the segment
  for (int e = tid; e < rows; e += kPlanThreads) {
    int r = offsets[e];
    for (int w = 0; w < a.warps; ++w) {
      const int c = counts[w * rows + e];
      counts[w * rows + e] = r;
      r += c;
    }
  }
  __syncthreads();

  // placement, warp by warp over its range in pair order
  if (warp >= a.warps) return;
  const PrefillWorkspace& ws = a.ws;
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

}  // namespace

int prefill_plan_ctas(long long pairs) {
  const long long need = (pairs + kPrefillPlanPairsPerCta - 1) / kPrefillPlanPairsPerCta;
  return static_cast<int>(std::clamp<long long>(need, 1, kPrefillPlanMaxCtas));
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
  a.weight_groups = mx && p.mx_chunk > 0 ? p.mx_chunk : p.rows;  // (packed MX: b not read)
  a.fp8 = p.w13_fp8 != nullptr;
  a.w13_fp8 = p.w13_fp8;
  a.w13_scale = p.w13_scale;
  a.w2_fp8 = p.w2_fp8;
  a.w2_scale = p.w2_scale;
  a.row_experts = p.b13 != nullptr;
  a.ws = ws;
  a.error_flag = p.error_flag;
  const int ctas = prefill_plan_ctas(a.pairs);
  MK_CHECK(ctas <= ws.plan_ctas, "prefill plan: " << a.pairs << " pairs need " << ctas
                                                  << " CTAs, the workspace counts for "
                                                  << ws.plan_ctas);
  const size_t count_smem = static_cast<size_t>(p.rows) * sizeof(int);
  const size_t place_smem = static_cast<size_t>(a.warps + 2) * p.rows * sizeof(int);
  static std::once_flag once;
  std::call_once(once, [] {
    MK_CUDA_CHECK(cudaFuncSetAttribute(
        prefill_place_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPlanSmemBudget));
  });
  prefill_count_kernel<<<ctas, kPlanThreads, count_smem, stream>>>(a);
  MK_CUDA_CHECK(cudaGetLastError());
  prefill_place_kernel<<<ctas, kPlanThreads, place_smem, stream>>>(a);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit::cuda
