// GpuMoeLayer::Impl's weights (layer_impl.h): allocation, upload from a LayerWeights, the device
// random fill (random_fill.cu: the host generator's formula, so a 22.6 GB DeepSeek-V3 layer
// needs no host copy), and the fused shared slots repacked on the device. MX experts are held in
// the MX kernels' layout (cuda/experts/experts_mx_layout.h): rows and e8m0 bytes regrouped by
// tile on the host, the packed words reordered on the device after the upload.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/random_values.h"
#include "cuda/common/cuda_check.h"
#include "cuda/experts/experts_mx_layout.h"
#include "cuda/layer/layer_impl.h"
#include "cuda/layer/random_fill.h"
#include "io/random_weight_values.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

// The packed words of an MX upload into the kernels' byte order, in place.
__global__ void mx_kernel_order(uint32_t* words, size_t count, ExpertFormat f) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    words[i] = mx_kernel_word(f, words[i]);
  }
}

void to_kernel_order(uint8_t* bytes, size_t count, ExpertFormat f, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const size_t words = count / 4;  // (rows of k / 2 or k bytes, k a multiple of 32)
  const int blocks = static_cast<int>(std::min<size_t>((words + kThreads - 1) / kThreads, 4096));
  if (words == 0) return;
  mx_kernel_order<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<uint32_t*>(bytes), words, f);
  MK_CUDA_CHECK(cudaGetLastError());
}

// The e8m0 byte whose 2^(s - 127) times the format's largest element is nearest `scale`: the
// random MX layers' exponent, so that their weights span the bf16 fill's range.
uint8_t random_mx_exponent(ExpertFormat f, float scale) {
  const float largest = f == ExpertFormat::Mxfp4 ? 6.0f : 448.0f;
  return static_cast<uint8_t>(127 + std::lround(std::log2(scale / largest)));
}

}  // namespace

size_t GpuMoeLayer::Impl::mx13_scale_bytes() const { return mx_scale_layout_bytes(mx, 2 * I, H); }
size_t GpuMoeLayer::Impl::mx2_scale_bytes() const { return mx_scale_layout_bytes(mx, H, I); }

void GpuMoeLayer::Impl::allocate_weights() {
  const size_t rows = rows_fused();
  const size_t router_elems = static_cast<size_t>(cols) * H;
  if (spec.router_dtype == DType::F32) {
    allocate<float>(router_w, router_elems, weight_bytes);
  } else {
    allocate<__nv_bfloat16>(router_w, router_elems, weight_bytes);
  }
  if (spec.has_router_bias) allocate<float>(router_bias, E, weight_bytes);
  if (spec.has_correction_bias) allocate<float>(corr_bias, E, weight_bytes);
  if (mx_experts()) {
    allocate<uint8_t>(w13_mx, rows * mx13_bytes(), weight_bytes);
    allocate<uint8_t>(w13_mx_scale, rows * mx13_scale_bytes(), weight_bytes);
    allocate<uint8_t>(w2_mx, rows * mx2_bytes(), weight_bytes);
    allocate<uint8_t>(w2_mx_scale, rows * mx2_scale_bytes(), weight_bytes);
  } else if (fp8) {
    allocate<uint8_t>(w13_fp8, rows * 2 * I * H, weight_bytes);
    allocate<float>(w13_scale, rows * scales13(), weight_bytes);
    allocate<uint8_t>(w2_fp8, rows * H * I, weight_bytes);
    allocate<float>(w2_scale, rows * scales2(), weight_bytes);
  } else {
    allocate<__nv_bfloat16>(w13, rows * 2 * I * H, weight_bytes);
    allocate<__nv_bfloat16>(w2, rows * H * I, weight_bytes);
  }
  if (spec.has_expert_bias) {
    allocate<float>(b13, rows * 2 * I, weight_bytes);
    allocate<float>(b2, rows * H, weight_bytes);
    MK_CUDA_CHECK(cudaMemsetAsync(b13.ptr, 0, b13.bytes, stream));
    MK_CUDA_CHECK(cudaMemsetAsync(b2.ptr, 0, b2.bytes, stream));
  }
  if (has_shared && !quantised()) {  // (fp8, MX: the shared expert runs as fused slots only)
    allocate<__nv_bfloat16>(shared_w13, static_cast<size_t>(2) * Is * H, weight_bytes);
    allocate<__nv_bfloat16>(shared_w2, static_cast<size_t>(H) * Is, weight_bytes);
  }
  point_at_own_weights();
}

void GpuMoeLayer::Impl::point_at_own_weights() {
  wp.router_w = router_w.ptr;
  wp.router_bias = router_bias.as<float>();
  wp.corr_bias = corr_bias.as<float>();
  wp.w13 = w13.as<__nv_bfloat16>();
  wp.w2 = w2.as<__nv_bfloat16>();
  wp.b13 = b13.as<float>();
  wp.b2 = b2.as<float>();
  wp.shared_w13 = shared_w13.as<__nv_bfloat16>();
  wp.shared_w2 = shared_w2.as<__nv_bfloat16>();
  wp.w13_fp8 = w13_fp8.as<uint8_t>();
  wp.w13_scale = w13_scale.as<float>();
  wp.w2_fp8 = w2_fp8.as<uint8_t>();
  wp.w2_scale = w2_scale.as<float>();
  wp.w13_mx = w13_mx.as<uint8_t>();
  wp.w13_mx_scale = w13_mx_scale.as<uint8_t>();
  wp.w2_mx = w2_mx.as<uint8_t>();
  wp.w2_mx_scale = w2_mx_scale.as<uint8_t>();
}

// Fused slot j = gate rows [jI,(j+1)I) and up rows Is+[jI,(j+1)I) of the shared w13, down
// columns [jI,(j+1)I) of the shared w2 (the repack of src/io/lazy_experts.h, on the device).
void GpuMoeLayer::Impl::repack_slots_on_device() {
  const size_t expert13 = static_cast<size_t>(2) * I * H, expert2 = static_cast<size_t>(H) * I;
  for (int j = 0; j < S; ++j) {
    __nv_bfloat16* dst13 = w13.as<__nv_bfloat16>() + (E + j) * expert13;
    const __nv_bfloat16* src = shared_w13.as<__nv_bfloat16>();
    MK_CUDA_CHECK(cudaMemcpyAsync(dst13, src + static_cast<size_t>(j) * I * H,
                                  static_cast<size_t>(I) * H * 2, cudaMemcpyDeviceToDevice,
                                  stream));
    MK_CUDA_CHECK(cudaMemcpyAsync(
        dst13 + static_cast<size_t>(I) * H, src + (static_cast<size_t>(Is) + j * I) * H,
        static_cast<size_t>(I) * H * 2, cudaMemcpyDeviceToDevice, stream));
    MK_CUDA_CHECK(cudaMemcpy2DAsync(
        w2.as<__nv_bfloat16>() + (E + j) * expert2, static_cast<size_t>(I) * 2,
        shared_w2.as<__nv_bfloat16>() + static_cast<size_t>(j) * I, static_cast<size_t>(Is) * 2,
        static_cast<size_t>(I) * 2, H, cudaMemcpyDeviceToDevice, stream));
  }
}

// Every copy in the layer's stream, in order with the memsets before it and the kernels after.
// why not cudaMemcpy: it runs in the legacy default stream, which a non-blocking stream does not
// wait for, and from pageable memory it may return before its DMA lands.
void GpuMoeLayer::Impl::upload(const LayerWeights& w) {
  auto to_device = [&](void* dst, const void* src, size_t bytes) {
    MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  };
  const size_t router_elems = static_cast<size_t>(cols) * H;
  MK_CHECK(w.router_weight() != nullptr, "router weight of " << spec.name << " is missing");
  to_device(router_w.ptr, w.router_weight(), router_elems * dtype_size(spec.router_dtype));
  if (spec.has_router_bias) {
    MK_CHECK(w.router_bias() != nullptr, spec.name << " has a router bias but none was given");
    to_device(router_bias.ptr, w.router_bias(), E * sizeof(float));
  }
  if (spec.has_correction_bias) {
    MK_CHECK(w.correction_bias() != nullptr,
             spec.name << " has a correction bias but none was given");
    to_device(corr_bias.ptr, w.correction_bias(), E * sizeof(float));
  }
  const size_t expert13 = static_cast<size_t>(2) * I * H, expert2 = static_cast<size_t>(H) * I;
  // (MX: one expert in the kernels' layout, reused: from pageable memory a copy has taken the
  // bytes when it returns)
  std::vector<uint8_t> mx_w13(mx_experts() ? mx13_bytes() : 0);
  std::vector<uint8_t> mx_w2(mx_experts() ? mx2_bytes() : 0);
  std::vector<uint8_t> mx_scales13(mx_experts() ? mx13_scale_bytes() : 0);
  std::vector<uint8_t> mx_scales2(mx_experts() ? mx2_scale_bytes() : 0);
  for (int e = 0; e < rows_fused(); ++e) {
    const ExpertView v = w.expert(e);
    if (mx_experts()) {
      MK_CHECK(v.mx_format == mx && v.w13_mx != nullptr && v.w13_mx_scale != nullptr &&
                   v.w2_mx != nullptr && v.w2_mx_scale != nullptr,
               "expert " << e << " of " << spec.name << " has no " << expert_format_name(mx)
                         << " weights or scales");
      mx_tile_rows(mx, true, 2 * I, H, v.w13_mx, mx_w13.data());
      mx_tile_rows(mx, false, H, I, v.w2_mx, mx_w2.data());
      to_device(w13_mx.as<uint8_t>() + e * mx13_bytes(), mx_w13.data(), mx13_bytes());
      to_device(w2_mx.as<uint8_t>() + e * mx2_bytes(), mx_w2.data(), mx2_bytes());
      mx_tile_scales(mx, true, 2 * I, H, v.w13_mx_scale, mx_scales13.data());
      mx_tile_scales(mx, false, H, I, v.w2_mx_scale, mx_scales2.data());
      to_device(w13_mx_scale.as<uint8_t>() + e * mx_scales13.size(), mx_scales13.data(),
                mx_scales13.size());
      to_device(w2_mx_scale.as<uint8_t>() + e * mx_scales2.size(), mx_scales2.data(),
                mx_scales2.size());
    } else if (fp8) {
      MK_CHECK(v.w13_fp8 != nullptr && v.w13_scale != nullptr && v.w2_fp8 != nullptr &&
                   v.w2_scale != nullptr,
               "expert " << e << " of " << spec.name << " has no fp8 weights or scales");
      to_device(w13_fp8.as<uint8_t>() + e * expert13, v.w13_fp8, expert13);
      to_device(w13_scale.as<float>() + e * scales13(), v.w13_scale, scales13() * 4);
      to_device(w2_fp8.as<uint8_t>() + e * expert2, v.w2_fp8, expert2);
      to_device(w2_scale.as<float>() + e * scales2(), v.w2_scale, scales2() * 4);
    } else {
      MK_CHECK(v.w13 != nullptr && v.w2 != nullptr,
               "expert " << e << " of " << spec.name << " has no weights");
      to_device(w13.as<__nv_bfloat16>() + e * expert13, v.w13, expert13 * 2);
      to_device(w2.as<__nv_bfloat16>() + e * expert2, v.w2, expert2 * 2);
    }
    if (spec.has_expert_bias && v.b13 != nullptr) {
      to_device(b13.as<float>() + e * static_cast<size_t>(2) * I, v.b13,
                static_cast<size_t>(2) * I * sizeof(float));
    }
    if (spec.has_expert_bias && v.b2 != nullptr) {
      to_device(b2.as<float>() + e * static_cast<size_t>(H), v.b2,
                static_cast<size_t>(H) * sizeof(float));
    }
  }
  if (mx_experts()) {
    to_kernel_order(w13_mx.as<uint8_t>(), w13_mx.bytes, mx, stream);
    to_kernel_order(w2_mx.as<uint8_t>(), w2_mx.bytes, mx, stream);
  }
  if (has_shared && !quantised()) {
    MK_CHECK(w.shared_w13() != nullptr && w.shared_w2() != nullptr,
             "shared expert weights of " << spec.name << " are missing");
    to_device(shared_w13.ptr, w.shared_w13(), shared_w13.bytes);
    to_device(shared_w2.ptr, w.shared_w2(), shared_w2.bytes);
  }
}

void GpuMoeLayer::Impl::fill_random(uint64_t seed) {
  namespace rv = random_values;
  using rv::Tensor;
  const size_t router_elems = static_cast<size_t>(cols) * H;
  if (spec.router_dtype == DType::F32) {
    fill_random_f32(router_w.as<float>(), router_elems, 1, seed, layer, Tensor::RouterWeight, -1,
                    rv::weight_scale(H), stream);
  } else {
    fill_random_bf16(router_w.as<__nv_bfloat16>(), router_elems, 1, seed, layer,
                     Tensor::RouterWeight, -1, rv::weight_scale(H), stream);
  }
  if (spec.has_correction_bias) {
    fill_random_f32(corr_bias.as<float>(), E, 1, seed, layer, Tensor::CorrectionBias, -1,
                    rv::kCorrectionBiasScale, stream);
  }
  if (spec.has_router_bias) {
    fill_random_f32(router_bias.as<float>(), E, 1, seed, layer, Tensor::RouterBias, -1,
                    rv::kBiasScale, stream);
  }
  if (mx_experts()) {
    // every row (the fused slots too) random codes, one exponent per matrix near weight_scale
    // over the format's largest element; the byte order is the kernels' by construction
    const int rows = rows_fused();
    fill_random_e4m3(w13_mx.as<uint8_t>(), mx13_bytes(), rows, seed, layer, Tensor::ExpertW13, 0,
                     stream);
    fill_random_e4m3(w2_mx.as<uint8_t>(), mx2_bytes(), rows, seed, layer, Tensor::ExpertW2, 0,
                     stream);
    MK_CUDA_CHECK(cudaMemsetAsync(w13_mx_scale.ptr, random_mx_exponent(mx, rv::weight_scale(H)),
                                  w13_mx_scale.bytes, stream));
    MK_CUDA_CHECK(cudaMemsetAsync(w2_mx_scale.ptr, random_mx_exponent(mx, rv::weight_scale(I)),
                                  w2_mx_scale.bytes, stream));
  } else if (fp8) {
    // every row (the fused slots too) random codes, every tile weight_scale / 448
    const int rows = rows_fused();
    fill_random_e4m3(w13_fp8.as<uint8_t>(), static_cast<size_t>(2) * I * H, rows, seed, layer,
                     Tensor::ExpertW13, 0, stream);
    fill_random_e4m3(w2_fp8.as<uint8_t>(), static_cast<size_t>(H) * I, rows, seed, layer,
                     Tensor::ExpertW2, 0, stream);
    fill_f32(w13_scale.as<float>(), rows * scales13(), rv::weight_scale(H) / 448.0f, stream);
    fill_f32(w2_scale.as<float>(), rows * scales2(), rv::weight_scale(I) / 448.0f, stream);
  } else {
    fill_random_bf16(w13.as<__nv_bfloat16>(), static_cast<size_t>(2) * I * H, E, seed, layer,
                     Tensor::ExpertW13, 0, rv::weight_scale(H), stream);
    fill_random_bf16(w2.as<__nv_bfloat16>(), static_cast<size_t>(H) * I, E, seed, layer,
                     Tensor::ExpertW2, 0, rv::weight_scale(I), stream);
  }
  if (spec.has_expert_bias) {
    fill_random_f32(b13.as<float>(), static_cast<size_t>(2) * I, E, seed, layer, Tensor::ExpertB13,
                    0, rv::kBiasScale, stream);
    fill_random_f32(b2.as<float>(), H, E, seed, layer, Tensor::ExpertB2, 0, rv::kBiasScale, stream);
  }
  if (has_shared && !quantised()) {
    fill_random_bf16(shared_w13.as<__nv_bfloat16>(), static_cast<size_t>(2) * Is * H, 1, seed,
                     layer, Tensor::SharedW13, -1, rv::weight_scale(H), stream);
    fill_random_bf16(shared_w2.as<__nv_bfloat16>(), static_cast<size_t>(H) * Is, 1, seed, layer,
                     Tensor::SharedW2, -1, rv::weight_scale(Is), stream);
  }
}

}  // namespace moekit::cuda
