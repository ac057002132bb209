// MoeWeightsView (include/moekit/moe.h): its validation, the stacks' rows as ExpertView, and
// ViewLayerWeights, the LayerWeights over a host view that the CPU backends run on.
#include <cstdint>

#include "moekit/error.h"
#include "moekit/moe.h"

namespace moekit {

const char* location_name(Location l) { return l == Location::Host ? "host" : "device"; }

const char* view_use_name(ViewUse u) {
  switch (u) {
    case ViewUse::Layer:
      return "forward";
    case ViewUse::Router:
      return "route";
    case ViewUse::RoutingBias:
      return "route_logits";
    case ViewUse::Experts:
      return "experts";
  }
  return "?";
}

int64_t fp8_w13_scale_floats(const MoeSpec& spec) {
  const int64_t t = kFp8Tile;
  return 2 * ((spec.expert_intermediate + t - 1) / t) * ((spec.hidden + t - 1) / t);
}

int64_t fp8_w2_scale_floats(const MoeSpec& spec) {
  const int64_t t = kFp8Tile;
  return ((spec.hidden + t - 1) / t) * ((spec.expert_intermediate + t - 1) / t);
}

namespace {

// One stack's stride: `given` elements (`unit`), 0 = dense; never smaller than one expert's
// matrix.
int64_t stack_stride(int64_t given, int64_t dense, const char* name, const char* shape,
                     const char* unit = "elements") {
  MK_CHECK(given == 0 || given >= dense, name << " = " << given << " is smaller than one expert's "
                                              << shape << " (" << dense << " " << unit
                                              << "); 0 means dense");
  return given == 0 ? dense : given;
}

// The router and the routing's biases: what route() and forward() read.
void validate_router(const MoeSpec& spec, const MoeWeightsView& v, ViewUse use) {
  if (use == ViewUse::Layer || use == ViewUse::Router) {
    MK_CHECK(v.router_weight != nullptr, "router_weight of " << spec.name << " is null ("
                                                             << view_use_name(use)
                                                             << " reads the router)");
    MK_CHECK(spec.router_dtype == DType::BF16 || spec.router_dtype == DType::F32,
             "expected router dtype BF16 or F32, got " << dtype_name(spec.router_dtype));
    MK_CHECK(!spec.has_router_bias || v.router_bias != nullptr,
             spec.name << " has a router bias (gpt-oss) but router_bias is null");
  }
  MK_CHECK(!spec.has_correction_bias || v.correction_bias != nullptr,
           spec.name << " has an e_score_correction_bias but correction_bias is null");
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// An fp8 view's stacks: e4m3 bytes and fp32 tile scales, the bf16 stacks and the (bf16) unfused
// shared MLP absent.
void validate_fp8_stacks(const MoeSpec& spec, const MoeWeightsView& v, int rows) {
  MK_CHECK(v.w13 == nullptr && v.w2 == nullptr,
           "an fp8 view (expert_dtype F8_E4M3) reads w13_fp8 / w2_fp8 and their scales; its bf16 "
           "w13 / w2 must be null, got w13 "
               << static_cast<const void*>(v.w13) << ", w2 " << static_cast<const void*>(v.w2));
  MK_CHECK(v.shared_w13 == nullptr,
           "an fp8 view holds the shared expert as its fused slots (fused_slots), not as the "
           "bf16 unfused MLP: shared_w13 / shared_w2 must be null");
  if (rows > 0) {
    const char* missing = v.w13_fp8 == nullptr     ? "w13_fp8"
                          : v.w13_scale == nullptr ? "w13_scale"
                          : v.w2_fp8 == nullptr    ? "w2_fp8"
                          : v.w2_scale == nullptr  ? "w2_scale"
                                                   : nullptr;
    MK_CHECK(missing == nullptr, missing << " of the fp8 view of " << spec.name << " is null ("
                                         << rows << " experts)");
  }
  MK_CHECK(aligned(v.w13_scale, alignof(float)) && aligned(v.w2_scale, alignof(float)),
           "the fp8 tile scales must be 4-byte aligned (fp32), got w13_scale "
               << v.w13_scale << ", w2_scale " << v.w2_scale);
  stack_stride(v.w13_scale_expert_stride, fp8_w13_scale_floats(spec), "w13_scale_expert_stride",
               "[2 ceil(I/128), ceil(H/128)] scale grid");
  stack_stride(v.w2_scale_expert_stride, fp8_w2_scale_floats(spec), "w2_scale_expert_stride",
               "[ceil(H/128), ceil(I/128)] scale grid");
}

// An MX view's stacks: packed rows and e8m0 bytes, whole 32-element blocks, the bf16 and fp8
// stacks and the unfused shared MLP absent.
void validate_mx_stacks(const MoeSpec& spec, const MoeWeightsView& v, int rows) {
  const int64_t H = spec.hidden, I = spec.expert_intermediate;
  const ExpertFormat f = v.mx_format;
  MK_CHECK(f == ExpertFormat::Mxfp4 || f == ExpertFormat::Mxfp8,
           "expected mx_format Bf16, Mxfp4 or Mxfp8, got " << expert_format_name(f));
  MK_CHECK(v.expert_dtype == DType::BF16,
           "an MX view (mx_format " << expert_format_name(f) << ") keeps expert_dtype BF16, got "
                                    << dtype_name(v.expert_dtype));
  MK_CHECK(v.w13 == nullptr && v.w2 == nullptr && v.w13_fp8 == nullptr && v.w2_fp8 == nullptr,
           "an MX view (mx_format " << expert_format_name(f)
                                    << ") reads w13_mx / w2_mx and their scales; its w13, w2, "
                                       "w13_fp8 and w2_fp8 must be null");
  MK_CHECK(v.shared_w13 == nullptr,
           "an MX view holds the shared expert as its fused slots (fused_slots), not as the "
           "bf16 unfused MLP: shared_w13 / shared_w2 must be null");
  MK_CHECK(H % kMxGroup == 0 && I % kMxGroup == 0,
           "MX experts need hidden and expert_intermediate multiples of "
               << kMxGroup << " (whole e8m0 blocks), got " << H << " and " << I);
  if (rows > 0) {
    const char* missing = v.w13_mx == nullptr         ? "w13_mx"
                          : v.w13_mx_scale == nullptr ? "w13_mx_scale"
                          : v.w2_mx == nullptr        ? "w2_mx"
                          : v.w2_mx_scale == nullptr  ? "w2_mx_scale"
                                                      : nullptr;
    MK_CHECK(missing == nullptr, missing << " of the " << expert_format_name(f) << " view of "
                                         << spec.name << " is null (" << rows << " experts)");
  }
  stack_stride(v.w13_expert_stride, 2 * I * static_cast<int64_t>(mx_row_bytes(f, H)),
               "w13_expert_stride", "[2I, H] packed rows", "bytes");
  stack_stride(v.w2_expert_stride, H * static_cast<int64_t>(mx_row_bytes(f, I)), "w2_expert_stride",
               "[H, I] packed rows", "bytes");
  stack_stride(v.w13_scale_expert_stride, 2 * I * (H / kMxGroup), "w13_scale_expert_stride",
               "[2I, H/32] e8m0 scales", "bytes");
  stack_stride(v.w2_scale_expert_stride, H * (I / kMxGroup), "w2_scale_expert_stride",
               "[H, I/32] e8m0 scales", "bytes");
}

// The stacks, their biases and the shared expert: what experts() and forward() read.
void validate_experts(const MoeSpec& spec, const MoeWeightsView& v) {
  const int E = spec.num_experts;
  const int64_t H = spec.hidden, I = spec.expert_intermediate;
  MK_CHECK(v.expert_offset >= 0 && v.expert_offset <= E, "expected expert_offset in [0, "
                                                             << E << "] for " << spec.name
                                                             << ", got " << v.expert_offset);
  const int count = v.local_experts(spec);
  MK_CHECK(count >= 0 && v.expert_offset + count <= E,
           "expert slice [" << v.expert_offset << ", " << v.expert_offset + count
                            << ") is outside the " << E << " experts of " << spec.name
                            << " (expert_offset " << v.expert_offset << ", expert_count "
                            << v.expert_count << ")");
  const bool has_shared = spec.shared_kind != SharedKind::None && spec.shared_intermediate > 0;
  MK_CHECK(v.fused_slots == 0 || (has_shared && v.fused_slots == spec.shared_slots()),
           "expected fused_slots 0 or " << spec.shared_slots() << " (the shared slots of "
                                        << spec.name << "), got " << v.fused_slots);
  MK_CHECK((v.shared_w13 == nullptr) == (v.shared_w2 == nullptr),
           "the unfused shared MLP needs shared_w13 and shared_w2, got only "
               << (v.shared_w13 != nullptr ? "shared_w13" : "shared_w2"));
  MK_CHECK(has_shared || v.shared_w13 == nullptr,
           spec.name << " has no shared expert, but shared_w13/shared_w2 are set");
  const int rows = count + v.fused_slots;
  MK_CHECK(v.expert_dtype == DType::BF16 || v.expert_dtype == DType::F8_E4M3,
           "expected expert_dtype BF16 or F8_E4M3 (fp8 block-scale), got "
               << dtype_name(v.expert_dtype));
  MK_CHECK(v.mx() || (v.w13_mx == nullptr && v.w13_mx_scale == nullptr && v.w2_mx == nullptr &&
                      v.w2_mx_scale == nullptr),
           "the view's mx_format is Bf16, but its MX stacks (w13_mx, w2_mx, scales) are set: set "
           "mx_format = Mxfp4 or Mxfp8 to run them");
  if (v.mx()) {
    validate_mx_stacks(spec, v, rows);
  } else if (v.fp8()) {
    validate_fp8_stacks(spec, v, rows);
  } else {
    MK_CHECK(v.w13_fp8 == nullptr && v.w2_fp8 == nullptr && v.w13_scale == nullptr &&
                 v.w2_scale == nullptr,
             "the view's expert_dtype is BF16, but its fp8 stacks (w13_fp8, w2_fp8, scales) "
             "are set: set expert_dtype = F8_E4M3 to run them");
    if (rows > 0) {
      MK_CHECK(v.w13 != nullptr, "w13 of " << spec.name << " is null (" << rows << " experts)");
      MK_CHECK(v.w2 != nullptr, "w2 of " << spec.name << " is null (" << rows << " experts)");
    }
  }
  if (!v.mx()) {
    stack_stride(v.w13_expert_stride, 2 * I * H, "w13_expert_stride", "[2I, H]");
    stack_stride(v.w2_expert_stride, H * I, "w2_expert_stride", "[H, I]");
  }
  if (spec.has_expert_bias && count > 0) {
    MK_CHECK(v.b13 != nullptr && v.b2 != nullptr, spec.name << " has expert biases (gpt-oss) but "
                                                            << (v.b13 == nullptr ? "b13" : "b2")
                                                            << " is null");
    stack_stride(v.b13_expert_stride, 2 * I, "b13_expert_stride", "[2I]");
    stack_stride(v.b2_expert_stride, H, "b2_expert_stride", "[H]");
  }
}

}  // namespace

void validate_view(const MoeSpec& spec, const MoeWeightsView& v, ViewUse use) {
  MK_CHECK(v.location == Location::Host || v.location == Location::Device,
           "expected view location host or device, got " << static_cast<int>(v.location));
  if (use != ViewUse::Experts) validate_router(spec, v, use);
  if (use == ViewUse::Layer || use == ViewUse::Experts) validate_experts(spec, v);
}

ExpertView view_expert(const MoeSpec& spec, const MoeWeightsView& v, int local_row) {
  const int64_t H = spec.hidden, I = spec.expert_intermediate;
  const int64_t s13 = v.w13_expert_stride == 0 ? 2 * I * H : v.w13_expert_stride;
  const int64_t s2 = v.w2_expert_stride == 0 ? H * I : v.w2_expert_stride;
  ExpertView ex;
  if (v.mx()) {
    const ExpertFormat f = v.mx_format;
    const int64_t r13 = 2 * I * static_cast<int64_t>(mx_row_bytes(f, H));
    const int64_t r2 = H * static_cast<int64_t>(mx_row_bytes(f, I));
    const int64_t m13 = v.w13_expert_stride == 0 ? r13 : v.w13_expert_stride;
    const int64_t m2 = v.w2_expert_stride == 0 ? r2 : v.w2_expert_stride;
    const int64_t g13 =
        v.w13_scale_expert_stride == 0 ? 2 * I * (H / kMxGroup) : v.w13_scale_expert_stride;
    const int64_t g2 =
        v.w2_scale_expert_stride == 0 ? H * (I / kMxGroup) : v.w2_scale_expert_stride;
    ex.w13_mx = v.w13_mx + local_row * m13;
    ex.w13_mx_scale = v.w13_mx_scale + local_row * g13;
    ex.w2_mx = v.w2_mx + local_row * m2;
    ex.w2_mx_scale = v.w2_mx_scale + local_row * g2;
    ex.mx_format = f;
  } else if (v.fp8()) {
    const int64_t t13 = v.w13_scale_expert_stride == 0 ? fp8_w13_scale_floats(spec)
                                                       : v.w13_scale_expert_stride;
    const int64_t t2 =
        v.w2_scale_expert_stride == 0 ? fp8_w2_scale_floats(spec) : v.w2_scale_expert_stride;
    ex.w13_fp8 = v.w13_fp8 + local_row * s13;
    ex.w13_scale = v.w13_scale + local_row * t13;
    ex.w2_fp8 = v.w2_fp8 + local_row * s2;
    ex.w2_scale = v.w2_scale + local_row * t2;
  } else {
    ex.w13 = v.w13 + local_row * s13;
    ex.w2 = v.w2 + local_row * s2;
  }
  // the fused slots carry no biases (no model with expert biases has a shared expert)
  if (spec.has_expert_bias && local_row < v.local_experts(spec) && v.b13 != nullptr) {
    const int64_t sb13 = v.b13_expert_stride == 0 ? 2 * I : v.b13_expert_stride;
    const int64_t sb2 = v.b2_expert_stride == 0 ? H : v.b2_expert_stride;
    ex.b13 = v.b13 + local_row * sb13;
    ex.b2 = v.b2 + local_row * sb2;
  }
  return ex;
}

ViewLayerWeights::ViewLayerWeights(const MoeSpec& spec, const MoeWeightsView& view, int layer,
                                   ViewUse use)
    : LayerWeights(spec, layer), view_(view) {
  MK_CHECK(view.location == Location::Host,
           "ViewLayerWeights runs the CPU backends on host weights, got a device view");
  validate_view(spec, view, use);
  if (view.fp8()) expert_format_ = ExpertFormat::Fp8Block;
  if (view.mx()) expert_format_ = view.mx_format;
}

const float* ViewLayerWeights::router_bias() const {
  return spec_.has_router_bias ? view_.router_bias : nullptr;
}

const float* ViewLayerWeights::correction_bias() const {
  return spec_.has_correction_bias ? view_.correction_bias : nullptr;
}

ExpertView ViewLayerWeights::expert(int e) const {
  const int E = spec_.num_experts;
  const int count = view_.local_experts(spec_);
  if (e >= view_.expert_offset && e < view_.expert_offset + count) {
    return view_expert(spec_, view_, e - view_.expert_offset);
  }
  MK_CHECK(e >= E && e < E + view_.fused_slots,
           "expert " << e << " of " << spec_.name << " is not in this view: it holds experts ["
                     << view_.expert_offset << ", " << view_.expert_offset + count << ")"
                     << (view_.fused_slots > 0 ? " and the fused slots [" : "")
                     << (view_.fused_slots > 0 ? std::to_string(E) + ", " +
                                                     std::to_string(E + view_.fused_slots) + ")"
                                               : std::string()));
  return view_expert(spec_, view_, count + (e - E));
}

int ViewLayerWeights::materialised_experts() const {
  return view_.local_experts(spec_) + view_.fused_slots;
}

}  // namespace moekit
