// plan_layer (moekit/plan.h): the composition of the rules (expert_rules.h) into one forward's
// launches, in the order the GPU layer runs them (src/cuda/layer/layer_forward.cu):
//   0. the dense shared MLP (cuBLAS), unfused only: it needs x only, so it goes first and leaves
//      the chain of programmatic launches from the router GEMM to the down kernel as it is
//   1. router GEMM   2. routing + dispatch (unless the gate/up kernel routes its one token)
//   2a/2b. the unfused shared MLP through the expert kernels, one dense "expert" of width Is
//   3. routed (+ fused shared) gate/up   4. down + weighted combine
#include "moekit/plan.h"

#include <algorithm>

#include "moekit/error.h"
#include "plan/expert_kernels.h"
#include "plan/expert_rules.h"

namespace moekit::plan {
namespace {

int or_default(int setting, int fallback) { return setting >= 0 ? setting : fallback; }

// The settings of one layer: each override, or its rule's default.
struct Settings {
  int gate_up_tail, shared_first, whole_tiles, down_split, down_deep, one_token_rings;
  int weights_only, l2_keep_from, down_tail, half_items, self_route, task16, shared_dense;
  int mx_groups;
  explicit Settings(const PlanOverrides& o, bool has_shared)
      : gate_up_tail(or_default(o.gate_up_tail_percent, kGateUpTailPercent)),
        shared_first(or_default(o.shared_first_tokens, kSharedFirstTokens)),
        whole_tiles(or_default(o.whole_tile_tokens, kWholeTileTokens)),
        down_split(or_default(o.down_split_tokens, kDownSplitTokens)),
        down_deep(or_default(o.down_deep_tokens, kDownDeepTokens)),
        one_token_rings(or_default(o.one_token_rings, kOneTokenRings)),
        weights_only(o.weights_only_tokens),
        l2_keep_from(o.l2_keep_from_tokens),
        down_tail(o.down_tail_percent),
        half_items(o.half_items_per_cta),
        self_route(or_default(o.self_route_tokens, kSelfRouteTokens)),
        task16(o.task16_from),
        shared_dense(has_shared ? or_default(o.shared_dense_tokens, kSharedDenseTokens) : 0),
        mx_groups(or_default(o.mx_groups_tokens, kMxGroupsTokens)) {}
};

struct Shapes {
  int E, S, H, I, Is, K;
  bool has_shared, can_fuse;
  explicit Shapes(const MoeSpec& s)
      : E(s.num_experts),
        S(s.can_fuse_shared() ? s.shared_slots() : 0),
        H(s.hidden),
        I(s.expert_intermediate),
        Is(s.shared_kind != SharedKind::None && s.shared_intermediate > 0 ? s.shared_intermediate
                                                                          : 0),
        K(s.top_k),
        has_shared(Is > 0),
        can_fuse(s.can_fuse_shared()) {}
};

Stream stream_at(const Shapes& sh, const Settings& st, const PlanOverrides& o, int tokens, bool fp8,
                 bool mx) {
  if (o.stream) {
    MK_CHECK(
        (!fp8 && !mx) || *o.stream == Stream::Bulk || *o.stream == Stream::Grouped,
        (fp8 ? "fp8" : "MX") << " experts run on the bulk kernels or the prefill path, not the "
                             << stream_name(*o.stream) << " kernels (MOEKIT_EXPERTS_KERNEL)");
    return *o.stream;
  }
  if (mx ? experts_grouped_path_mx(tokens, sh.K, sh.E, o.grouped_from_tokens)
         : experts_grouped_path(tokens, sh.K, sh.E, fp8, o.grouped_from_tokens)) {
    return Stream::Grouped;
  }
  // fp8, MX: the bulk kernels wherever the prefill path does not run (no register instances)
  if (fp8 || mx) return Stream::Bulk;
  return experts_stream_default(sh.H, tokens, experts_task16_ring(tokens, sh.K, sh.E, st.task16));
}

// fp8: tasks of 16 wherever tasks of 8 would take the register kernels (above 256 tokens)
bool task16_at(const Shapes& sh, const Settings& st, Stream stream, int tokens, bool fp8) {
  return stream == Stream::Bulk && (experts_task16_ring(tokens, sh.K, sh.E, st.task16) ||
                                    (fp8 && experts_chunk(tokens) == 16));
}

int chunk_at(const Shapes& sh, const Settings& st, Stream stream, int tokens) {
  return task16_at(sh, st, stream, tokens, false) ? 16 : experts_chunk(tokens);
}

bool dense_shared_at(const Shapes& sh, const Settings& st, int tokens) {
  return sh.has_shared && st.shared_dense > 0 && tokens >= st.shared_dense;
}

// Fused or not, and why (a static string).
bool resolve_fused(const MoeSpec& spec, const Shapes& sh, const Settings& st, Stream stream,
                   FuseShared fuse, int tokens, const char* quantised, const char** why) {
  if (!sh.has_shared) {
    *why = "no shared expert";
    return false;
  }
  if (quantised != nullptr) {
    // the quantised shared expert runs as slots of the routed experts' quantised kernels: there
    // is no quantised dense shared MLP
    MK_CHECK(fuse != FuseShared::Off && sh.can_fuse,
             quantised << " experts of " << spec.name << " on the GPU run the shared expert fused"
                       << (sh.can_fuse ? " (fusion off was asked for)"
                                       : ", and its width is not a whole multiple of "
                                         "the expert width"));
    *why = fuse == FuseShared::On ? "on" : "auto: quantised experts run the shared expert fused";
    return true;
  }
  switch (fuse) {
    case FuseShared::On:
      MK_CHECK(sh.can_fuse,
               "cannot fuse the shared expert of "
                   << spec.name << ": shared_intermediate (" << spec.shared_intermediate
                   << ") is not a whole multiple of expert_intermediate (" << sh.I << ")");
      *why = "on";
      return true;
    case FuseShared::Off:
      *why = "off";
      return false;
    case FuseShared::Auto:
      break;
  }
  if (!sh.can_fuse) {
    *why = "auto: shared width not a multiple of the expert width";
    return false;
  }
  if (stream == Stream::Grouped) {
    if (dense_shared_at(sh, st, tokens)) {
      *why = "auto: the grouped path runs the shared MLP as dense GEMMs beside the routed groups";
      return false;
    }
    *why = "auto: the grouped GEMMs take the shared slots as more groups";
    return true;
  }
  if (dense_shared_at(sh, st, tokens)) {
    const long long shared_bytes = 3LL * sh.Is * sh.H * 2;  // bf16 gate, up, down
    if (experts_shared_dense_over_fused(tokens, chunk_at(sh, st, stream, tokens), shared_bytes)) {
      *why = "auto: the fused slots would re-stream the shared weights >= 100 MB";
      return false;
    }
    *why = "auto: the fused slots re-stream the shared weights < 100 MB";
    return true;
  }
  if (sh.S > 1 && tokens >= kUnfusedFromTokensWithManySlots) {
    *why = "auto: several shared slots from 32 tokens";
    return false;
  }
  *why = "auto: fused below the dense shared MLP";
  return true;
}

}  // namespace

LayerPlan plan_layer(const MoeSpec& spec, int tokens, FuseShared fuse,
                     const PlanOverrides& overrides, const DeviceInfo& device, DType experts,
                     ExpertFormat mx_format) {
  MK_CHECK(tokens >= 1, "plan_layer: expected tokens >= 1, got " << tokens);
  MK_CHECK(device.sms >= 1, "plan_layer: expected a device with >= 1 SM, got " << device.sms);
  MK_CHECK(experts == DType::BF16 || experts == DType::F8_E4M3,
           "plan_layer: experts held in " << dtype_name(experts)
                                          << " (the GPU layer runs BF16 or F8_E4M3 experts)");
  const bool mx = mx_format != ExpertFormat::Bf16;
  MK_CHECK(!mx || ((mx_format == ExpertFormat::Mxfp8 || mx_format == ExpertFormat::Mxfp4) &&
                   experts == DType::BF16),
           "plan_layer: MX experts are Mxfp8 or Mxfp4 with experts BF16, got "
               << expert_format_name(mx_format) << " with " << dtype_name(experts));
  const bool fp8 = experts == DType::F8_E4M3;
  const Shapes sh(spec);
  const Settings st(overrides, sh.has_shared);
  LayerPlan p;
  p.model = spec.name;
  p.tokens = tokens;
  p.device = device;
  p.pdl = overrides.pdl;
  p.fp8 = fp8;
  p.mx = mx_format;
  p.stream = stream_at(sh, st, overrides, tokens, fp8, mx);
  const bool bulk = p.stream == Stream::Bulk;
  // (MX: tasks of 8 tokens at every batch, its instances' one n-tile)
  const bool task16 = !mx && task16_at(sh, st, p.stream, tokens, fp8);
  p.chunk = task16 ? 16 : mx ? 8 : experts_chunk(tokens);
  p.fused = resolve_fused(spec, sh, st, p.stream, fuse, tokens,
                          fp8  ? "fp8"
                          : mx ? expert_format_name(mx_format)
                               : nullptr,
                          &p.fuse_reason);
  const int s_run = p.fused ? sh.S : 0;
  p.slots = sh.K + s_run;

  if (p.stream == Stream::Grouped) {
    // the routing kernel's ids and weights feed the prefill path (its own permute and group
    // arrays); the unfused shared MLP runs as the dense GEMMs beside it
    p.dense_shared = sh.has_shared && !p.fused;
    p.routing_dispatch = false;
    const GroupedGemms gemms =
        experts_grouped_gemms(tokens, sh.K, sh.E, s_run, fp8, device.grouped_tile128_from_rows,
                              overrides.grouped_gate_up, overrides.grouped_down);
    p.grouped_gate_up = gemms.gate_up;
    p.grouped_down = gemms.down;
    if (mx) {
      const int rows = sh.E + s_run;
      p.grouped_mx_tile = experts_grouped_mx_tile(tokens, sh.K, sh.E, overrides.grouped_mx_tile);
      if (p.grouped_mx_tile == 0) {
        p.grouped_mx_chunk = experts_grouped_mx_chunk(rows, sh.H, sh.I, overrides.grouped_mx_chunk);
        p.grouped_mx_runs = (rows + p.grouped_mx_chunk - 1) / p.grouped_mx_chunk;
      }
    }
    p.router = tuning::choose_router_gemm(device.arch, spec.router_dtype, sh.H,
                                          spec.router_columns(), tokens);
    return p;
  }
  const int chunk = p.chunk;
  // (fp8: the ring of weights only at every batch, without the L2 keep: its only instances)
  // (MX: its ring at every batch, without the keep or the down tail: its only instances)
  const bool l2_keep = !fp8 && !mx && experts_l2_keep(tokens, sh.H, chunk, st.l2_keep_from);
  const int down_tail = bulk && !mx ? experts_down_tail(tokens, sh.H, chunk, st.down_tail) : 0;
  // the ring of weights only in place of the half items, the split copies and the deep rings
  const bool weights_only =
      fp8 || mx || task16 ||
      (bulk && experts_l2_acts_ring(tokens, chunk, sh.I, sh.K, sh.E, st.weights_only));
  const int half_items =
      bulk && !l2_keep && !weights_only
          ? experts_gate_up_half_items(tokens, sh.H, chunk, st.half_items, st.one_token_rings)
          : 0;
  // fp8's one-token gate/up ring (and its self-routing instance: 8 experts a lane, E <= 256)
  const bool fp8_one_token_gate_up =
      fp8 && chunk == 8 &&
      experts_fp8_one_token_ring(Gemm::GateUp, tokens, sh.H, st.one_token_rings);
  // (a shared expert fused: its slots' tasks follow the routed ones, a lane each, so <= 32 slots;
  // unfused, its own launches would need the routing's shared_scale and tasks first; MX keeps its
  // routing kernel with one, docs/decisions/experts_self_route.md)
  const bool self_route = bulk && (!fp8 || fp8_one_token_gate_up) && chunk == 8 &&
                          tokens <= st.self_route && (!sh.has_shared || (p.fused && !mx)) &&
                          p.slots <= 32 && sh.E <= (fp8 ? 256 : 128) && !l2_keep && half_items == 0;
  const bool shared_unfused = sh.has_shared && !p.fused;
  p.dense_shared = shared_unfused && dense_shared_at(sh, st, tokens);
  p.routing_kernel = !self_route;
  p.router = tuning::choose_router_gemm(device.arch, spec.router_dtype, sh.H, spec.router_columns(),
                                        tokens);

  // a launch's resident grid: SMs x its instance's CTAs per SM
  auto resident = [&](int kernel) { return device.sms * expert_kernels()[kernel].ctas_per_sm; };
  const bool halves = half_items > 0 && chunk == 8;

  // 2a/2b. the unfused shared MLP through the expert kernels
  if (shared_unfused && !p.dense_shared) {
    ExpertLaunch g;
    g.role = "shared gate/up";
    g.shared = true;
    g.kernel = select_expert_kernel({.gemm = Gemm::GateUp,
                                     .chunk = chunk,
                                     .stream = p.stream,
                                     .k = sh.H,
                                     .l2_keep = l2_keep,
                                     .half_items = halves});
    g.grid = resident(g.kernel);
    g.dynamic_tail_percent = bulk ? st.gate_up_tail : 0;
    g.half_items_per_cta = half_items;
    p.experts.push_back(g);
    ExpertLaunch d;
    d.role = "shared down";
    d.shared = true;
    d.kernel = select_expert_kernel(
        {.gemm = Gemm::Down, .chunk = chunk, .stream = p.stream, .k = sh.Is, .l2_keep = l2_keep});
    d.grid = resident(d.kernel);
    p.experts.push_back(d);
  }

  // 3. routed (+ fused shared) gate/up
  ExpertLaunch g;
  g.role = "gate/up";
  Ring gate_up_ring = Ring::Standard;
  if (mx) {
    gate_up_ring = Ring::MxWeightsOnly;
  } else if (weights_only) {
    gate_up_ring = fp8_one_token_gate_up ? Ring::Fp8OneToken : Ring::WeightsOnly;
  } else if (!l2_keep &&
             experts_gate_up_one_token_ring(tokens, sh.H, self_route, st.one_token_rings)) {
    gate_up_ring = Ring::OneToken;
  }
  const bool mx_groups = bulk && experts_mx_consumer_groups(mx_format, tokens, st.mx_groups);
  g.kernel = select_expert_kernel({.gemm = Gemm::GateUp,
                                   .chunk = chunk,
                                   .stream = p.stream,
                                   .k = sh.H,
                                   .ring = gate_up_ring,
                                   .l2_keep = l2_keep,
                                   .half_items = halves,
                                   .self_route = self_route,
                                   .fp8 = fp8,
                                   .mx = mx_format,
                                   .consumer_groups = mx_groups});
  g.grid = resident(g.kernel);
  g.dynamic_tail_percent = bulk ? st.gate_up_tail : 0;
  g.half_items_per_cta = half_items;
  if (s_run > 0 && bulk && tokens <= st.shared_first) g.early_shared = s_run;
  p.experts.push_back(g);

  // 4. down + weighted combine. The down rings have no tail instances (a tail, only ever forced
  // where one would be, wins); the 4 KB one-token ring takes the place of the split copies; the
  // ring of weights only the place of all the others.
  ExpertLaunch d;
  d.role = "down";
  Ring down_ring = Ring::Standard;
  const bool fp8_own_ring = fp8 && chunk == 8 && down_tail == 0;
  if (mx) {
    down_ring = Ring::MxWeightsOnly;
  } else if (weights_only && fp8_own_ring &&
             experts_fp8_one_token_ring(Gemm::Down, tokens, sh.I, st.one_token_rings)) {
    down_ring = Ring::Fp8OneTokenDeep;
  } else if (weights_only) {
    down_ring = fp8_own_ring && experts_down_deep_fp8_ring(sh.I, st.down_deep)
                    ? Ring::WeightsOnlyDeep
                    : Ring::WeightsOnly;
  } else if (down_tail > 0) {
    down_ring = Ring::Standard;
  } else if (experts_down_wide_one_token_ring(tokens, sh.I, st.one_token_rings)) {
    down_ring = Ring::OneToken;
  } else if (experts_down_deep_ring(tokens, sh.I, st.down_deep)) {
    down_ring = experts_down_one_token_ring(tokens, sh.I, st.one_token_rings) ? Ring::OneTokenNarrow
                                                                              : Ring::Deep;
  }
  const bool chunk8_ring = chunk == 8 || down_ring == Ring::WeightsOnly;
  const Ring launched_ring = chunk8_ring ? down_ring : Ring::Standard;
  const bool one_copy = launched_ring == Ring::OneToken || launched_ring == Ring::WeightsOnly ||
                        launched_ring == Ring::WeightsOnlyDeep ||
                        launched_ring == Ring::Fp8OneTokenDeep ||
                        launched_ring == Ring::MxWeightsOnly;
  const int pieces = one_copy ? 1 : experts_down_copy_pieces(tokens, sh.I, st.down_split);
  d.kernel = select_expert_kernel({.gemm = Gemm::Down,
                                   .chunk = chunk,
                                   .stream = p.stream,
                                   .k = sh.I,
                                   .ring = launched_ring,
                                   .split_rows = pieces == 2,
                                   .l2_keep = l2_keep,
                                   .down_tail = down_tail > 0 && chunk == 8,
                                   .fp8 = fp8,
                                   .mx = mx_format,
                                   .consumer_groups = mx_groups});
  d.grid = bulk ? experts_down_grid(resident(d.kernel), sh.H, tokens, st.whole_tiles)
                : resident(d.kernel);
  d.down_tail_percent = down_tail;
  d.combine = true;
  p.experts.push_back(d);
  return p;
}

int own_launches(const LayerPlan& p) {
  constexpr int kGroupedPathLaunches = 7;  // plan (count, place), permute, 2 GEMMs, activation,
                                           // combine
  // (MX: each GEMM in runs, a widening and a GEMM each)
  const int experts = p.stream != Stream::Grouped ? static_cast<int>(p.experts.size())
                      : p.grouped_mx_runs > 0     ? kGroupedPathLaunches - 2 + 4 * p.grouped_mx_runs
                                                  : kGroupedPathLaunches;
  // (fp8 on the bulk kernels: x and h quantised to e4m3 by a kernel each)
  const int quantisers = p.fp8 && p.stream == Stream::Bulk ? 2 : 0;
  return 1 + (p.routing_kernel ? 1 : 0) + experts + quantisers;
}

}  // namespace moekit::plan
