// The ops' bodies (ops_impl.h): argument checks with "expected X, got Y" messages, the view over
// the caller's tensors, the engine API call.
#include "ops_impl.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "spec_cache.h"

namespace moekit::torch_ops {

namespace {

DeviceRunner g_device_runner = nullptr;
DeviceStatusReader g_device_status_reader = nullptr;

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.scalar_type() << " on " << t.device();
  return s.str();
}

void check_shape(const at::Tensor& t, const char* name, std::vector<int64_t> shape,
                 const at::Device& device) {
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), "moekit: expected ", name, " of shape ",
              at::IntArrayRef(shape), ", got ", shape_of(t));
  TORCH_CHECK(t.device() == device, "moekit: expected ", name, " on ", device, " (where x is), got ",
              t.device());
}

// `t` as a contiguous tensor of `dtype`: itself when it already is one (borrowed), else a copy.
at::Tensor as_dense(const at::Tensor& t, at::ScalarType dtype) {
  return t.to(dtype).contiguous();
}

at::ScalarType torch_dtype(DType d) {
  switch (d) {
    case DType::BF16:
      return at::kBFloat16;
    case DType::F32:
      return at::kFloat;
    case DType::F16:
      return at::kHalf;
    case DType::F8_E4M3:
      return at::kFloat8_e4m3fn;
  }
  return at::kFloat;
}

// An expert stack [n, rows, cols] bf16 whose rows are dense: the first dimension may be strided
// (per-expert buffers at a regular spacing), which the view's expert stride describes.
int64_t stack_stride(const at::Tensor& t, const char* name, int64_t rows, int64_t cols,
                     const at::Device& device) {
  TORCH_CHECK(t.dim() == 3 && t.size(1) == rows && t.size(2) == cols, "moekit: expected ", name,
              " of shape [n, ", rows, ", ", cols, "], got ", shape_of(t));
  TORCH_CHECK(t.scalar_type() == at::kBFloat16, "moekit: expected ", name, " bf16, got ",
              t.scalar_type(), " (convert the weights once, e.g. .to(torch.bfloat16))");
  TORCH_CHECK(t.device() == device, "moekit: expected ", name, " on ", device, ", got ",
              t.device());
  TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == cols,
              "moekit: expected the rows of each expert of ", name,
              " dense (strides [*, ", cols, ", 1]), got strides ", t.strides());
  TORCH_CHECK(t.size(0) <= 1 || t.stride(0) >= rows * cols, "moekit: expected ", name,
              "'s expert stride >= ", rows * cols, ", got ", t.stride(0));
  return t.size(0) <= 1 ? 0 : t.stride(0);
}

struct Borrowed {
  MoeWeightsView view;
  std::vector<at::Tensor> keep;  // converted copies the view points into
};

// An MX stack [n, rows, bytes] uint8 whose rows are dense; its expert stride in bytes.
int64_t mx_stack_stride(const at::Tensor& t, const char* name, int64_t rows, int64_t bytes,
                        const at::Device& device) {
  TORCH_CHECK(t.dim() == 3 && t.size(1) == rows && t.size(2) == bytes, "moekit: expected ", name,
              " of shape [n, ", rows, ", ", bytes, "], got ", shape_of(t));
  TORCH_CHECK(t.scalar_type() == at::kByte, "moekit: expected ", name,
              " uint8 (packed elements or e8m0 exponent bytes), got ", t.scalar_type());
  TORCH_CHECK(t.device() == device, "moekit: expected ", name, " on ", device, ", got ",
              t.device());
  TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == bytes,
              "moekit: expected the rows of each expert of ", name, " dense (strides [*, ", bytes,
              ", 1]), got strides ", t.strides());
  TORCH_CHECK(t.size(0) <= 1 || t.stride(0) >= rows * bytes, "moekit: expected ", name,
              "'s expert stride >= ", rows * bytes, ", got ", t.stride(0));
  return t.size(0) <= 1 ? 0 : t.stride(0);
}

// The slice of n experts from expert_offset and the expert biases (gpt-oss) of a view.
void set_slice(const MoeSpec& s, Borrowed& b, int64_t n, int64_t n2,
               const std::optional<at::Tensor>& b13, const std::optional<at::Tensor>& b2,
               int64_t expert_offset, const at::Device& device) {
  const int64_t H = s.hidden, I = s.expert_intermediate;
  MoeWeightsView& v = b.view;
  TORCH_CHECK(n2 == n, "moekit: expected w2 with as many experts as w13 (", n, "), got ", n2);
  TORCH_CHECK(expert_offset >= 0 && expert_offset + n <= s.num_experts,
              "moekit: expected expert_offset + experts held <= ", s.num_experts,
              " (the spec's experts), got expert_offset ", expert_offset, " + ", n);
  v.expert_offset = static_cast<int>(expert_offset);
  v.expert_count = static_cast<int>(n);
  TORCH_CHECK(s.has_expert_bias || (!b13 && !b2), "moekit: ", s.name,
              " has no expert biases (only gpt-oss does), but b13/b2 were given");
  if (s.has_expert_bias) {
    TORCH_CHECK(b13 && b2, "moekit: ", s.name, " has expert biases: expected b13 [n, 2I] and b2 "
                "[n, H], got ", b13 ? "only b13" : (b2 ? "only b2" : "neither"));
    check_shape(*b13, "b13", {n, 2 * I}, device);
    check_shape(*b2, "b2", {n, H}, device);
    b.keep.push_back(as_dense(*b13, at::kFloat));
    b.keep.push_back(as_dense(*b2, at::kFloat));
    v.b13 = b.keep[b.keep.size() - 2].data_ptr<float>();
    v.b2 = b.keep.back().data_ptr<float>();
  }
}

void set_experts(const MoeSpec& s, Borrowed& b, const at::Tensor& w13, const at::Tensor& w2,
                 const std::optional<at::Tensor>& b13, const std::optional<at::Tensor>& b2,
                 int64_t expert_offset, const at::Device& device) {
  const int64_t H = s.hidden, I = s.expert_intermediate;
  MoeWeightsView& v = b.view;
  v.w13_expert_stride = stack_stride(w13, "w13", 2 * I, H, device);
  v.w2_expert_stride = stack_stride(w2, "w2", H, I, device);
  v.w13 = static_cast<const Bf16*>(w13.data_ptr());
  v.w2 = static_cast<const Bf16*>(w2.data_ptr());
  set_slice(s, b, w13.size(0), w2.size(0), b13, b2, expert_offset, device);
}

// The MX stacks of a view (format "mxfp4" or "mxfp8"), their biases and slice.
void set_mx_experts(const MoeSpec& s, Borrowed& b, const MxStacks& w, const std::string& format,
                    const std::optional<at::Tensor>& b13, const std::optional<at::Tensor>& b2,
                    int64_t expert_offset, const at::Device& device) {
  const int64_t H = s.hidden, I = s.expert_intermediate;
  const ExpertFormat f = parse_expert_format(format);
  TORCH_CHECK(f == ExpertFormat::Mxfp4 || f == ExpertFormat::Mxfp8,
              "moekit: expected format mxfp4 or mxfp8, got ", format);
  TORCH_CHECK(H % kMxGroup == 0 && I % kMxGroup == 0, "moekit: MX experts need hidden and ",
              "expert_intermediate multiples of ", kMxGroup, ", got ", H, " and ", I);
  MoeWeightsView& v = b.view;
  v.mx_format = f;
  const int64_t rb13 = static_cast<int64_t>(mx_row_bytes(f, H));
  const int64_t rb2 = static_cast<int64_t>(mx_row_bytes(f, I));
  v.w13_expert_stride = mx_stack_stride(w.w13, "w13_mx", 2 * I, rb13, device);
  v.w2_expert_stride = mx_stack_stride(w.w2, "w2_mx", H, rb2, device);
  v.w13_scale_expert_stride =
      mx_stack_stride(w.w13_scale, "w13_mx_scale", 2 * I, H / kMxGroup, device);
  v.w2_scale_expert_stride = mx_stack_stride(w.w2_scale, "w2_mx_scale", H, I / kMxGroup, device);
  const int64_t n = w.w13.size(0);
  TORCH_CHECK(w.w13_scale.size(0) == n && w.w2_scale.size(0) == n,
              "moekit: expected the scales with as many experts as w13_mx (", n, "), got ",
              w.w13_scale.size(0), " and ", w.w2_scale.size(0));
  v.w13_mx = w.w13.data_ptr<uint8_t>();
  v.w13_mx_scale = w.w13_scale.data_ptr<uint8_t>();
  v.w2_mx = w.w2.data_ptr<uint8_t>();
  v.w2_mx_scale = w.w2_scale.data_ptr<uint8_t>();
  set_slice(s, b, n, w.w2.size(0), b13, b2, expert_offset, device);
}

// x [T, H] as dense bf16 rows (a copy when x is another dtype).
at::Tensor bf16_rows(const MoeSpec& s, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == s.hidden, "moekit: expected x of shape [tokens, ",
              s.hidden, "], got ", shape_of(x));
  TORCH_CHECK(x.is_floating_point(), "moekit: expected x floating point, got ", x.scalar_type());
  at::Tensor rows = as_dense(x, at::kBFloat16);
  // the device kernels read x in 16-byte vectors: a view starting mid-vector is copied
  if (reinterpret_cast<uintptr_t>(rows.data_ptr()) % 16 != 0) rows = rows.clone();
  return rows;
}

// One host MoeOp per spec (specs are cached, so their addresses are stable), kept so that the
// status its calls set stays for read_status. Host calls need no workspace and no token bound.
std::mutex g_host_mutex;
std::map<const MoeSpec*, std::unique_ptr<MoeOp>> g_host_ops;

MoeOp& host_op(const MoeSpec& s) {
  std::lock_guard<std::mutex> lock(g_host_mutex);
  std::unique_ptr<MoeOp>& op = g_host_ops[&s];
  if (!op) {
    MoeOptions options;
    options.max_tokens = std::numeric_limits<int>::max();
    op = std::make_unique<MoeOp>(s, options);
  }
  return *op;
}

void run(Location loc, const MoeSpec& s, int tokens, const at::Device& device, const OpCall& call) {
  if (loc == Location::Host) {
    call(host_op(s), nullptr, 0, nullptr);
    return;
  }
  TORCH_CHECK(g_device_runner != nullptr,
              "moekit: this build of moekit's torch ops has no CUDA side (built with "
              "MOEKIT_CUDA=OFF); got tensors on ", device);
  g_device_runner(s, tokens, device, call);
}

}  // namespace

void set_device_runner(DeviceRunner runner) { g_device_runner = runner; }
void set_device_status_reader(DeviceStatusReader reader) { g_device_status_reader = reader; }

int64_t read_status(const at::Device& device, bool clear) {
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(g_host_mutex);
    uint32_t word = 0;
    for (auto& [spec, op] : g_host_ops) word |= op->read_host_status(clear).word();
    return word;
  }
  TORCH_CHECK(g_device_status_reader != nullptr,
              "moekit: this build of moekit's torch ops has no CUDA side (built with "
              "MOEKIT_CUDA=OFF); got read_status on ", device);
  return g_device_status_reader(device, clear);
}

std::tuple<at::Tensor, at::Tensor> route(Location loc, const at::Tensor& router_logits,
                                         const std::optional<at::Tensor>& correction_bias,
                                         const std::string& spec) {
  const MoeSpec& s = spec_from_json(spec);
  const at::Device device = router_logits.device();
  const int64_t cols = s.router_columns();
  TORCH_CHECK(router_logits.dim() == 2 && router_logits.size(1) == cols,
              "moekit: expected router_logits of shape [tokens, ", cols, "] (", s.num_experts,
              " experts", s.shared_kind == SharedKind::Gated ? " + the shared expert's gate" : "",
              "), got ", shape_of(router_logits));
  const int64_t T = router_logits.size(0);
  Borrowed b;
  const at::Tensor logits = as_dense(router_logits, at::kFloat);
  if (s.has_correction_bias) {
    TORCH_CHECK(correction_bias.has_value(), "moekit: ", s.name,
                " routes with e_score_correction_bias: expected correction_bias [",
                s.num_experts, "], got None");
    check_shape(*correction_bias, "correction_bias", {s.num_experts}, device);
    b.keep.push_back(as_dense(*correction_bias, at::kFloat));
    b.view.correction_bias = b.keep.back().data_ptr<float>();
  } else {
    TORCH_CHECK(!correction_bias.has_value(), "moekit: ", s.name, " routes without a correction "
                "bias (", scoring_name(s.scoring), "), but correction_bias was given");
  }
  auto ids = at::empty({T, s.top_k}, logits.options().dtype(at::kInt));
  auto weights = at::empty({T, s.top_k}, logits.options());
  // route_logits reads the correction bias only (the router and its bias made the logits)
  b.view.location = loc;
  run(loc, s, static_cast<int>(T), device, [&](MoeOp& op, void* ws, size_t bytes, CUstream_st* st) {
    op.route_logits(b.view, logits.data_ptr<float>(), static_cast<int>(T), ids.data_ptr<int32_t>(),
                    weights.data_ptr<float>(), nullptr, ws, bytes, st);
  });
  return {ids, weights};
}

at::Tensor fused_experts(Location loc, const at::Tensor& x, const at::Tensor& w13,
                         const at::Tensor& w2, const at::Tensor& topk_ids,
                         const at::Tensor& topk_weights, const std::string& spec,
                         const std::optional<at::Tensor>& b13,
                         const std::optional<at::Tensor>& b2, int64_t expert_offset) {
  const MoeSpec& s = spec_from_json(spec);
  const at::Device device = x.device();
  const at::Tensor xb = bf16_rows(s, x);
  const int64_t T = x.size(0);
  check_shape(topk_ids, "topk_ids", {T, s.top_k}, device);
  check_shape(topk_weights, "topk_weights", {T, s.top_k}, device);
  TORCH_CHECK(topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong,
              "moekit: expected topk_ids int32 or int64, got ", topk_ids.scalar_type());
  const at::Tensor ids = as_dense(topk_ids, at::kInt);
  const at::Tensor weights = as_dense(topk_weights, at::kFloat);
  Borrowed b;
  b.view.location = loc;
  set_experts(s, b, w13, w2, b13, b2, expert_offset, device);
  // experts() reads the stacks only: the view holds no router and no routing biases
  auto y = at::empty({T, s.hidden}, xb.options());
  ExpertsOptions eo;
  eo.add_shared = false;
  run(loc, s, static_cast<int>(T), device, [&](MoeOp& op, void* ws, size_t bytes, CUstream_st* st) {
    op.experts(b.view, xb.data_ptr(), ids.data_ptr<int32_t>(), weights.data_ptr<float>(),
               y.data_ptr(), static_cast<int>(T), eo, ws, bytes, st);
  });
  return y.to(x.scalar_type());
}

at::Tensor fused_experts_mx(Location loc, const at::Tensor& x, const MxStacks& w,
                            const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                            const std::string& format, const std::string& spec,
                            const std::optional<at::Tensor>& b13,
                            const std::optional<at::Tensor>& b2, int64_t expert_offset) {
  const MoeSpec& s = spec_from_json(spec);
  const at::Device device = x.device();
  const at::Tensor xb = bf16_rows(s, x);
  const int64_t T = x.size(0);
  check_shape(topk_ids, "topk_ids", {T, s.top_k}, device);
  check_shape(topk_weights, "topk_weights", {T, s.top_k}, device);
  TORCH_CHECK(topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong,
              "moekit: expected topk_ids int32 or int64, got ", topk_ids.scalar_type());
  const at::Tensor ids = as_dense(topk_ids, at::kInt);
  const at::Tensor weights = as_dense(topk_weights, at::kFloat);
  Borrowed b;
  b.view.location = loc;
  set_mx_experts(s, b, w, format, b13, b2, expert_offset, device);
  auto y = at::empty({T, s.hidden}, xb.options());
  ExpertsOptions eo;
  eo.add_shared = false;
  run(loc, s, static_cast<int>(T), device, [&](MoeOp& op, void* ws, size_t bytes, CUstream_st* st) {
    op.experts(b.view, xb.data_ptr(), ids.data_ptr<int32_t>(), weights.data_ptr<float>(),
               y.data_ptr(), static_cast<int>(T), eo, ws, bytes, st);
  });
  return y.to(x.scalar_type());
}

at::Tensor moe_layer(Location loc, const at::Tensor& x, const at::Tensor& router_weight,
                     const std::optional<at::Tensor>& router_bias,
                     const std::optional<at::Tensor>& correction_bias, const at::Tensor& w13,
                     const at::Tensor& w2, const std::optional<at::Tensor>& b13,
                     const std::optional<at::Tensor>& b2,
                     const std::optional<at::Tensor>& shared_w13,
                     const std::optional<at::Tensor>& shared_w2, const std::string& spec,
                     int64_t expert_offset) {
  const MoeSpec& s = spec_from_json(spec);
  const at::Device device = x.device();
  const at::Tensor xb = bf16_rows(s, x);
  const int64_t T = x.size(0), E = s.num_experts;
  Borrowed b;
  b.view.location = loc;
  set_experts(s, b, w13, w2, b13, b2, expert_offset, device);
  check_shape(router_weight, "router_weight", {s.router_columns(), s.hidden}, device);
  b.keep.push_back(as_dense(router_weight, torch_dtype(s.router_dtype)));
  b.view.router_weight = b.keep.back().data_ptr();
  const auto optional_vector = [&](const std::optional<at::Tensor>& t, bool wanted,
                                   const char* name, const char* why) -> const float* {
    if (!wanted) {
      TORCH_CHECK(!t.has_value(), "moekit: ", s.name, " has no ", name, ", but one was given");
      return nullptr;
    }
    TORCH_CHECK(t.has_value(), "moekit: ", s.name, " ", why, ": expected ", name, " [", E,
                "], got None");
    check_shape(*t, name, {E}, device);
    b.keep.push_back(as_dense(*t, at::kFloat));
    return b.keep.back().data_ptr<float>();
  };
  b.view.router_bias =
      optional_vector(router_bias, s.has_router_bias, "router_bias", "has a router bias");
  b.view.correction_bias = optional_vector(correction_bias, s.has_correction_bias,
                                           "correction_bias", "routes with a correction bias");
  const bool has_shared = s.shared_kind != SharedKind::None && s.shared_intermediate > 0;
  TORCH_CHECK(shared_w13.has_value() == shared_w2.has_value(),
              "moekit: expected both shared_w13 and shared_w2 or neither");
  if (shared_w13) {
    TORCH_CHECK(has_shared, "moekit: ", s.name, " has no shared expert, but shared_w13 was given");
    const int64_t Is = s.shared_intermediate;
    check_shape(*shared_w13, "shared_w13", {2 * Is, s.hidden}, device);
    check_shape(*shared_w2, "shared_w2", {s.hidden, Is}, device);
    b.keep.push_back(as_dense(*shared_w13, at::kBFloat16));
    b.view.shared_w13 = static_cast<const Bf16*>(b.keep.back().data_ptr());
    b.keep.push_back(as_dense(*shared_w2, at::kBFloat16));
    b.view.shared_w2 = static_cast<const Bf16*>(b.keep.back().data_ptr());
  }
  auto y = at::empty({T, s.hidden}, xb.options());
  run(loc, s, static_cast<int>(T), device, [&](MoeOp& op, void* ws, size_t bytes, CUstream_st* st) {
    op.forward(b.view, xb.data_ptr(), y.data_ptr(), static_cast<int>(T), ws, bytes, st);
  });
  return y.to(x.scalar_type());
}

}  // namespace moekit::torch_ops
