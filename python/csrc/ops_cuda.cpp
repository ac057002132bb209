// torch.ops.moekit's CUDA kernels: the engine API's device path on PyTorch's current stream.
//
// One MoeOp and one workspace per (spec, device), cached: prepared once (that synchronises the
// stream, so run each shape's first call before capturing a CUDA graph) and grown when a call has
// more tokens than the workspace was sized for. The calls themselves neither synchronise nor
// allocate beyond the caching allocator (capturable). Device errors (an expert id out of range)
// set the workspace's status word; the calls do not read it (that would synchronise):
// torch.ops.moekit.read_status(device) does, once the caller wants to know.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "ops_impl.h"

namespace moekit::torch_ops {
namespace {

struct DeviceOp {
  std::unique_ptr<MoeOp> op;
  at::Tensor workspace;  // uint8 [workspace_bytes]
  uint32_t status = 0;   // the status of a workspace replaced by a larger one, not yet read
};

std::mutex g_mutex;
std::map<std::pair<const MoeSpec*, int>, DeviceOp> g_ops;  // (spec, device index)

void run_on_device(const MoeSpec& spec, int tokens, const at::Device& device, const OpCall& call) {
  auto& ops = g_ops;
  const c10::cuda::CUDAGuard guard(device);
  CUstream_st* stream = at::cuda::getCurrentCUDAStream(device.index()).stream();
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceOp& d = ops[{&spec, device.index()}];
  if (!d.op || d.op->options().max_tokens < tokens) {
    MoeOptions options;
    options.device = device.index();
    options.max_tokens = std::max(256, tokens);
    if (d.op) d.status |= d.op->read_status(d.workspace.data_ptr(), stream).word();
    d.op = std::make_unique<MoeOp>(spec, options);
    d.workspace = at::empty({static_cast<int64_t>(d.op->workspace_bytes())},
                            at::TensorOptions().dtype(at::kByte).device(device));
    d.op->prepare_workspace(d.workspace.data_ptr(), d.op->workspace_bytes(), stream);
  }
  call(*d.op, d.workspace.data_ptr(), d.op->workspace_bytes(), stream);
}

std::tuple<at::Tensor, at::Tensor> route_cuda(const at::Tensor& logits,
                                              const std::optional<at::Tensor>& correction_bias,
                                              const std::string& spec) {
  return route(Location::Device, logits, correction_bias, spec);
}

at::Tensor fused_experts_cuda(const at::Tensor& x, const at::Tensor& w13, const at::Tensor& w2,
                              const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                              const std::string& spec, const std::optional<at::Tensor>& b13,
                              const std::optional<at::Tensor>& b2, int64_t expert_offset) {
  return fused_experts(Location::Device, x, w13, w2, topk_ids, topk_weights, spec, b13, b2,
                       expert_offset);
}

at::Tensor moe_layer_cuda(const at::Tensor& x, const at::Tensor& router_weight,
                          const std::optional<at::Tensor>& router_bias,
                          const std::optional<at::Tensor>& correction_bias,
                          const at::Tensor& w13, const at::Tensor& w2,
                          const std::optional<at::Tensor>& b13,
                          const std::optional<at::Tensor>& b2,
                          const std::optional<at::Tensor>& shared_w13,
                          const std::optional<at::Tensor>& shared_w2, const std::string& spec,
                          int64_t expert_offset) {
  return moe_layer(Location::Device, x, router_weight, router_bias, correction_bias, w13, w2, b13,
                   b2, shared_w13, shared_w2, spec, expert_offset);
}

// The OR of the status words of every op on `device`, read on the current stream (which
// synchronises it).
int64_t read_status_on_device(const at::Device& device, bool clear) {
  const c10::cuda::CUDAGuard guard(device);
  CUstream_st* stream = at::cuda::getCurrentCUDAStream(device.index()).stream();
  std::lock_guard<std::mutex> lock(g_mutex);
  uint32_t word = 0;
  for (auto& [key, d] : g_ops) {
    if (key.second != device.index() || !d.op) continue;
    word |= d.status | d.op->read_status(d.workspace.data_ptr(), stream, clear).word();
    if (clear) d.status = 0;
  }
  return word;
}

// why: the shared bodies (ops_impl.cpp) reach the device only through this pointer, so the CPU
// build links without CUDA.
const bool registered =
    (set_device_runner(&run_on_device), set_device_status_reader(&read_status_on_device), true);

}  // namespace
}  // namespace moekit::torch_ops

TORCH_LIBRARY_IMPL(moekit, CUDA, m) {
  m.impl("route", &moekit::torch_ops::route_cuda);
  m.impl("fused_experts", &moekit::torch_ops::fused_experts_cuda);
  m.impl("moe_layer", &moekit::torch_ops::moe_layer_cuda);
}
