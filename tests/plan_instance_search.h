// For each expert-kernel instance (plan::expert_kernels()), a configuration whose plan launches
// it: a scaled-down spec of the GPU tests (small_spec.h), a token count, a fusion mode and plan
// overrides. The CPU test (test_plan_instances.cpp) fails naming an instance no configuration
// reaches; the GPU test (cuda/test_layer_instances.cpp) runs each instance's configuration.
//
// The search, in this order, takes the first hit: the rules' defaults, then one setting forced,
// then two; within each, the shapes in the order below (cheap first), the token counts ascending,
// fuse auto before off.
#pragma once

#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/layer.h"
#include "moekit/plan.h"
#include "small_spec.h"

namespace moekit::test {

struct SmallShape {
  const char* model;
  int hidden, experts, inter;
};

// The shapes the GPU layer tests run (tests/cuda/test_layer_*.cpp).
inline const std::vector<SmallShape> kSearchShapes = {
    {"deepseek-v3", 128, 16, 64},      {"qwen2-57b-a14b", 128, 16, 64},
    {"gpt-oss-120b", 128, 16, 64},     {"deepseek-v2-lite", 128, 16, 64},
    {"qwen3-30b-a3b", 256, 16, 128},   {"gpt-oss-120b", 256, 16, 128},
    {"mixtral-8x7b", 256, 8, 128},     {"deepseek-v3", 256, 32, 128},
    {"deepseek-v3", 256, 16, 256},     {"qwen3-30b-a3b", 256, 16, 768},
    {"deepseek-v3", 256, 16, 1536},    {"deepseek-v3", 128, 16, 2048},
    {"deepseek-v3", 256, 16, 2048},    {"deepseek-v3", 128, 16, 2112},
    {"gpt-oss-120b", 256, 4, 2560},    {"qwen2-57b-a14b", 256, 16, 2560},
    {"gpt-oss-120b", 256, 16, 2880},   {"qwen3-30b-a3b", 2048, 16, 768},
    {"qwen3-30b-a3b", 2240, 16, 768},  {"deepseek-v3", 2240, 16, 256},
    {"deepseek-v3", 2240, 16, 1536},   {"deepseek-v3", 2240, 16, 2048},
    {"qwen2-57b-a14b", 2240, 16, 2560}, {"mixtral-8x7b", 256, 8, 14336},
    {"mixtral-8x7b", 256, 16, 14336},
};

inline const std::vector<int> kSearchTokens = {1, 2, 7, 9, 16, 32, 40, 64, 128, 257, 300};

// One forced setting of the plan: its text ("down_tail_percent=50") and how it is applied.
struct PlanSetting {
  std::string text;
  std::function<void(plan::PlanOverrides&)> apply;
  int knob;  // settings of one knob share it (two settings of one knob are never combined)
};

// Each knob that picks an instance forced on and off, and the stream forced to each family.
inline std::vector<PlanSetting> plan_settings() {
  using plan::PlanOverrides;
  constexpr int kAlways = 1 << 20;  // "from/up to this many tokens": every batch
  struct Knob {
    const char* name;
    int PlanOverrides::*field;
    int off, on;
  };
  const Knob knobs[] = {
      {"down_split_tokens", &PlanOverrides::down_split_tokens, 0, kAlways},
      {"down_deep_tokens", &PlanOverrides::down_deep_tokens, 0, kAlways},
      {"one_token_rings", &PlanOverrides::one_token_rings, 0, 1},
      {"weights_only_tokens", &PlanOverrides::weights_only_tokens, 0, kAlways},
      {"l2_keep_from_tokens", &PlanOverrides::l2_keep_from_tokens, 0, 1},
      {"down_tail_percent", &PlanOverrides::down_tail_percent, 0, 50},
      {"half_items_per_cta", &PlanOverrides::half_items_per_cta, 0, 2},
      {"self_route_tokens", &PlanOverrides::self_route_tokens, 0, 1},
      {"task16_from", &PlanOverrides::task16_from, 0, 1},
      {"shared_dense_tokens", &PlanOverrides::shared_dense_tokens, 0, 1},
  };
  std::vector<PlanSetting> out;
  int knob = 0;
  for (const Knob& k : knobs) {
    for (int v : {k.off, k.on}) {
      const auto field = k.field;
      out.push_back({std::string(k.name) + "=" + std::to_string(v),
                     [field, v](PlanOverrides& o) { o.*field = v; }, knob});
    }
    ++knob;
  }
  for (plan::Stream s : {plan::Stream::Bulk, plan::Stream::Registers,
                         plan::Stream::RegistersEarlyActs}) {
    out.push_back({std::string("stream=") + plan::stream_name(s),
                   [s](PlanOverrides& o) { o.stream = s; }, knob});
  }
  return out;
}

struct InstanceCase {
  SmallShape shape;
  int tokens = 0;
  FuseShared fuse = FuseShared::Auto;
  plan::PlanOverrides overrides;
  std::string settings;  // "defaults" or the forced settings, ", "-joined
  DType experts = DType::BF16;  // the layer's experts: BF16, or F8_E4M3 for the fp8 instances
  ExpertFormat mx = ExpertFormat::Bf16;  // Mxfp4 / Mxfp8 for the MX instances

  std::string text() const {
    std::ostringstream os;
    os << shape.model << " H=" << shape.hidden << " E=" << shape.experts << " I=" << shape.inter
       << " T=" << tokens << " fuse=" << fuse_shared_name(fuse)
       << (experts == DType::F8_E4M3 ? " fp8" : "")
       << (mx != ExpertFormat::Bf16 ? std::string(" ") + expert_format_name(mx) : "") << " ("
       << settings << ")";
    return os.str();
  }
};

// Whether plan `p` launches instance `kernel` (an index into expert_kernels()).
inline bool plan_launches(const plan::LayerPlan& p, int kernel) {
  for (const plan::ExpertLaunch& l : p.experts) {
    if (l.kernel == kernel) return true;
  }
  return false;
}

// For each row of expert_kernels(), the first configuration (the order above) whose plan on the
// "sm90" profile launches it; nullopt where none does. Computed once.
inline const std::vector<std::optional<InstanceCase>>& find_instance_cases() {
  static const std::vector<std::optional<InstanceCase>> found = [] {
    const int n = static_cast<int>(plan::expert_kernels().size());
    std::vector<std::optional<InstanceCase>> out(n);
    int missing = n;
    const plan::DeviceInfo device = plan::device_profile("sm90");
    std::vector<MoeSpec> specs;
    for (const SmallShape& s : kSearchShapes) {
      specs.push_back(small_spec(s.model, s.hidden, s.experts, s.inter));
    }
    // the override sets: none, each setting, each pair of settings of two knobs
    const std::vector<PlanSetting> settings = plan_settings();
    std::vector<std::vector<const PlanSetting*>> sets{{}};
    for (const PlanSetting& a : settings) sets.push_back({&a});
    for (size_t i = 0; i < settings.size(); ++i) {
      for (size_t j = i + 1; j < settings.size(); ++j) {
        if (settings[i].knob != settings[j].knob) sets.push_back({&settings[i], &settings[j]});
      }
    }
    for (const auto& set : sets) {
      plan::PlanOverrides o;
      std::string text = set.empty() ? "defaults" : "";
      for (const PlanSetting* s : set) {
        s->apply(o);
        text += (text.empty() ? "" : ", ") + s->text;
      }
      for (size_t si = 0; si < specs.size() && missing > 0; ++si) {
        // fp8 (the fp8 instances): whole 128 x 128 tiles, the shared expert fused, the bulk
        // kernels (the prefill path off: its fp8 GEMMs are not instances of this table), a
        // family that publishes fp8 block-scale checkpoints (not gpt-oss, whose interleaved
        // naming has no fp8 form: the GPU test writes the case's checkpoint)
        const MoeSpec& sp = specs[si];
        const bool fp8_shape = sp.hidden % 128 == 0 && sp.expert_intermediate % 128 == 0 &&
                               sp.activation != Activation::SwigluOaiInterleaved &&
                               (!o.stream || *o.stream == plan::Stream::Bulk);
        // MX (the MX instances): gpt-oss in MXFP4 (its published form), the others in MXFP8;
        // the bulk kernels, the shared expert fused
        const bool mx_shape = !o.stream || *o.stream == plan::Stream::Bulk;
        const ExpertFormat mx_format = sp.activation == Activation::SwigluOaiInterleaved
                                           ? ExpertFormat::Mxfp4
                                           : ExpertFormat::Mxfp8;
        for (int form = 0; form < 3; ++form) {
          const DType dt = form == 1 ? DType::F8_E4M3 : DType::BF16;
          const ExpertFormat mf = form == 2 ? mx_format : ExpertFormat::Bf16;
          if (form == 1 && !fp8_shape) continue;
          if (form == 2 && !mx_shape) continue;
          plan::PlanOverrides od = o;
          if (dt == DType::F8_E4M3) od.grouped_from_tokens = 0;
          for (int t : kSearchTokens) {
            for (FuseShared fuse : {FuseShared::Auto, FuseShared::Off}) {
              if (fuse == FuseShared::Off && sp.shared_intermediate == 0) continue;
              if (fuse == FuseShared::Off && form != 0) continue;
              const plan::LayerPlan p = plan::plan_layer(sp, t, fuse, od, device, dt, mf);
              for (const plan::ExpertLaunch& l : p.experts) {
                if (out[l.kernel]) continue;
                out[l.kernel] = InstanceCase{kSearchShapes[si], t, fuse, od, text, dt, mf};
                --missing;
              }
            }
          }
        }
      }
      if (missing == 0) break;
    }
    return out;
  }();
  return found;
}

}  // namespace moekit::test
