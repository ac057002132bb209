// The CUDA side of MoeOp (include/moekit/moe.h): implemented in src/cuda/engine/ where CUDA is,
// in src/cuda_stub/engine_stub.cpp (every call throws "built without CUDA") where not.
// moe_op.cpp validates the arguments and resolves the fusion before it calls these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/moe.h"

namespace moekit::engine_gpu {

// Throws "<what>: moekit was built without CUDA" in a build without it; else nothing.
void require_cuda(const char* what);

// Whether the shared expert runs as the view's fused slots (true) or as its unfused MLP (false):
// Auto takes the fused slots where the view holds them (*plan_auto, when given, decides where it
// holds both forms); On and Off need the form they ask for when the view holds the other only.
// Defined in moe_op.cpp (host code).
bool fused_for(const MoeWeightsView& w, FuseShared fuse, const bool* plan_auto);

size_t workspace_bytes(const MoeSpec& spec, int max_tokens, const MoeOptions& options);

MoeOp::Gpu* create(const MoeSpec& spec, const MoeOptions& options);
void destroy(MoeOp::Gpu* gpu);

void prepare_workspace(MoeOp::Gpu& gpu, void* workspace, size_t bytes, CUstream_st* stream);

void forward(MoeOp::Gpu& gpu, const MoeWeightsView& w, const void* x, void* y, int tokens,
             void* workspace, size_t bytes, CUstream_st* stream);
// x or logits (the other null)
void route(MoeOp::Gpu& gpu, const MoeWeightsView& w, const void* x, const float* logits, int tokens,
           int32_t* topk_ids, float* topk_weights, float* shared_scale, void* workspace,
           size_t bytes, CUstream_st* stream);
void experts(MoeOp::Gpu& gpu, const MoeWeightsView& w, const void* x, const int32_t* topk_ids,
             const float* topk_weights, void* y, int tokens, const ExpertsOptions& eo,
             void* workspace, size_t bytes, CUstream_st* stream);
MoeStatus read_status(int device, void* workspace, size_t bytes_needed, CUstream_st* stream,
                      bool clear);

}  // namespace moekit::engine_gpu
