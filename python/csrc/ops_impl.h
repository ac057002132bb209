// The ops' bodies, shared by the CPU and the CUDA registrations (ops.cpp, ops_cuda.cpp): check
// the tensors against the spec, build a MoeWeightsView over them (borrowed, nothing copied where
// the tensor already has the contract's dtype and layout), and call the engine API.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>

#include "moekit/moe.h"

namespace moekit::torch_ops {

// Runs `call` with a MoeOp for `spec` that takes `tokens` tokens, its workspace and the stream:
// on the host a fresh MoeOp (no workspace, no stream); on a device the CUDA side's cached op and
// workspace on the current stream (set by ops_cuda.cpp in a CUDA build).
using OpCall = std::function<void(MoeOp& op, void* workspace, size_t workspace_bytes,
                                  CUstream_st* stream)>;
using DeviceRunner = void (*)(const MoeSpec& spec, int tokens, const at::Device& device,
                              const OpCall& call);
void set_device_runner(DeviceRunner runner);
// The OR of the status words (MoeStatus::word) of every op the device's calls ran on since the
// last clear; on a GPU it synchronises each op's stream (ops_cuda.cpp).
using DeviceStatusReader = int64_t (*)(const at::Device& device, bool clear);
void set_device_status_reader(DeviceStatusReader reader);

// torch.ops.moekit.read_status: the status of `device`'s calls, the same bits on the host (whose
// calls also throw) and on a GPU (whose calls cannot: their outputs are then undefined).
int64_t read_status(const at::Device& device, bool clear);

std::tuple<at::Tensor, at::Tensor> route(Location loc, const at::Tensor& router_logits,
                                         const std::optional<at::Tensor>& correction_bias,
                                         const std::string& spec);

at::Tensor fused_experts(Location loc, const at::Tensor& x, const at::Tensor& w13,
                         const at::Tensor& w2, const at::Tensor& topk_ids,
                         const at::Tensor& topk_weights, const std::string& spec,
                         const std::optional<at::Tensor>& b13,
                         const std::optional<at::Tensor>& b2, int64_t expert_offset);

// An MX expert stack's four tensors: packed rows [n, 2I, H/2 or H] and e8m0 bytes [n, 2I, H/32]
// (w13), [n, H, I/2 or I] and [n, H, I/32] (w2), all uint8 (moekit/moe.h's MX view).
struct MxStacks {
  at::Tensor w13, w13_scale, w2, w2_scale;
};

// fused_experts on OCP MX experts (format "mxfp4" or "mxfp8"): the host only (the GPU holds MX
// experts in its own layout).
at::Tensor fused_experts_mx(Location loc, const at::Tensor& x, const MxStacks& w,
                            const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                            const std::string& format, const std::string& spec,
                            const std::optional<at::Tensor>& b13,
                            const std::optional<at::Tensor>& b2, int64_t expert_offset);

at::Tensor moe_layer(Location loc, const at::Tensor& x, const at::Tensor& router_weight,
                     const std::optional<at::Tensor>& router_bias,
                     const std::optional<at::Tensor>& correction_bias, const at::Tensor& w13,
                     const at::Tensor& w2, const std::optional<at::Tensor>& b13,
                     const std::optional<at::Tensor>& b2,
                     const std::optional<at::Tensor>& shared_w13,
                     const std::optional<at::Tensor>& shared_w2, const std::string& spec,
                     int64_t expert_offset);

}  // namespace moekit::torch_ops
