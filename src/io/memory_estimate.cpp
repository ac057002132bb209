// Host and device memory estimates (include/moekit/memory_estimate.h) and the checks built on
// them, for the CLI and the CPU API alike.
#include "moekit/memory_estimate.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "io/mem_available.h"
#include "moekit/error.h"
#include "moekit/weights.h"
#include "plan/expert_rules.h"

namespace moekit {
namespace {

// Below this a forward's check costs more than the memory it guards.
constexpr size_t kCheckFrom = size_t{256} << 20;
constexpr size_t kGpuBlasWorkspace = size_t{32} << 20;  // src/cuda/layer/shared_dense.cu

std::string gb(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

// Saturating: a hostile spec's product must not wrap to a small number.
size_t mul(size_t a, size_t b) {
  size_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}
size_t add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

// The address space this process may still map under RLIMIT_AS, SIZE_MAX when unlimited.
size_t address_space_left() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  if (!(statm >> pages)) return SIZE_MAX;
  const size_t used = pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return lim.rlim_cur > used ? static_cast<size_t>(lim.rlim_cur) - used : 0;
}

}  // namespace

size_t host_bytes_needed(const MoeSpec& spec, int tokens, bool fused) {
  MK_CHECK(tokens >= 0, "expected tokens >= 0, got " << tokens);
  const size_t routed = std::min<size_t>(static_cast<size_t>(spec.num_experts),
                                         static_cast<size_t>(tokens) * spec.top_k);
  const size_t slots = fused ? static_cast<size_t>(spec.shared_slots()) : 0;
  // Biases are fp32: router/correction bias [E], expert biases [2I + H] per expert.
  const size_t expert_bias =
      spec.has_expert_bias ? (2 * static_cast<size_t>(spec.expert_intermediate) + spec.hidden) * 4
                           : 0;
  return add(spec.router_bytes() + spec.shared_bytes() + 2 * static_cast<size_t>(spec.num_experts) * 4,
             mul(routed + slots, add(spec.expert_bytes(), expert_bias)));
}

HostMemoryEstimate host_memory_estimate(const MoeSpec& spec, int tokens, bool fused) {
  HostMemoryEstimate e;
  e.weights = host_bytes_needed(spec, tokens, fused);
  const size_t T = static_cast<size_t>(tokens), H = spec.hidden, I = spec.expert_intermediate;
  const size_t C = spec.router_columns();
  const size_t slots = static_cast<size_t>(spec.top_k) + (fused ? spec.shared_slots() : 0);
  const bool unfused_shared = !fused && spec.shared_kind != SharedKind::None;
  const size_t pairs = add(mul(T, slots), unfused_shared ? T : 0);
  e.inputs = mul(mul(T, H), 2);
  // Fast backend (src/cpu/fast/fast_layer.cpp and fast_experts.cpp), an upper bound of the
  // reference's too: y fp32, x as double and float, logits double and float, routing ids and
  // weights, per pair the token, weight and two row pointers, the gate/up block of 2I floats and
  // the down row of H floats.
  size_t a = mul(mul(T, H), 4 + 8 + 4);
  a = add(a, mul(mul(T, C), 12));
  a = add(a, add(mul(mul(T, slots), 8), mul(T, 4)));
  a = add(a, mul(pairs, 24));
  a = add(a, mul(mul(mul(T, slots), I), 8));
  if (unfused_shared) a = add(a, mul(mul(T, spec.shared_intermediate), 8));
  a = add(a, mul(mul(pairs, H), 4));
  e.activations = a;
  return e;
}

HostMemoryAvailable host_memory_available() {
  HostMemoryAvailable a{mem_available_bytes(), "MemAvailable"};
  const size_t as_left = address_space_left();
  if (as_left != SIZE_MAX && (a.bytes == 0 || as_left < a.bytes)) a = {as_left, "RLIMIT_AS"};
  return a;
}

void check_host_memory(const HostMemoryEstimate& need, const std::string& what) {
  const HostMemoryAvailable avail = host_memory_available();
  if (avail.bytes == 0 && std::string(avail.source) == "MemAvailable") return;  // unknown
  // Summed saturating: each part may already be SIZE_MAX for a hostile spec.
  const size_t total = add(add(need.weights, need.inputs), add(need.activations, need.workspace));
  MK_CHECK(total <= avail.bytes,
           "needs " << gb(total) << " of host memory for " << what << ": weights "
                    << gb(need.weights) << ", inputs " << gb(need.inputs) << ", activations "
                    << gb(need.activations) << ", workspace " << gb(need.workspace) << "; "
                    << gb(avail.bytes) << " available (" << avail.source << ")");
}

void check_host_memory(const MoeSpec& spec, int tokens, bool fused) {
  const size_t experts =
      std::min<size_t>(spec.num_experts, static_cast<size_t>(std::max(tokens, 0)) * spec.top_k);
  check_host_memory(host_memory_estimate(spec, tokens, fused),
                    spec.name + " (" + std::to_string(tokens) + " tokens, " +
                        std::to_string(experts) + " experts" +
                        (fused ? " + fused shared slots" : "") + ")");
}

void check_forward_memory(const LayerWeights& w, int tokens, bool fused) {
  if (tokens <= 0) return;
  const MoeSpec& spec = w.spec();
  HostMemoryEstimate need = host_memory_estimate(spec, tokens, fused);
  need.inputs = 0;  // the caller's, already allocated
  // Weights still to be materialised: at most the routed experts and fused slots not built yet.
  const size_t rows = static_cast<size_t>(spec.weight_rows(fused));
  const size_t built = static_cast<size_t>(std::max(w.materialised_experts(), 0));
  const size_t may_build =
      std::min(rows > built ? rows - built : 0,
               static_cast<size_t>(tokens) * spec.top_k + (fused ? spec.shared_slots() : 0));
  need.weights = mul(may_build, spec.expert_bytes());
  if (add(add(need.weights, need.inputs), add(need.activations, need.workspace)) < kCheckFrom)
    return;
  check_host_memory(need, spec.name + " (a forward of " + std::to_string(tokens) + " tokens)");
}

size_t gpu_layer_device_bytes(const MoeSpec& spec, int max_tokens, DType experts, ExpertFormat mx,
                              int mx_widen_chunk) {
  MK_CHECK(max_tokens >= 0, "expected max_tokens >= 0, got " << max_tokens);
  // Mirrors GpuMoeLayer's allocate_weights / allocate_workspace (src/cuda/layer/layer_weights.cu,
  // layer_workspace.cu).
  const size_t E = spec.num_experts, H = spec.hidden, I = spec.expert_intermediate;
  const size_t S = spec.can_fuse_shared() ? spec.shared_slots() : 0;
  const size_t Is = spec.shared_kind != SharedKind::None ? spec.shared_intermediate : 0;
  const size_t rows = E + S, T = static_cast<size_t>(max_tokens), C = spec.router_columns();
  size_t w = mul(mul(C, H), dtype_size(spec.router_dtype));
  w = add(w, mul(E, 4 * ((spec.has_router_bias ? 1 : 0) + (spec.has_correction_bias ? 1 : 0))));
  const bool fp8 = experts == DType::F8_E4M3;
  const bool is_mx = mx == ExpertFormat::Mxfp4 || mx == ExpertFormat::Mxfp8;
  // (MX: the packed rows and an e8m0 byte per 32 elements, its scale layout's padding aside)
  const size_t mx_expert = is_mx ? mx_mlp_bytes(mx, I, H) : 0;
  w = add(w, mul(rows, fp8 ? spec.fp8_expert_bytes() : is_mx ? mx_expert : spec.expert_bytes()));
  if (spec.has_expert_bias) w = add(w, mul(rows, (2 * I + H) * 4));
  if (!fp8 && !is_mx) w = add(w, mul(mul(3 * Is, H), 2));  // (fp8, MX: no unfused shared MLP)
  const size_t pairs = mul(T, static_cast<size_t>(spec.top_k) + S);
  const size_t tasks = std::min(pairs, rows) + pairs / 8 + 1;  // max_routed_tasks(pairs, rows, 8)
  size_t ws = mul(mul(T, C), 4);
  ws = add(ws, mul(pairs, 4 + 4 + 4));           // ids, weights, pair list
  ws = add(ws, mul(T, 4 + 4));                   // shared scale, pair identity
  ws = add(ws, mul(add(tasks, T / 8 + 1), 16));  // tasks, shared tasks (4 ints each)
  // the decode kernels' h (bf16) and partials (fp32), or the prefill path's workspace, in one
  // region (layer_workspace.cu): permutation ints, permuted x, gate/up, h and down partials in
  // bf16, both GEMMs' group arrays and CUTLASS workspaces (a few MB at most)
  // (fp8: x and h in e4m3 with their scales beside them)
  const size_t decode = add(mul(pairs, I * 2 + H * 4 + (fp8 ? I + I / 32 : 0)),
                            fp8 ? mul(T, H + H / 32) : 0);
  // (MX on the prefill path: a run of experts widened to bf16, the given one or the plan's
  // default where its rules widen at max_tokens)
  MK_CHECK(mx_widen_chunk >= -1, "expected mx_widen_chunk >= -1, got " << mx_widen_chunk);
  const int t_max = static_cast<int>(std::min<size_t>(T, 1 << 30));
  const bool default_widens =
      is_mx && plan::experts_grouped_path_mx(t_max, spec.top_k, static_cast<int>(E), -1) &&
      plan::experts_grouped_mx_tile(t_max, spec.top_k, static_cast<int>(E), -1) == 0;
  const size_t widen_chunk =
      !is_mx                ? 0
      : mx_widen_chunk >= 0 ? static_cast<size_t>(mx_widen_chunk)
      : default_widens      ? static_cast<size_t>(plan::experts_grouped_mx_chunk(
                                  static_cast<int>(rows), static_cast<int>(H), static_cast<int>(I), -1))
                            : 0;
  const size_t mx_widened = mul(widen_chunk, 2 * I * H * 2);
  const size_t prefill = add(add(mul(pairs, 8 + H * 2 + 2 * I * 2 + I * 2 + H * 2),
                                 add(mul(rows, 2 * 60), size_t{4} << 20)),
                             mx_widened);
  ws = add(ws, std::max(decode, prefill));
  if (Is > 0) ws = add(ws, mul(T, Is * 2 + H * 4));
  ws = add(ws, mul(T, H * 2 * 2));               // x_in, y_out bf16
  ws = add(ws, (H / 16 + 1) * 4 + 256);          // tile counters, counters, error flag
  return add(add(w, ws), kGpuBlasWorkspace);
}

}  // namespace moekit
