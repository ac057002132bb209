// GpuMoeLayer (include/moekit/cuda_layer.h): one MoE layer on the GPU, the op layer of the CUDA
// backend. It validates the spec against the kernels' limits once, holds the weights and a
// workspace sized for max_tokens (layer_impl.h), and runs a forward as the plan's fixed sequence
// of launches with no host synchronisation (layer_forward.cu), so a CUDA graph can capture it.
// `moekit plan` prints what a forward runs; `moekit bench --device cuda` measures fused and
// unfused side by side per batch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/layer/layer_impl.h"
#include "cuda/router_gemm/router_gemm.h"
#include "moekit/error.h"
#include "moekit/memory_estimate.h"

namespace moekit::cuda {

GpuMoeLayer::Impl::~Impl() {
  if (stream != nullptr) MK_CUDA_WARN(cudaStreamDestroy(stream));
}

void GpuMoeLayer::Impl::validate() const {
  validate_spec(spec);
  MK_CHECK(opt.max_tokens >= 1, "expected max_tokens >= 1, got " << opt.max_tokens);
  MK_CHECK(E >= 1 && E <= kRoutingMaxExperts,
           "GPU routing takes 1.." << kRoutingMaxExperts << " experts, got " << E);
  MK_CHECK(H % 64 == 0, "GPU experts need hidden % 64 == 0, got hidden " << H);
  MK_CHECK(I % 64 == 0, "GPU experts need expert_intermediate % 64 == 0, got " << I);
  MK_CHECK(!has_shared || Is % 64 == 0,
           "GPU shared MLP needs shared_intermediate % 64 == 0, got " << Is);
  MK_CHECK(spec.top_k + S <= 32,
           "GPU routing holds top_k + shared slots <= 32, got " << spec.top_k << " + " << S);
  MK_CHECK(spec.n_group <= 32, "GPU routing takes n_group <= 32, got " << spec.n_group);
  MK_CHECK(E + S <= kAlignMaxRows,
           "GPU dispatch counts <= " << kAlignMaxRows << " weight rows, got " << E + S);
  MK_CHECK(spec.router_dtype == DType::BF16 || spec.router_dtype == DType::F32,
           "expected router dtype BF16 or F32, got " << dtype_name(spec.router_dtype));
  MK_CHECK(opt.expert_dtype == DType::BF16 || opt.expert_dtype == DType::F8_E4M3,
           "the GPU layer holds BF16 or F8_E4M3 experts, not " << dtype_name(opt.expert_dtype));
  MK_CHECK(opt.mx_format == ExpertFormat::Bf16 ||
               ((opt.mx_format == ExpertFormat::Mxfp4 || opt.mx_format == ExpertFormat::Mxfp8) &&
                opt.expert_dtype == DType::BF16),
           "GpuLayerOptions::mx_format is Bf16, Mxfp4 or Mxfp8 (with expert_dtype BF16), got "
               << expert_format_name(opt.mx_format) << " with " << dtype_name(opt.expert_dtype));
  if (mx_experts()) {
    MK_CHECK(!has_shared || can_fuse,
             expert_format_name(mx)
                 << " experts on the GPU run the shared expert as fused slots, "
                    "but the shared width "
                 << Is << " of " << spec.name << " is not a whole multiple of " << I);
  }
  if (fp8) {
    MK_CHECK(H % 128 == 0 && I % 128 == 0,
             "fp8 experts on the GPU need hidden and expert_intermediate multiples of 128 (whole "
             "128 x 128 tiles), got hidden "
                 << H << ", expert_intermediate " << I);
    MK_CHECK(!has_shared || can_fuse,
             "fp8 experts on the GPU run the shared expert as fused slots, but the shared width "
                 << Is << " of " << spec.name << " is not a whole multiple of " << I);
  }
}

void GpuMoeLayer::Impl::init_shapes() {
  E = spec.num_experts;
  H = spec.hidden;
  I = spec.expert_intermediate;
  K = spec.top_k;
  cols = spec.router_columns();
  fp8 = opt.expert_dtype == DType::F8_E4M3;
  mx = opt.mx_format;
  has_shared = spec.shared_kind != SharedKind::None && spec.shared_intermediate > 0;
  Is = has_shared ? spec.shared_intermediate : 0;
  can_fuse = spec.can_fuse_shared();
  S = can_fuse ? spec.shared_slots() : 0;
  cfg_unfused = RoutingConfig::from_spec(spec, false);
  if (can_fuse) cfg_fused = RoutingConfig::from_spec(spec, true);
  slice_count = E;
  const size_t pairs = static_cast<size_t>(std::max(opt.max_tokens, 1)) * (K + S);
  max_tasks = max_routed_tasks(static_cast<int>(pairs), rows_fused(), 8);
}

namespace {

std::unique_ptr<GpuMoeLayer::Impl> make_impl(const MoeSpec& spec, int layer,
                                             const GpuLayerOptions& opt) {
  auto impl = std::make_unique<GpuMoeLayer::Impl>();
  impl->spec = spec;
  impl->layer = layer;
  impl->opt = opt;
  impl->init_shapes();
  impl->validate();
  std::string why;
  MK_CHECK(available(&why, opt.device), "no usable GPU: " << why);
  impl->device = live_device_info(opt.device);
  size_t free_b = 0, total_b = 0;
  MK_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = gpu_layer_device_bytes(spec, opt.max_tokens, opt.expert_dtype, opt.mx_format,
                                             impl->plan_at_max().grouped_mx_chunk);
  MK_CHECK(need <= free_b, "a GPU layer of " << spec.name << " for max_tokens " << opt.max_tokens
                                             << " needs " << need << " bytes of device memory; "
                                             << free_b << " of " << total_b
                                             << " are free on device " << opt.device);
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  impl->allocate_weights();
  return impl;
}

}  // namespace

GpuMoeLayer::GpuMoeLayer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GpuMoeLayer::~GpuMoeLayer() {
  if (impl_ == nullptr) return;
  // frees the layer's memory and stream on its device, then restores the caller's
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  const int device = impl_->opt.device;
  if (previous != device) MK_CUDA_WARN(cudaSetDevice(device));
  impl_.reset();
  if (previous >= 0 && previous != device) MK_CUDA_WARN(cudaSetDevice(previous));
}

std::unique_ptr<GpuMoeLayer> GpuMoeLayer::create(const LayerWeights& w,
                                                 const GpuLayerOptions& opt) {
  DeviceGuard guard(opt.device);
  const bool mx_weights =
      w.expert_format() == ExpertFormat::Mxfp4 || w.expert_format() == ExpertFormat::Mxfp8;
  MK_CHECK(opt.expert_dtype == DType::BF16 || opt.expert_dtype == w.expert_dtype(),
           "GpuLayerOptions::expert_dtype " << dtype_name(opt.expert_dtype)
                                            << " disagrees with the weights' "
                                            << dtype_name(w.expert_dtype()));
  MK_CHECK(opt.mx_format == ExpertFormat::Bf16 || opt.mx_format == w.expert_format(),
           "GpuLayerOptions::mx_format " << expert_format_name(opt.mx_format)
                                         << " disagrees with the weights' "
                                         << expert_format_name(w.expert_format()));
  GpuLayerOptions held = opt;
  held.expert_dtype = w.expert_dtype();  // the layer holds what the weights hold
  held.mx_format = mx_weights ? w.expert_format() : ExpertFormat::Bf16;
  auto impl = make_impl(w.spec(), w.layer(), held);
  impl->upload(w);
  impl->prepare_kernels();
  impl->allocate_workspace();
  MK_CUDA_CHECK(cudaStreamSynchronize(impl->stream));
  return std::unique_ptr<GpuMoeLayer>(new GpuMoeLayer(std::move(impl)));
}

std::unique_ptr<GpuMoeLayer> GpuMoeLayer::create_random(const MoeSpec& spec, int layer,
                                                        uint64_t seed, const GpuLayerOptions& opt) {
  MK_CHECK(spec.is_moe_layer(layer),
           "layer " << layer << " of " << spec.name << " is not an MoE layer");
  DeviceGuard guard(opt.device);
  auto impl = make_impl(spec, layer, opt);
  impl->fill_random(seed);
  // (fp8 and MX: every row, the fused slots too, is filled as a routed expert's)
  if (impl->can_fuse && !impl->quantised()) impl->repack_slots_on_device();
  impl->prepare_kernels();
  impl->allocate_workspace();
  MK_CUDA_CHECK(cudaStreamSynchronize(impl->stream));
  return std::unique_ptr<GpuMoeLayer>(new GpuMoeLayer(std::move(impl)));
}

const MoeSpec& GpuMoeLayer::spec() const { return impl_->spec; }
int GpuMoeLayer::layer() const { return impl_->layer; }
int GpuMoeLayer::max_tokens() const { return impl_->opt.max_tokens; }
size_t GpuMoeLayer::weight_bytes() const { return impl_->weight_bytes; }
size_t GpuMoeLayer::workspace_bytes() const { return impl_->workspace_bytes; }

bool GpuMoeLayer::resolve_fused(FuseShared fuse, int tokens) const {
  return impl_->plan_for(std::max(tokens, 1), fuse).fused;
}

plan::LayerPlan GpuMoeLayer::plan(int tokens, FuseShared fuse) const {
  return impl_->plan_for(tokens, fuse);
}

void GpuMoeLayer::forward_device(const void* x, void* y, int tokens, FuseShared fuse,
                                 CUstream_st* stream) {
  DeviceGuard guard(impl_->opt.device);
  impl_->forward_device(x, y, tokens, fuse, stream);
}

void GpuMoeLayer::forward_device(const void* x, void* y, int tokens, CUstream_st* stream) {
  forward_device(x, y, tokens, impl_->opt.fuse, stream);
}

ForwardResult GpuMoeLayer::forward(const Bf16* x, int tokens, FuseShared fuse) {
  Impl& m = *impl_;
  MK_CHECK(tokens >= 0 && tokens <= m.opt.max_tokens,
           "expected 0 <= tokens <= max_tokens (" << m.opt.max_tokens << "), got " << tokens);
  check_finite_input(x, tokens, m.H);
  DeviceGuard guard(m.opt.device);
  const bool fused = tokens > 0 && m.plan_for(tokens, fuse).fused;
  const int slots = m.K + (fused ? m.S : 0);
  const size_t n_x = static_cast<size_t>(tokens) * m.H;
  const size_t n_pairs = static_cast<size_t>(tokens) * slots;

  ForwardResult r;
  r.tokens = tokens;
  r.hidden = m.H;
  r.fused = fused;
  r.routing.tokens = tokens;
  r.routing.slots = slots;
  if (tokens == 0) return r;

  // poison every output, so an unwritten element shows as NaN / -1
  MK_CUDA_CHECK(cudaMemcpyAsync(m.x_in.ptr, x, n_x * 2, cudaMemcpyHostToDevice, m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.y_out.ptr, 0xff, n_x * 2, m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.ws.ids, 0xff, n_pairs * 4, m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.ws.weights, 0xff, n_pairs * 4, m.stream));
  MK_CUDA_CHECK(
      cudaMemsetAsync(m.ws.shared_scale, 0xff, static_cast<size_t>(tokens) * 4, m.stream));
  MK_CUDA_CHECK(cudaMemsetAsync(m.ws.status, 0, 4, m.stream));
  m.forward_device(m.x_in.ptr, m.y_out.ptr, tokens, fuse, m.stream);

  std::vector<uint16_t> y16(n_x);
  r.routing.ids.resize(n_pairs);
  r.routing.weights.resize(n_pairs);
  int error = 0;
  MK_CUDA_CHECK(
      cudaMemcpyAsync(y16.data(), m.y_out.ptr, n_x * 2, cudaMemcpyDeviceToHost, m.stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(r.routing.ids.data(), m.ws.ids, n_pairs * 4,
                                cudaMemcpyDeviceToHost, m.stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(r.routing.weights.data(), m.ws.weights, n_pairs * 4,
                                cudaMemcpyDeviceToHost, m.stream));
  MK_CUDA_CHECK(cudaMemcpyAsync(&error, m.ws.status, 4, cudaMemcpyDeviceToHost, m.stream));
  if (m.has_shared) {
    r.routing.shared_scale.resize(tokens);
    MK_CUDA_CHECK(cudaMemcpyAsync(r.routing.shared_scale.data(), m.ws.shared_scale,
                                  static_cast<size_t>(tokens) * 4, cudaMemcpyDeviceToHost,
                                  m.stream));
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  MK_CHECK(error == 0, "GPU routing produced an expert id outside [0, "
                           << m.E + (fused ? m.S : 0) << ") (dispatch dropped it)");
  r.y.resize(n_x);
  for (size_t i = 0; i < n_x; ++i) r.y[i] = bf16_to_float(Bf16{y16[i]});
  return r;
}

LaunchCount GpuMoeLayer::count_launches(int tokens, bool fused) {
  Impl& m = *impl_;
  DeviceGuard guard(m.opt.device);
  cudaGraph_t graph = nullptr;
  MK_CUDA_CHECK(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
  try {
    m.forward_device(m.x_in.ptr, m.y_out.ptr, tokens, fused ? FuseShared::On : FuseShared::Off,
                     m.stream);
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(m.stream, &broken);
    if (broken != nullptr) (void)cudaGraphDestroy(broken);
    throw;
  }
  MK_CUDA_CHECK(cudaStreamEndCapture(m.stream, &graph));
  size_t n = 0;
  MK_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  MK_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  LaunchCount c;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    MK_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) {
      ++c.kernels;
    } else {
      ++c.other_nodes;
    }
  }
  MK_CUDA_CHECK(cudaGraphDestroy(graph));
  return c;
}

MoeStatus GpuMoeLayer::read_status(CUstream_st* stream, bool clear) {
  Impl& m = *impl_;
  DeviceGuard guard(m.opt.device);
  int word = 0;
  MK_CUDA_CHECK(cudaMemcpyAsync(&word, m.ws.status, sizeof(int), cudaMemcpyDeviceToHost, stream));
  if (clear) MK_CUDA_CHECK(cudaMemsetAsync(m.ws.status, 0, sizeof(int), stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  MoeStatus s;
  s.expert_id_out_of_range = (word & 1) != 0;
  return s;
}

void GpuMoeLayer::set_trace(unsigned long long* words) { impl_->trace = words; }

std::vector<float> GpuMoeLayer::last_logits(int tokens) const {
  const Impl& m = *impl_;
  MK_CHECK(tokens >= 0 && tokens <= m.opt.max_tokens,
           "expected 0 <= tokens <= max_tokens (" << m.opt.max_tokens << "), got " << tokens);
  std::vector<float> out(static_cast<size_t>(tokens) * m.cols);
  DeviceGuard guard(m.opt.device);
  MK_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.ws.logits, out.size() * sizeof(float),
                                cudaMemcpyDeviceToHost, m.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return out;
}

ForwardResult forward_once(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                           const plan::PlanOverrides& overrides) {
  GpuLayerOptions opt;
  opt.max_tokens = std::max(tokens, 1);
  opt.overrides = overrides;
  // Random weights are regenerated on the device: uploading would materialise every expert on
  // the host (22.6 GB for DeepSeek-V3).
  if (const std::optional<uint64_t> seed = w.random_seed()) {
    return GpuMoeLayer::create_random(w.spec(), w.layer(), *seed, opt)->forward(x, tokens, fuse);
  }
  return GpuMoeLayer::create(w, opt)->forward(x, tokens, fuse);
}

plan::DeviceInfo live_device_info(int device) {
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  plan::DeviceInfo d;
  d.name = prop.name;
  d.sms = prop.multiProcessorCount;
  d.arch = tuning::arch_from_compute_capability(prop.major, prop.minor);
  return plan::with_measured_facts(d);
}

bool available(std::string* why, int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why)
      *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
             cudaGetErrorString(err) + ")";
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device found";
    return false;
  }
  if (device < 0 || device >= count) {
    if (why) {
      *why = "device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
             " CUDA device" + (count == 1 ? "" : "s") + ")";
    }
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = "cudaGetDeviceProperties(" + std::to_string(device) + ") failed";
    return false;
  }
  if (prop.major != 9) {
    if (why) {
      *why = "device " + std::to_string(device) + " (" + prop.name + ") is sm_" +
             std::to_string(prop.major) + std::to_string(prop.minor) +
             "; moekit's kernels are built for sm_90a";
    }
    return false;
  }
  if (why) why->clear();
  return true;
}

}  // namespace moekit::cuda
