// The grouped expert op on the GPU (experts_kernel.cuh): for every task {expert, token chunk}
// produced by the dispatch, gate/up with the activation fused (h = act(x W1^T, x W3^T)), and down
// with the weighted combine fused (y = sum_slots w * h W2^T). Launch code apart from the kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/routing/routing.h"
#include "moekit/spec.h"

namespace moekit::cuda {

// A pair id's activation row, q / d for 0 <= q < 2^31 and d >= 1, as one multiply and shift:
// (q * mul) >> shift with p = ceil(log2 d), mul = ceil(2^(31 + p) / d), shift = 31 + p; exact,
// since q * (mul - 2^(31 + p) / d) / 2^(31 + p) < 2^-p <= 1 / d. why: the kernels take it at
// every item's start, where an integer division is a chain of some twenty instructions.
struct RowDivisor {
  uint32_t mul = 1u << 31;  // d = 1
  int shift = 31;
  RowDivisor() = default;
  explicit RowDivisor(int d);
  __host__ __device__ int of(int q) const {
    return static_cast<int>((static_cast<unsigned long long>(q) * mul) >> shift);
  }
};

struct ExpertsParams {
  // weights: expert e's matrix starts at w + e * w_expert_stride (elements), row-major
  //   gate/up: [2*inter, k] (gate rows [0,inter), up rows [inter,2*inter));  down: [rows, k]
  const __nv_bfloat16* w = nullptr;
  long long w_expert_stride = 0;
  // the fp8 instances (plan::ExpertKernel::fp8) instead of w: e4m3 bytes in w's layout (an
  // element a byte), and per expert the fp32 multiplier of each 128 x 128 tile, [rows/128, k/128]
  // row-major (gate/up: the gate's tile rows, then the up's); k and inter multiples of 128
  const uint8_t* w8 = nullptr;
  const float* w_scale = nullptr;
  long long scale_expert_stride = 0;  // floats of w_scale per expert
  const float* bias = nullptr;  // gate/up: [2*inter] per expert; down: [rows]; or null
  long long bias_expert_stride = 0;
  int inter = 0;  // gate/up: intermediate width I of one expert (or of the unfused shared MLP)
  int rows = 0;   // output rows per expert: inter (gate/up) or H (down)
  int k = 0;      // reduction length: H (gate/up) or inter (down); multiple of 64
  // activations: row of pair q is x + x_row.of(q) * k (q / slots: the routed gate/up; else q)
  const __nv_bfloat16* x = nullptr;
  RowDivisor x_row;
  // the fp8 instances' activations instead of x (quantize_rows_fp8.h): row of pair q is
  // x8 + x_row.of(q) * k, e4m3, its scales x_scale + x_row.of(q) * (k / 128)
  const uint8_t* x8 = nullptr;
  const float* x_scale = nullptr;
  // dispatch
  const int* pair_list = nullptr;
  const ExpertTask* tasks = nullptr;
  const int* num_tasks = nullptr;  // device
  // entries of tasks / pair_list the bulk kernel may read ahead of *num_tasks (initialised
  // memory); <= 32 of them are loaded with the task count and looked up by shuffles; 0: fetch
  int task_capacity = 0;
  int pair_capacity = 0;
  int* work_counter = nullptr;     // device, zeroed by the dispatch
  // bulk gate/up kernel: the last dynamic_tail_percent % of the items are not in the CTAs'
  // static ranges but taken from work_counter by the CTAs that finish their ranges first
  int dynamic_tail_percent = 0;
  // The instance's choices, recorded for the launch check (launch_expert_kernel): the kernels
  // take them from their template (src/plan/expert_kernels.h). weight_copy_pieces 2: split_rows;
  // ring: the instance's Ring as experts_instances.cuh numbers it; l2_keep 1: l2_keep.
  int weight_copy_pieces = 1;
  int ring = 0;
  int l2_keep = 0;
  // bulk down kernel with a combine (tile_counters set), its down_tail instances: the % of its
  // 16-row output tiles whose items are taken one by one from work_counter by the CTAs that
  // finish their static ranges first, and combined once every CTA has written its partials.
  // tile_counters then has one more word, the CTAs done. 0: none (every item static)
  int down_tail_percent = 0;
  // bulk gate/up kernel, its half_items instances: the last half_items_per_cta x grid items of
  // its dynamic tail are claimed as two halves each (4 of the tile's 8 h rows). 0: whole items
  int half_items_per_cta = 0;
  // bulk gate/up with the shared experts fused: their number S (ids first_shared_expert..+S-1,
  // slots top_k..top_k+S-1 of every token; tokens and slots below), whose items are issued
  // before the kernel waits for the dispatch (they need nothing from it); 0: none early
  int early_shared = 0;
  int first_shared_expert = 0;
  // bulk gate/up, its self_route instances (one token, shared experts fused or none, E <= 128;
  // fp8's E <= 256): 1, and no routing kernel runs before it: it routes its token from the logits
  // itself (`route`: the routing kernel's params, whose routing and dispatch its CTA 0 writes for
  // the down kernel)
  int self_route = 0;
  RoutingParams route;
  // (self_route: its CTAs done claiming from work_counter, which its last CTA zeroes with this)
  int* self_route_ctas_done = nullptr;
  // gate/up output h [pairs, inter] bf16 and activation
  __nv_bfloat16* h = nullptr;
  Activation activation = Activation::Silu;
  float limit = 0.0f, alpha = 1.702f, beta = 1.0f;
  // down output: fp32 partial [pairs, rows] (unweighted expert output, bias included)
  float* partial = nullptr;
  // combine (down only; null tile_counters = no combine): y[t] = sum_s w[t,s] * partial[t*slots+s]
  // (+ shared_scale[t] * shared_partial[t]) in slot order, bf16 out. rows / 16 tile counters
  // (+ 1 with down_tail_percent), zeroed by the dispatch
  int* tile_counters = nullptr;
  int tokens = 0;
  int slots = 0;
  const float* slot_weights = nullptr;
  const float* shared_partial = nullptr;
  const float* shared_scale = nullptr;
  __nv_bfloat16* y = nullptr;
  unsigned long long* trace = nullptr;  // timeline (cuda/common/trace.cuh; bulk kernel) or null
  // the MX instances (plan::ExpertKernel::mx) instead of w: w8 holds the packed rows in the
  // kernels' layout (experts_mx_layout.h: tiles of 16 rows, a row mx_row_bytes(k) bytes of k e4m3
  // or k/2 e2m1 pairs), w_expert_stride in bytes, and mx_scale the rows' e8m0 bytes in that
  // layout, per expert mx_scale_expert_stride bytes; k a multiple of 32. (Last: the other
  // instances' parameter offsets stay as they were.)
  const uint8_t* mx_scale = nullptr;
  long long mx_scale_expert_stride = 0;
};

// Raises the shared-memory limit of every expert-kernel instance (src/plan/expert_kernels.h) on
// the current device and checks that each is resident as its table row says (ctas_per_sm): the
// plan's grids are SMs x that. Throws naming the instance that differs.
void prepare_expert_kernels();

// Launches instance `kernel` (an index into plan::expert_kernels()) on `grid` CTAs, with
// programmatic dependent launch when `pdl`. Checks that the params' recorded choices
// (ring, weight_copy_pieces, l2_keep, self_route) agree with the instance.
void launch_expert_kernel(int kernel, const ExpertsParams& p, int grid, bool pdl,
                          cudaStream_t stream);

}  // namespace moekit::cuda
