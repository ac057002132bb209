// The expert-parallel dispatch and combine kernels' parameters and launchers
// (dispatch_combine.cuh holds the kernels; src/cuda/ep/rank_runner.h runs them).
//
//   ep_dispatch_pack   one source rank's tokens -> per destination rank d: which tokens have a
//                      pair on d (pos[t] = their packed row, or -1), those x rows and their whole
//                      k-wide id / weight rows packed in token order, the count; rows [count,
//                      fill_rows) get an id outside d's slice and weight 0 (the fixed blocks of the
//                      low-latency mode, which the destination's experts then skip)
//   ep_combine         y[t] = sum over terms in order of term.rows[pos[t]] (pos null: row t;
//                      pos[t] < 0: no term), fp32, rounded to bf16 once
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "moekit/dtype.h"

namespace moekit::cuda {

inline constexpr int kEpMaxRanks = 8;

struct EpPackDest {
  int slice_first = 0;  // the destination's experts: global ids [slice_first, +slice_count)
  int slice_count = 0;
  int32_t sentinel = 0;           // a global id outside that slice (the fill rows' ids)
  Bf16* send_x = nullptr;         // [fill or count rows, H]
  int32_t* send_ids = nullptr;    // [rows, k]
  float* send_weights = nullptr;  // [rows, k]
  int32_t* pos = nullptr;         // [tokens]
  int32_t* count = nullptr;       // one int
};

struct EpPackParams {
  const Bf16* x = nullptr;              // [tokens, H] the source's tokens
  const int32_t* topk_ids = nullptr;    // [tokens, k] global ids
  const float* topk_weights = nullptr;  // [tokens, k]
  int tokens = 0;
  int hidden = 0;  // H, a multiple of 8 (rows copied as 16-byte vectors)
  int top_k = 0;
  int fill_rows = 0;  // low latency: the block's capacity (rows past the count filled); else 0
  int num_dests = 0;  // grid.y
  EpPackDest dests[kEpMaxRanks];
};

void launch_ep_dispatch_pack(const EpPackParams& p, cudaStream_t stream);

struct EpCombineTerm {
  const Bf16* rows = nullptr;    // [*, H]
  const int32_t* pos = nullptr;  // [tokens] row of token t, -1 = none; null = row t
};

struct EpCombineParams {
  Bf16* y = nullptr;  // [tokens, H]
  int tokens = 0;
  int hidden = 0;
  int num_terms = 0;
  EpCombineTerm terms[kEpMaxRanks];  // summed in this order
};

void launch_ep_combine(const EpCombineParams& p, cudaStream_t stream);

}  // namespace moekit::cuda
