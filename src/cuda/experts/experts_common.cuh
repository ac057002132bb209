// What the grouped expert kernels share (experts_kernel.cuh: weights streamed through registers;
// experts_bulk_kernel.cuh: through a bulk-copy ring in shared memory): the k-block geometry, the
// mma fragments, the activation, the item epilogue (h = act(g, u) or the fp32 down partials) and
// the deterministic down combine.
//
// Fragments: "swap AB": 16 weight rows are the M side of mma.m16n8k16 (bf16 in, fp32 accumulate),
// 8 tokens the N side. K is permuted identically for weights and activations, so the dot
// products are unchanged: thread t of a row quad holds elements 8t..8t+7 and 32+8t..32+8t+7 of a
// 64-wide k block (whole 32-byte sectors per load); in mma step s its logical k {2t,2t+1} /
// {2t+8,2t+9} are its physical elements {4s,4s+1} / {4s+2,4s+3}.
//   gate/up tile: rows 0-7 = gate rows r0..r0+7, rows 8-15 = up rows I+r0.., so one thread holds
//                 gate and up of the same (row, token) and writes h = act(g, u) straight away
//   down tile:    16 rows of W2 (output columns of y)
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/experts/experts.h"

namespace moekit::cuda::experts_detail {

constexpr int kBlockK = 64;

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 64-wide k block: a = {lo row first 8, lo row second 8, hi row first 8, hi row second 8},
// b = {token first 8, token second 8}; four mma steps.
__device__ __forceinline__ void mma_block(float (&c)[4], const uint4 (&a)[4], const uint4 (&b)[2]) {
  mma_bf16(c, a[0].x, a[2].x, a[0].y, a[2].y, b[0].x, b[0].y);
  mma_bf16(c, a[0].z, a[2].z, a[0].w, a[2].w, b[0].z, b[0].w);
  mma_bf16(c, a[1].x, a[3].x, a[1].y, a[3].y, b[1].x, b[1].y);
  mma_bf16(c, a[1].z, a[3].z, a[1].w, a[3].w, b[1].z, b[1].w);
}

__device__ __forceinline__ float activate(Activation act, float g, float u, float limit,
                                          float alpha, float beta) {
  if (limit > 0.0f) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  if (act == Activation::Silu) return g / (1.0f + expf(-g)) * u;
  const float glu = g / (1.0f + expf(-alpha * g));
  return (u + beta) * glu;
}

// acc[j][r] = the sum over warps w = 0, 1, ... (in that order: deterministic) of
// red[(w * kNT * 4 + j * 4 + r) * 32 + lane], the layout [warps][kNT * 4][32] both kernels use.
template <int kWarpsIn, int kNT>
__device__ __forceinline__ void sum_warp_partials(const float* red, int lane,
                                                  float (&acc)[kNT][4]) {
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarpsIn; ++w) s += red[(w * kNT * 4 + j * 4 + r) * 32 + lane];
      acc[j][r] = s;
    }
  }
}

// The biases of a lane's two output rows of an item (lane = (g, t)): gate row r0+g and up row
// inter+r0+g (gate/up), or rows r0+g and r0+g+8 (down). Loaded once per item, before the
// accumulators are reduced, so that their round trip overlaps the reduction's.
struct RowBias {
  float lo = 0.0f, hi = 0.0f;
};
template <bool kGateUp>
__device__ __forceinline__ RowBias load_row_bias(const ExpertsParams& p, int expert, int r0,
                                                 int g) {
  RowBias b;
  if (p.bias != nullptr) {
    const float* bias = p.bias + expert * p.bias_expert_stride;
    b.lo = bias[r0 + g];
    b.hi = bias[kGateUp ? p.inter + r0 + g : r0 + g + 8];
  }
  return b;
}

// The item's outputs from the reduced accumulators of one warp (lane = (g, t)): h = act(gate, up)
// in bf16 (gate/up) or the unweighted fp32 partial rows (down), bias (load_row_bias) included.
// acc[j] holds rows (r0+g | gate, up) or (r0+g, r0+g+8) for tokens 2t, 2t+1 of n-tile j;
// pairs[col] is the pair (row of h / partial) of the task's token col, for col < count.
template <bool kGateUp, int kNT>
__device__ __forceinline__ void store_item_outputs(const ExpertsParams& p, int r0, int count,
                                                   const int* pairs, const float (&acc)[kNT][4],
                                                   const RowBias& bias, int g, int t) {
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = j * 8 + 2 * t + c;
      if (col < count) {
        const int pair = pairs[col];
        if constexpr (kGateUp) {
          float gate = acc[j][c], up = acc[j][2 + c];
          // (tested, not + 0.0f: adding a zero bias would turn a -0 sum into +0)
          if (p.bias != nullptr) {
            gate += bias.lo;
            up += bias.hi;
          }
          p.h[static_cast<size_t>(pair) * p.inter + r0 + g] =
              __float2bfloat16_rn(activate(p.activation, gate, up, p.limit, p.alpha, p.beta));
        } else {
          float lo = acc[j][c], hi = acc[j][2 + c];
          if (p.bias != nullptr) {
            lo += bias.lo;
            hi += bias.hi;
          }
          float* out = p.partial + static_cast<size_t>(pair) * p.rows + r0 + g;
          out[0] = lo;
          out[8] = hi;
        }
      }
    }
  }
}

// y[tok, r] of the combine from the sum of its routed slots: + the unfused shared MLP's output
// (scaled), rounded to bf16.
__device__ __forceinline__ void store_combined_output(const ExpertsParams& p, int tok, int r,
                                                      float y) {
  if (p.shared_partial != nullptr) {
    y += p.shared_scale[tok] * __ldcg(p.shared_partial + static_cast<size_t>(tok) * p.rows + r);
  }
  p.y[static_cast<size_t>(tok) * p.rows + r] = __float2bfloat16_rn(y);
}

// The same for 4 consecutive rows r..r+3 of token tok (one 16-byte load of the shared partial,
// one 8-byte store), each row's arithmetic that of store_combined_output.
__device__ __forceinline__ void store_combined_quad(const ExpertsParams& p, int tok, int r,
                                                    float4 y) {
  const size_t at = static_cast<size_t>(tok) * p.rows + r;
  if (p.shared_partial != nullptr) {
    const float scale = p.shared_scale[tok];
    const float4 s = __ldcg(reinterpret_cast<const float4*>(p.shared_partial + at));
    y.x += scale * s.x;
    y.y += scale * s.y;
    y.z += scale * s.z;
    y.w += scale * s.w;
  }
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(p.y + at);
  out[0] = __floats2bfloat162_rn(y.x, y.y);
  out[1] = __floats2bfloat162_rn(y.z, y.w);
}

// The down combine by quads: n units of 4 consecutive output rows of one token (unit i at
// token and row unit_at(i)); one pass: thread tid of nthreads takes units i0, i0 + nthreads, ...
// (kUnits of them), the slots' weights and partials loaded kSlotBatch slots at a time (16-byte
// partial loads; one weight per unit and slot); passes i0 = tid, tid + kUnits * nthreads, ...
// cover the n units. Each row's sum is combine_tile's: the same slot order, the same
// operations, so the same bits. why quads: a warp's dependent L2 round trips are what a combine
// costs, and 16-byte loads bring 4 rows per load: the bulk kernel's epilogue warp took 24 of
// them per 16-row tile at 128 tokens (9 slots), its consumers stalling behind it
// (docs/decisions/experts_bulk_design.md); by quads, 4 units x 4 slots a pass, 12. Needs rows,
// partial and shared_partial 16-byte and y 8-byte aligned (the layer checks y; its workspace is
// cudaMalloc'd).
template <int kUnits, int kSlotBatch, typename UnitAt>
__device__ __forceinline__ void combine_quads_pass(const ExpertsParams& p, int n, int i0,
                                                   int nthreads, UnitAt unit_at) {
  float4 y[kUnits];
  int tok[kUnits], r[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    unit_at(min(i0 + u * nthreads, n - 1), tok[u], r[u]);  // past the end: the last unit again
    y[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll 1
  for (int s0 = 0; s0 < p.slots; s0 += kSlotBatch) {
    float w[kSlotBatch][kUnits];
    float4 v[kSlotBatch][kUnits];
#pragma unroll
    for (int j = 0; j < kSlotBatch; ++j) {
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        const size_t q = static_cast<size_t>(tok[u]) * p.slots + s0 + j;
        const bool in = s0 + j < p.slots;
        w[j][u] = in ? p.slot_weights[q] : 0.0f;
        v[j][u] = in ? __ldcg(reinterpret_cast<const float4*>(p.partial + q * p.rows + r[u]))
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int j = 0; j < kSlotBatch; ++j) {
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        if (s0 + j < p.slots) {
          y[u].x += w[j][u] * v[j][u].x;
          y[u].y += w[j][u] * v[j][u].y;
          y[u].z += w[j][u] * v[j][u].z;
          y[u].w += w[j][u] * v[j][u].w;
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (i0 + u * nthreads < n) store_combined_quad(p, tok[u], r[u], y[u]);
  }
}

// Every pass of combine_quads_pass, one after another.
template <int kUnits, int kSlotBatch, typename UnitAt>
__device__ __forceinline__ void combine_quads(const ExpertsParams& p, int n, int tid, int nthreads,
                                              UnitAt unit_at) {
#pragma unroll 1
  for (int i0 = tid; i0 < n; i0 += kUnits * nthreads) {
    combine_quads_pass<kUnits, kSlotBatch>(p, n, i0, nthreads, unit_at);
  }
}

// Pass `pass` of one 16-row down tile's combine by quads (unit i = token i / 4, rows 4 (i % 4)..
// of the tile) by threads [0, nthreads); true while passes remain.
template <int kUnits, int kSlotBatch>
__device__ __forceinline__ bool combine_tile_quads_pass(const ExpertsParams& p, int tile, int pass,
                                                        int tid, int nthreads) {
  const int r0 = tile * 16, n = p.tokens * 4;
  const int i0 = pass * kUnits * nthreads;
  combine_quads_pass<kUnits, kSlotBatch>(p, n, i0 + tid, nthreads, [&](int i, int& tok, int& r) {
    tok = i >> 2;
    r = r0 + 4 * (i & 3);
  });
  return i0 + kUnits * nthreads < n;
}

// The combine of one 16-row down tile, by the CTA that completed the tile's last item (after a
// threadfence): y[t] = sum_s w[t,s] * partial[t,s] in slot order (+ the unfused shared MLP's
// partial), bf16 out; threads [0, nthreads) of the caller split the (token, row) outputs. The
// order of the sums is fixed, so the result is deterministic: no float atomics.
// kPerThread outputs per thread per pass; the slots' weights and partials are loaded kSlotBatch
// slots at a time, all of a batch before its sums, so a pass costs ceil(slots / kSlotBatch)
// dependent L2 round trips (~1-3 us each while HBM streams: the trace). A whole CTA combining
// (the register kernel: 256 threads, 128 registers) takes 1 x 1; one warp combining alone (the
// bulk kernel's epilogue) takes what bulk_combine_tile or bulk_combine_pass picks for the batch.
template <int kPerThread, int kSlotBatch>
__device__ __forceinline__ void combine_tile(const ExpertsParams& p, int tile, int tid,
                                             int nthreads) {
  constexpr int kTileRows = 16;
  const int r0 = tile * kTileRows;
  const int n = p.tokens * kTileRows;
  for (int i0 = tid; i0 < n; i0 += kPerThread * nthreads) {
    float y[kPerThread];
    int tok[kPerThread], r[kPerThread];
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int i = min(i0 + u * nthreads, n - 1);  // past the end: recomputes the last output
      tok[u] = i / kTileRows;
      r[u] = r0 + (i - tok[u] * kTileRows);
      y[u] = 0.0f;
    }
#pragma unroll 1
    for (int s0 = 0; s0 < p.slots; s0 += kSlotBatch) {
      float w[kSlotBatch][kPerThread], v[kSlotBatch][kPerThread];
#pragma unroll
      for (int j = 0; j < kSlotBatch; ++j) {
#pragma unroll
        for (int u = 0; u < kPerThread; ++u) {
          const size_t q = static_cast<size_t>(tok[u]) * p.slots + s0 + j;
          const bool in = s0 + j < p.slots;
          w[j][u] = in ? p.slot_weights[q] : 0.0f;
          v[j][u] = in ? __ldcg(p.partial + q * p.rows + r[u]) : 0.0f;
        }
      }
#pragma unroll
      for (int j = 0; j < kSlotBatch; ++j) {
#pragma unroll
        for (int u = 0; u < kPerThread; ++u) {
          if (s0 + j < p.slots) y[u] += w[j][u] * v[j][u];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      if (i0 + u * nthreads >= n) continue;
      store_combined_output(p, tok[u], r[u], y[u]);
    }
  }
}

}  // namespace moekit::cuda::experts_detail
