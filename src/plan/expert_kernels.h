// The one list of compiled expert-kernel instances (moekit/plan.h: ExpertKernel). It drives the
// CUDA instantiation (src/cuda/experts/experts_instances.cuh, one .cu per stream and GEMM), the
// plan's choice of an instance by its fields (find_expert_kernel), the residency check at layer
// creation, `moekit list-kernels` and the GPU test that runs every instance. Host-only, constexpr,
// so the CUDA sources read the same rows.
//
// Which rule picks each bulk instance: src/plan/expert_rules.cpp. The register kernels run above
// 256 tokens (experts_stream_default): regs-early for hidden >= 4096, regs below.
#pragma once

#include "moekit/plan.h"

namespace moekit::plan {

// Bulk instances: one CTA of 11 warps and ~200 KB of shared memory per SM.
constexpr ExpertKernel bulk(const char* name, Gemm g, int n_tiles, Ring r = Ring::Standard) {
  ExpertKernel k;
  k.name = name;
  k.gemm = g;
  k.stream = Stream::Bulk;
  k.n_tiles = n_tiles;
  k.ring = r;
  return k;
}
constexpr ExpertKernel with_split_rows(ExpertKernel k) { return k.split_rows = true, k; }
constexpr ExpertKernel with_l2_keep(ExpertKernel k) { return k.l2_keep = true, k; }
constexpr ExpertKernel with_down_tail(ExpertKernel k) { return k.down_tail = true, k; }
constexpr ExpertKernel with_half_items(ExpertKernel k) { return k.half_items = true, k; }
constexpr ExpertKernel with_self_route(ExpertKernel k) { return k.self_route = true, k; }
constexpr ExpertKernel with_fp8(ExpertKernel k) { return k.fp8 = true, k; }
constexpr ExpertKernel with_mx(ExpertKernel k, ExpertFormat f) { return k.mx = f, k; }
constexpr ExpertKernel with_consumer_groups(ExpertKernel k) { return k.consumer_groups = true, k; }

// Register instances: 8 warps (4 for short down rows), registers capped at 128 by
// __launch_bounds__(threads, 16 / warps): 2 (or 4) CTAs per SM.
constexpr ExpertKernel regs(const char* name, Gemm g, Stream s, int n_tiles, int unroll,
                            int warps = 8) {
  ExpertKernel k;
  k.name = name;
  k.gemm = g;
  k.stream = s;
  k.n_tiles = n_tiles;
  k.unroll = unroll;
  k.warps = warps;
  k.ctas_per_sm = 16 / warps;
  return k;
}

constexpr Gemm kGU = Gemm::GateUp;
constexpr Gemm kDn = Gemm::Down;

inline constexpr ExpertKernel kExpertKernels[] = {
    // bulk gate/up, tasks of <= 8 tokens
    bulk("bulk_gate_up", kGU, 1),
    with_l2_keep(bulk("bulk_gate_up_l2_keep", kGU, 1)),
    with_half_items(bulk("bulk_gate_up_half_items", kGU, 1)),
    with_self_route(bulk("bulk_gate_up_self_route", kGU, 1)),
    bulk("bulk_gate_up_one_token", kGU, 1, Ring::OneToken),
    with_half_items(bulk("bulk_gate_up_one_token_half_items", kGU, 1, Ring::OneToken)),
    with_self_route(bulk("bulk_gate_up_one_token_self_route", kGU, 1, Ring::OneToken)),
    bulk("bulk_gate_up_weights_only", kGU, 1, Ring::WeightsOnly),
    with_l2_keep(bulk("bulk_gate_up_weights_only_l2_keep", kGU, 1, Ring::WeightsOnly)),
    // bulk down (+ combine), tasks of <= 8 tokens
    bulk("bulk_down", kDn, 1),
    with_l2_keep(bulk("bulk_down_l2_keep", kDn, 1)),
    with_down_tail(bulk("bulk_down_tail", kDn, 1)),
    with_down_tail(with_l2_keep(bulk("bulk_down_l2_keep_tail", kDn, 1))),
    with_split_rows(bulk("bulk_down_split_rows", kDn, 1)),
    with_down_tail(with_split_rows(bulk("bulk_down_split_rows_tail", kDn, 1))),
    bulk("bulk_down_deep", kDn, 1, Ring::Deep),
    bulk("bulk_down_one_token_narrow", kDn, 1, Ring::OneTokenNarrow),
    bulk("bulk_down_one_token", kDn, 1, Ring::OneToken),
    bulk("bulk_down_weights_only", kDn, 1, Ring::WeightsOnly),
    with_l2_keep(bulk("bulk_down_weights_only_l2_keep", kDn, 1, Ring::WeightsOnly)),
    with_down_tail(bulk("bulk_down_weights_only_tail", kDn, 1, Ring::WeightsOnly)),
    with_down_tail(
        with_l2_keep(bulk("bulk_down_weights_only_l2_keep_tail", kDn, 1, Ring::WeightsOnly))),
    // bulk, tasks of <= 16 tokens
    bulk("bulk_gate_up_16", kGU, 2),
    bulk("bulk_down_16", kDn, 2),
    bulk("bulk_gate_up_16_weights_only", kGU, 2, Ring::WeightsOnly),
    bulk("bulk_down_16_weights_only", kDn, 2, Ring::WeightsOnly),
    // bulk, fp8 block-scale weights (W8A8), the ring of weights only
    with_fp8(bulk("bulk_gate_up_weights_only_fp8", kGU, 1, Ring::WeightsOnly)),
    with_fp8(bulk("bulk_down_weights_only_fp8", kDn, 1, Ring::WeightsOnly)),
    with_fp8(with_down_tail(bulk("bulk_down_weights_only_tail_fp8", kDn, 1, Ring::WeightsOnly))),
    with_fp8(bulk("bulk_gate_up_16_weights_only_fp8", kGU, 2, Ring::WeightsOnly)),
    with_fp8(bulk("bulk_down_16_weights_only_fp8", kDn, 2, Ring::WeightsOnly)),
    with_fp8(bulk("bulk_down_weights_only_deep_fp8", kDn, 1, Ring::WeightsOnlyDeep)),
    // bulk, fp8, one token: the activation row and every scale in the stage
    with_fp8(bulk("bulk_gate_up_one_token_fp8", kGU, 1, Ring::Fp8OneToken)),
    with_self_route(
        with_fp8(bulk("bulk_gate_up_one_token_fp8_self_route", kGU, 1, Ring::Fp8OneToken))),
    with_fp8(bulk("bulk_down_one_token_deep_fp8", kDn, 1, Ring::Fp8OneTokenDeep)),
    // bulk, OCP MX weights (W8A16 / W4A16), the ring of MX weights and their scales
    with_mx(bulk("bulk_gate_up_mxfp8", kGU, 1, Ring::MxWeightsOnly), ExpertFormat::Mxfp8),
    with_self_route(with_mx(bulk("bulk_gate_up_mxfp8_self_route", kGU, 1, Ring::MxWeightsOnly),
                            ExpertFormat::Mxfp8)),
    with_mx(bulk("bulk_down_mxfp8", kDn, 1, Ring::MxWeightsOnly), ExpertFormat::Mxfp8),
    with_mx(bulk("bulk_gate_up_mxfp4", kGU, 1, Ring::MxWeightsOnly), ExpertFormat::Mxfp4),
    with_self_route(with_mx(bulk("bulk_gate_up_mxfp4_self_route", kGU, 1, Ring::MxWeightsOnly),
                            ExpertFormat::Mxfp4)),
    with_mx(bulk("bulk_down_mxfp4", kDn, 1, Ring::MxWeightsOnly), ExpertFormat::Mxfp4),
    with_consumer_groups(with_mx(bulk("bulk_gate_up_mxfp4_groups", kGU, 1, Ring::MxWeightsOnly),
                                 ExpertFormat::Mxfp4)),
    with_consumer_groups(
        with_mx(bulk("bulk_down_mxfp4_groups", kDn, 1, Ring::MxWeightsOnly), ExpertFormat::Mxfp4)),
    // registers
    regs("regs_gate_up", kGU, Stream::Registers, 1, 5),
    regs("regs_down", kDn, Stream::Registers, 1, 4),
    regs("regs_down_4warps", kDn, Stream::Registers, 1, 4, 4),
    regs("regs_gate_up_16", kGU, Stream::Registers, 2, 3),
    regs("regs_down_16", kDn, Stream::Registers, 2, 3),
    regs("regs_early_gate_up", kGU, Stream::RegistersEarlyActs, 1, 3),
    regs("regs_early_down", kDn, Stream::RegistersEarlyActs, 1, 3),
    regs("regs_early_gate_up_16", kGU, Stream::RegistersEarlyActs, 2, 2),
    regs("regs_early_down_16", kDn, Stream::RegistersEarlyActs, 2, 2),
};
inline constexpr int kNumExpertKernels =
    static_cast<int>(sizeof(kExpertKernels) / sizeof(kExpertKernels[0]));

// Same instance: every field but the name.
constexpr bool same_fields(const ExpertKernel& a, const ExpertKernel& b) {
  return a.gemm == b.gemm && a.stream == b.stream && a.n_tiles == b.n_tiles && a.ring == b.ring &&
         a.split_rows == b.split_rows && a.l2_keep == b.l2_keep && a.down_tail == b.down_tail &&
         a.half_items == b.half_items && a.self_route == b.self_route && a.fp8 == b.fp8 &&
         a.mx == b.mx && a.consumer_groups == b.consumer_groups && a.unroll == b.unroll &&
         a.warps == b.warps && a.ctas_per_sm == b.ctas_per_sm;
}

// What the bulk kernel's templates can build (experts_bulk_kernel.cuh's static_asserts, and
// the rings that exist per n-tiles); the table must hold legal rows only.
constexpr bool legal(const ExpertKernel& k) {
  if (k.n_tiles != 1 && k.n_tiles != 2) return false;
  if (k.stream != Stream::Bulk) {
    return k.ring == Ring::Standard && !k.split_rows && !k.l2_keep && !k.down_tail &&
           !k.half_items && !k.self_route && !k.fp8 && k.mx == ExpertFormat::Bf16 &&
           k.unroll >= 1 && (k.warps == 8 || k.warps == 4);
  }
  const bool gu = k.gemm == Gemm::GateUp;
  // MX: its own ring, one n-tile, no other option but the self-routing gate/up; the ring is
  // MX's alone
  const bool mx = k.mx != ExpertFormat::Bf16;
  // (consumer groups: MXFP4's, not the self-routing one)
  if (k.consumer_groups && (k.mx != ExpertFormat::Mxfp4 || k.self_route)) return false;
  if (mx || k.ring == Ring::MxWeightsOnly) {
    return mx && k.ring == Ring::MxWeightsOnly && k.n_tiles == 1 && !k.fp8 && !k.split_rows &&
           !k.l2_keep && !k.down_tail && !k.half_items && (gu || !k.self_route) &&
           (k.mx == ExpertFormat::Mxfp8 || k.mx == ExpertFormat::Mxfp4);
  }
  // fp8: the rings of weights only (the deep one: down, one n-tile, no tail) and the fp8
  // one-token rings (gate/up; down, rows <= 2 KB), without the L2 keep; those three rings are
  // fp8's alone
  const bool fp8_ring = k.ring == Ring::WeightsOnlyDeep || k.ring == Ring::Fp8OneToken ||
                        k.ring == Ring::Fp8OneTokenDeep;
  if (k.fp8 && ((k.ring != Ring::WeightsOnly && !fp8_ring) || k.l2_keep)) return false;
  if (fp8_ring && (!k.fp8 || k.n_tiles != 1 || k.down_tail)) return false;
  if ((k.ring == Ring::WeightsOnlyDeep || k.ring == Ring::Fp8OneTokenDeep) && gu) return false;
  if (k.ring == Ring::Fp8OneToken && !gu) return false;
  if (k.n_tiles == 2) {
    return (k.ring == Ring::Standard || k.ring == Ring::WeightsOnly) && !k.split_rows &&
           !k.l2_keep && !k.down_tail && !k.half_items && !k.self_route;
  }
  if (k.split_rows && (gu || k.ring != Ring::Standard || k.l2_keep)) return false;
  if (k.down_tail && gu) return false;
  if ((k.half_items || k.self_route) && (!gu || k.l2_keep)) return false;
  if (k.half_items && k.self_route) return false;
  switch (k.ring) {
    case Ring::Standard:
      return true;
    case Ring::Deep:
    case Ring::OneTokenNarrow:
      return !gu && !k.l2_keep && !k.down_tail && !k.split_rows;
    case Ring::OneToken:
      return !k.l2_keep && !k.down_tail && !k.split_rows;
    case Ring::WeightsOnly:
    case Ring::WeightsOnlyDeep:
    case Ring::Fp8OneTokenDeep:
      return !k.split_rows && !k.half_items && !k.self_route;
    case Ring::Fp8OneToken:
      return !k.split_rows && !k.half_items;
    case Ring::MxWeightsOnly:
      return false;  // (MX's, above)
  }
  return false;
}

constexpr bool table_is_valid() {
  for (int i = 0; i < kNumExpertKernels; ++i) {
    if (!legal(kExpertKernels[i])) return false;
    for (int j = 0; j < i; ++j) {
      if (same_fields(kExpertKernels[i], kExpertKernels[j])) return false;
    }
  }
  return true;
}
static_assert(table_is_valid(), "kExpertKernels: an illegal or repeated instance");

}  // namespace moekit::plan
