// The plan's names, its one-line-per-kernel text, its JSON, the device profiles and the
// environment's overrides (moekit/plan.h).
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "moekit/error.h"
#include "moekit/plan.h"
#include "plan/expert_kernels.h"
#include "plan/grouped_gemm_kernels.h"

namespace moekit::plan {

const char* gemm_name(Gemm g) { return g == Gemm::GateUp ? "gate_up" : "down"; }

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::Bulk:
      return "bulk";
    case Stream::Registers:
      return "regs";
    case Stream::RegistersEarlyActs:
      return "regs-early";
    case Stream::Grouped:
      return "grouped";
  }
  return "?";
}

std::optional<Stream> parse_stream(const std::string& s) {
  for (Stream v : {Stream::Bulk, Stream::Registers, Stream::RegistersEarlyActs, Stream::Grouped}) {
    if (s == stream_name(v)) return v;
  }
  return std::nullopt;
}

const char* ring_name(Ring r) {
  switch (r) {
    case Ring::Standard:
      return "standard";
    case Ring::Deep:
      return "deep";
    case Ring::OneTokenNarrow:
      return "one-token-narrow";
    case Ring::OneToken:
      return "one-token";
    case Ring::WeightsOnly:
      return "weights-only";
    case Ring::WeightsOnlyDeep:
      return "weights-only-deep";
    case Ring::Fp8OneToken:
      return "fp8-one-token";
    case Ring::Fp8OneTokenDeep:
      return "fp8-one-token-deep";
    case Ring::MxWeightsOnly:
      return "mx-weights-only";
  }
  return "?";
}

std::span<const ExpertKernel> expert_kernels() { return kExpertKernels; }

int find_expert_kernel(const ExpertKernel& fields) {
  for (int i = 0; i < kNumExpertKernels; ++i) {
    if (same_fields(kExpertKernels[i], fields)) return i;
  }
  return -1;
}

std::string describe(const ExpertKernel& k) {
  std::ostringstream os;
  if (k.name[0] != '\0') os << k.name << ": ";
  os << gemm_name(k.gemm) << ' ' << stream_name(k.stream) << " n_tiles=" << k.n_tiles;
  if (k.stream == Stream::Bulk) {
    os << " ring=" << ring_name(k.ring);
    if (k.split_rows) os << " split_rows";
    if (k.l2_keep) os << " l2_keep";
    if (k.down_tail) os << " down_tail";
    if (k.half_items) os << " half_items";
    if (k.self_route) os << " self_route";
    if (k.fp8) os << " fp8";
    if (k.mx != ExpertFormat::Bf16) os << ' ' << expert_format_name(k.mx);
    if (k.consumer_groups) os << " consumer_groups";
  } else {
    os << " unroll=" << k.unroll;
  }
  os << " warps=" << k.warps << " ctas_per_sm=" << k.ctas_per_sm;
  return os.str();
}

const char* grouped_schedule_name(GroupedSchedule s) {
  return s == GroupedSchedule::Pingpong ? "pingpong" : "coop";
}

std::span<const GroupedGemmKernel> grouped_gemm_kernels() { return kGroupedGemmKernels; }

int find_grouped_gemm(const std::string& name) { return grouped_gemm_row(name); }

std::string describe(const GroupedGemmKernel& k) {
  std::ostringstream os;
  os << k.name << ": " << (k.fp8 ? "fp8" : "bf16") << " tile " << k.tile_m << 'x' << k.tile_n
     << 'x' << k.tile_k << ' ' << grouped_schedule_name(k.schedule) << " cluster " << k.cluster_m
     << 'x' << k.cluster_n;
  return os.str();
}

DeviceInfo device_profile(const std::string& name) {
  if (name == "sm90") return DeviceInfo{"sm90", 132, tuning::Arch::Sm90};
  if (name == "h100") {
    return with_measured_facts(DeviceInfo{"NVIDIA H100 80GB HBM3", 132, tuning::Arch::Sm90});
  }
  if (name == "sm100") return DeviceInfo{"sm100", 148, tuning::Arch::Sm100};
  MK_FAIL("unknown device profile '" << name << "' (expected sm90, h100 or sm100)");
}

DeviceInfo with_measured_facts(DeviceInfo d) {
  // why the H100 80GB HBM3 alone: there the 128-row cooperative instance leads the 64-row
  // ping-pong from 256 routed rows an expert, where the H200 has the ping-pong ahead
  // (docs/decisions/experts_grouped_gemms.md)
  if (d.name == "NVIDIA H100 80GB HBM3") d.grouped_tile128_from_rows = 256;
  return d;
}

namespace {

// The integer in environment variable `name`, in [lo, hi] (`what` names the expected value), or
// `fallback` when it is unset or empty.
int env_int(const char* name, int fallback, long lo, long hi, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  const std::string s(v);
  char* end = nullptr;
  const long n = std::strtol(s.c_str(), &end, 10);
  const bool digits = s.find_first_not_of("0123456789") == std::string::npos;
  MK_CHECK(digits && *end == '\0' && n >= lo && n <= hi,
           name << "='" << s << "' (expected " << what << ")");
  return static_cast<int>(n);
}

constexpr long kMaxCount = 1 << 20;
constexpr const char* kTokens = "a token count, 0 (never) to 1048576";
constexpr const char* kPercent = "a percentage, 0 to 100";

}  // namespace

PlanOverrides plan_overrides_from_env(PlanOverrides o) {
  if (const char* v = std::getenv("MOEKIT_EXPERTS_KERNEL"); v != nullptr && v[0] != '\0') {
    const auto s = parse_stream(v);
    MK_CHECK(s.has_value(),
             "MOEKIT_EXPERTS_KERNEL='" << v << "' (expected bulk, regs, regs-early or grouped)");
    o.stream = s;
  }
  o.grouped_from_tokens =
      env_int("MOEKIT_EXPERTS_GROUPED_FROM", o.grouped_from_tokens, 0, kMaxCount, kTokens);
  if (const char* v = std::getenv("MOEKIT_EXPERTS_GROUPED_GEMM"); v != nullptr && v[0] != '\0') {
    // one instance for both GEMMs, or "gate_up_instance,down_instance"
    const std::string s(v);
    const size_t comma = s.find(',');
    const std::string up = s.substr(0, comma);
    const std::string down = comma == std::string::npos ? up : s.substr(comma + 1);
    for (const std::string& name : {up, down}) {
      if (find_grouped_gemm(name) >= 0) continue;
      std::string names;
      for (const GroupedGemmKernel& k : grouped_gemm_kernels()) names += std::string(" ") + k.name;
      MK_FAIL("MOEKIT_EXPERTS_GROUPED_GEMM='" << s << "': no grouped GEMM instance '" << name
                                               << "' (expected one of" << names
                                               << ", or two joined by a comma: gate/up, down)");
    }
    o.grouped_gate_up = find_grouped_gemm(up);
    o.grouped_down = find_grouped_gemm(down);
  }
  o.grouped_mx_chunk =
      env_int("MOEKIT_EXPERTS_MX_CHUNK", o.grouped_mx_chunk, 1, kMaxCount, "an expert count, >= 1");
  {
    constexpr const char* kTiles = "0 (widen), 64 or 128 (the packed GEMM's token tile)";
    const int tile = env_int("MOEKIT_EXPERTS_MX_GEMM", -1, 0, 128, kTiles);
    MK_CHECK(tile <= 0 || tile == 64 || tile == 128,
             "MOEKIT_EXPERTS_MX_GEMM='" << tile << "' (expected " << kTiles << ")");
    if (tile >= 0) o.grouped_mx_tile = tile;
  }
  o.gate_up_tail_percent = env_int("MOEKIT_EXPERTS_TAIL", o.gate_up_tail_percent, 0, 100, kPercent);
  o.shared_first_tokens =
      env_int("MOEKIT_EXPERTS_SHARED_FIRST", o.shared_first_tokens, 0, kMaxCount, kTokens);
  o.whole_tile_tokens =
      env_int("MOEKIT_EXPERTS_WHOLE_TILES", o.whole_tile_tokens, 0, kMaxCount, kTokens);
  o.down_split_tokens =
      env_int("MOEKIT_EXPERTS_DOWN_SPLIT", o.down_split_tokens, 0, kMaxCount, kTokens);
  o.down_deep_tokens =
      env_int("MOEKIT_EXPERTS_DOWN_DEEP", o.down_deep_tokens, 0, kMaxCount, kTokens);
  o.one_token_rings = env_int("MOEKIT_EXPERTS_ONE_TOKEN_RING", o.one_token_rings, 0, 1, "0 or 1");
  o.weights_only_tokens =
      env_int("MOEKIT_EXPERTS_L2_ACTS", o.weights_only_tokens, 0, kMaxCount, kTokens);
  o.l2_keep_from_tokens =
      env_int("MOEKIT_EXPERTS_L2_KEEP_FROM", o.l2_keep_from_tokens, 0, kMaxCount, kTokens);
  o.down_tail_percent = env_int("MOEKIT_EXPERTS_DOWN_TAIL", o.down_tail_percent, 0, 100, kPercent);
  o.half_items_per_cta =
      env_int("MOEKIT_EXPERTS_HALF_ITEMS", o.half_items_per_cta, 0, 16, "items per CTA, 0 to 16");
  o.self_route_tokens =
      env_int("MOEKIT_EXPERTS_SELF_ROUTE", o.self_route_tokens, 0, 1, "a token count, 0 or 1");
  o.task16_from = env_int("MOEKIT_EXPERTS_TASK16", o.task16_from, 0, kMaxCount,
                          "routed tokens per expert, 0 (never) to 1048576");
  o.shared_dense_tokens =
      env_int("MOEKIT_SHARED_DENSE", o.shared_dense_tokens, 0, kMaxCount, kTokens);
  o.mx_groups_tokens =
      env_int("MOEKIT_EXPERTS_MX_GROUPS", o.mx_groups_tokens, 0, kMaxCount, kTokens);
  o.pdl = env_int("MOEKIT_PDL", o.pdl ? 1 : 0, 0, 1, "0 or 1") != 0;
  o.print = env_int("MOEKIT_PRINT_CONFIG", o.print ? 1 : 0, 0, 1, "0 or 1") != 0;
  return o;
}

namespace {

std::string launch_text(const LayerPlan& p, const ExpertLaunch& l) {
  const ExpertKernel& k = expert_kernels()[l.kernel];
  std::ostringstream os;
  os << k.name << " grid " << l.grid;
  if (k.gemm == Gemm::GateUp && k.stream == Stream::Bulk)
    os << " tail " << l.dynamic_tail_percent << '%';
  if (l.half_items_per_cta > 0 && k.half_items) os << " half-items " << l.half_items_per_cta;
  if (l.early_shared > 0) os << " shared-first " << l.early_shared;
  if (l.down_tail_percent > 0 && k.down_tail) os << " down-tail " << l.down_tail_percent << '%';
  if (l.combine) os << " combine";
  (void)p;
  return os.str();
}

}  // namespace

std::string describe(const LayerPlan& p) {
  std::ostringstream os;
  os << p.model << " T=" << p.tokens << ' ' << p.device.name << ": "
     << (p.fused ? "fused" : "unfused") << " (" << p.fuse_reason << "), slots " << p.slots
     << ", chunk " << p.chunk << ", " << stream_name(p.stream) << (p.fp8 ? ", fp8 w8a8" : "")
     << (p.mx == ExpertFormat::Mxfp8   ? ", mxfp8 w8a16"
         : p.mx == ExpertFormat::Mxfp4 ? ", mxfp4 w4a16"
                                       : "")
     << (p.pdl ? "" : ", no PDL") << '\n';
  if (p.dense_shared) os << "  shared   dense cuBLAS GEMMs (gate/up, activation, down)\n";
  if (p.fp8 && p.stream == Stream::Bulk) {
    os << "  quant    x (before the router) and h (before down) to e4m3 per 128 channels\n";
  }
  os << "  router   " << tuning::describe(p.router.config) << " ("
     << tuning::source_name(p.router.source) << ")\n";
  os << "  routing  "
     << (!p.routing_kernel    ? "none: gate/up self-routes"
         : p.routing_dispatch ? "routing + dispatch kernel"
                              : "routing kernel (the prefill path permutes the pairs itself)")
     << '\n';
  if (p.stream == Stream::Grouped) {
    os << "  experts  grouped GEMM path: plan, permute, gate/up grouped GEMM "
       << grouped_gemm_kernels()[p.grouped_gate_up].name << ", activation, down grouped GEMM "
       << grouped_gemm_kernels()[p.grouped_down].name << ", combine\n";
    if (p.grouped_mx_chunk > 0) {
      os << "  widen    " << expert_format_name(p.mx) << " experts to bf16, " << p.grouped_mx_chunk
         << " at a time (" << p.grouped_mx_runs << " runs before each GEMM's groups)\n";
    }
    if (p.grouped_mx_tile > 0) {
      os << "  packed   " << expert_format_name(p.mx) << " GEMMs on the packed bytes, tiles of "
         << p.grouped_mx_tile << " tokens (in place of the CUTLASS instances)\n";
    }
  }
  for (const ExpertLaunch& l : p.experts) {
    std::string role = l.role;
    role.resize(std::max<size_t>(role.size(), 8), ' ');
    os << "  " << role << ' ' << launch_text(p, l) << '\n';
  }
  os << "  launches " << own_launches(p) << (p.dense_shared ? " + cuBLAS" : "") << '\n';
  return os.str();
}

std::string summary(const LayerPlan& p) {
  std::string text = describe(p), out;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    const size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos) {
      if (!out.empty()) out += " | ";
      out += line.substr(first);
    }
    begin = end + 1;
  }
  return out;
}

std::string to_json(const LayerPlan& p) {
  nlohmann::ordered_json j;
  j["model"] = p.model;
  j["tokens"] = p.tokens;
  j["device"] = {{"name", p.device.name},
                 {"sms", p.device.sms},
                 {"arch", tuning::arch_name(p.device.arch)},
                 {"grouped_tile128_from_rows", p.device.grouped_tile128_from_rows}};
  j["fused"] = p.fused;
  j["fuse_reason"] = p.fuse_reason;
  j["slots"] = p.slots;
  j["chunk"] = p.chunk;
  j["stream"] = stream_name(p.stream);
  j["experts_dtype"] = p.fp8                         ? "F8_E4M3"
                       : p.mx == ExpertFormat::Mxfp8 ? "MXFP8"
                       : p.mx == ExpertFormat::Mxfp4 ? "MXFP4"
                                                     : "BF16";
  j["pdl"] = p.pdl;
  j["router"] = {{"config", tuning::describe(p.router.config)},
                 {"source", tuning::source_name(p.router.source)}};
  j["routing_kernel"] = p.routing_kernel;
  j["routing_dispatch"] = p.routing_dispatch;
  j["dense_shared"] = p.dense_shared;
  if (p.stream == Stream::Grouped) {
    j["grouped_gate_up"] = grouped_gemm_kernels()[p.grouped_gate_up].name;
    j["grouped_down"] = grouped_gemm_kernels()[p.grouped_down].name;
  }
  if (p.grouped_mx_chunk > 0) {
    j["grouped_mx_chunk"] = p.grouped_mx_chunk;
    j["grouped_mx_runs"] = p.grouped_mx_runs;
  }
  if (p.grouped_mx_tile > 0) j["grouped_mx_tile"] = p.grouped_mx_tile;
  nlohmann::ordered_json experts = nlohmann::ordered_json::array();
  for (const ExpertLaunch& l : p.experts) {
    experts.push_back({{"role", l.role},
                       {"kernel", expert_kernels()[l.kernel].name},
                       {"grid", l.grid},
                       {"dynamic_tail_percent", l.dynamic_tail_percent},
                       {"half_items_per_cta", l.half_items_per_cta},
                       {"down_tail_percent", l.down_tail_percent},
                       {"early_shared", l.early_shared},
                       {"combine", l.combine}});
  }
  j["experts"] = experts;
  j["launches"] = own_launches(p);
  return j.dump();
}

}  // namespace moekit::plan
