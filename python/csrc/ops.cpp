// torch.ops.moekit: the schemas and their CPU kernels (the CUDA kernels: ops_cuda.cpp; the fake
// kernels that torch.compile traces with: python/moekit/_fake.py).
//
//   spec_summary(str spec) -> str        the parsed spec's fields as JSON
//   route(router_logits, correction_bias?, spec) -> (topk_ids int32, topk_weights fp32)
//   fused_experts(x, w13, w2, topk_ids, topk_weights, spec, b13?, b2?, expert_offset) -> y
//   fused_experts_mx(x, w13_mx, w13_mx_scale, w2_mx, w2_mx_scale, topk_ids, topk_weights, format,
//                    spec, b13?, b2?, expert_offset) -> y   OCP MX experts (CPU)
//   moe_layer(x, router_weight, router_bias?, correction_bias?, w13, w2, b13?, b2?,
//             shared_w13?, shared_w2?, spec, expert_offset) -> y
//   read_status(device, clear) -> int    the status word of the device's calls (MoeStatus::word:
//                                        1 = an expert id outside [0, E)); synchronises a GPU
//
// `spec` is the model's config.json text, read as transformers reads it (load_spec's rules); the
// weights follow vLLM's fused_experts contract (include/moekit/moe.h). y has x's dtype (computed
// from x rounded to bf16, as the engine API does). No kernel synchronises with the host. The ops
// are for inference: autograd falls through them (their outputs never require grad).
#include <torch/library.h>

#include "ops_impl.h"
#include "spec_cache.h"

namespace moekit::torch_ops {
namespace {

std::string spec_summary(const std::string& spec) {
  return spec_summary_json(spec_from_json(spec));
}

std::tuple<at::Tensor, at::Tensor> route_cpu(const at::Tensor& logits,
                                             const std::optional<at::Tensor>& correction_bias,
                                             const std::string& spec) {
  return route(Location::Host, logits, correction_bias, spec);
}

at::Tensor fused_experts_cpu(const at::Tensor& x, const at::Tensor& w13, const at::Tensor& w2,
                             const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                             const std::string& spec, const std::optional<at::Tensor>& b13,
                             const std::optional<at::Tensor>& b2, int64_t expert_offset) {
  return fused_experts(Location::Host, x, w13, w2, topk_ids, topk_weights, spec, b13, b2,
                       expert_offset);
}

at::Tensor moe_layer_cpu(const at::Tensor& x, const at::Tensor& router_weight,
                         const std::optional<at::Tensor>& router_bias,
                         const std::optional<at::Tensor>& correction_bias, const at::Tensor& w13,
                         const at::Tensor& w2, const std::optional<at::Tensor>& b13,
                         const std::optional<at::Tensor>& b2,
                         const std::optional<at::Tensor>& shared_w13,
                         const std::optional<at::Tensor>& shared_w2, const std::string& spec,
                         int64_t expert_offset) {
  return moe_layer(Location::Host, x, router_weight, router_bias, correction_bias, w13, w2, b13,
                   b2, shared_w13, shared_w2, spec, expert_offset);
}

at::Tensor fused_experts_mx_cpu(const at::Tensor& x, const at::Tensor& w13_mx,
                                const at::Tensor& w13_mx_scale, const at::Tensor& w2_mx,
                                const at::Tensor& w2_mx_scale, const at::Tensor& topk_ids,
                                const at::Tensor& topk_weights, const std::string& format,
                                const std::string& spec, const std::optional<at::Tensor>& b13,
                                const std::optional<at::Tensor>& b2, int64_t expert_offset) {
  return fused_experts_mx(Location::Host, x, {w13_mx, w13_mx_scale, w2_mx, w2_mx_scale}, topk_ids,
                          topk_weights, format, spec, b13, b2, expert_offset);
}

int64_t read_status_op(c10::Device device, bool clear) { return read_status(device, clear); }

}  // namespace
}  // namespace moekit::torch_ops

TORCH_LIBRARY(moekit, m) {
  m.def("read_status(Device device, bool clear=True) -> int", &moekit::torch_ops::read_status_op);
  m.def("spec_summary(str spec) -> str", &moekit::torch_ops::spec_summary);
  m.def("route(Tensor router_logits, Tensor? correction_bias, str spec) -> (Tensor, Tensor)");
  m.def(
      "fused_experts(Tensor x, Tensor w13, Tensor w2, Tensor topk_ids, Tensor topk_weights, "
      "str spec, Tensor? b13=None, Tensor? b2=None, int expert_offset=0) -> Tensor");
  m.def(
      "fused_experts_mx(Tensor x, Tensor w13_mx, Tensor w13_mx_scale, Tensor w2_mx, "
      "Tensor w2_mx_scale, Tensor topk_ids, Tensor topk_weights, str format, str spec, "
      "Tensor? b13=None, Tensor? b2=None, int expert_offset=0) -> Tensor");
  m.def(
      "moe_layer(Tensor x, Tensor router_weight, Tensor? router_bias, Tensor? correction_bias, "
      "Tensor w13, Tensor w2, Tensor? b13, Tensor? b2, Tensor? shared_w13, Tensor? shared_w2, "
      "str spec, int expert_offset=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(moekit, CPU, m) {
  m.impl("route", &moekit::torch_ops::route_cpu);
  m.impl("fused_experts", &moekit::torch_ops::fused_experts_cpu);
  m.impl("fused_experts_mx", &moekit::torch_ops::fused_experts_mx_cpu);
  m.impl("moe_layer", &moekit::torch_ops::moe_layer_cpu);
}

TORCH_LIBRARY_IMPL(moekit, Autograd, m) {
  m.impl("route", torch::CppFunction::makeFallthrough());
  m.impl("fused_experts", torch::CppFunction::makeFallthrough());
  m.impl("fused_experts_mx", torch::CppFunction::makeFallthrough());
  m.impl("moe_layer", torch::CppFunction::makeFallthrough());
}
