// The public moekit::cuda layer API in a build without CUDA: available() says why, every other
// entry point throws "moekit was built without CUDA", so callers link and fail clearly at run time.
#include "moekit/cuda_layer.h"
#include "moekit/error.h"

namespace moekit::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  MK_FAIL(what << ": moekit was built without CUDA (configure with -DMOEKIT_CUDA=ON)");
}
}  // namespace

bool available(std::string* why, int) {
  if (why) *why = "moekit was built without CUDA (configure with -DMOEKIT_CUDA=ON)";
  return false;
}

struct GpuMoeLayer::Impl {};

GpuMoeLayer::GpuMoeLayer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuMoeLayer::~GpuMoeLayer() = default;

std::unique_ptr<GpuMoeLayer> GpuMoeLayer::create(const LayerWeights&, const GpuLayerOptions&) {
  no_cuda("GpuMoeLayer::create");
}
std::unique_ptr<GpuMoeLayer> GpuMoeLayer::create_random(const MoeSpec&, int, uint64_t,
                                                        const GpuLayerOptions&) {
  no_cuda("GpuMoeLayer::create_random");
}
const MoeSpec& GpuMoeLayer::spec() const { no_cuda("GpuMoeLayer::spec"); }
int GpuMoeLayer::layer() const { no_cuda("GpuMoeLayer::layer"); }
int GpuMoeLayer::max_tokens() const { no_cuda("GpuMoeLayer::max_tokens"); }
size_t GpuMoeLayer::weight_bytes() const { no_cuda("GpuMoeLayer::weight_bytes"); }
size_t GpuMoeLayer::workspace_bytes() const { no_cuda("GpuMoeLayer::workspace_bytes"); }
bool GpuMoeLayer::resolve_fused(FuseShared, int) const { no_cuda("GpuMoeLayer::resolve_fused"); }
plan::LayerPlan GpuMoeLayer::plan(int, FuseShared) const { no_cuda("GpuMoeLayer::plan"); }
plan::DeviceInfo live_device_info(int) { no_cuda("cuda::live_device_info"); }
ForwardResult GpuMoeLayer::forward(const Bf16*, int, FuseShared) {
  no_cuda("GpuMoeLayer::forward");
}
void GpuMoeLayer::forward_device(const void*, void*, int, FuseShared, CUstream_st*) {
  no_cuda("GpuMoeLayer::forward_device");
}
void GpuMoeLayer::forward_device(const void*, void*, int, CUstream_st*) {
  no_cuda("GpuMoeLayer::forward_device");
}
LaunchCount GpuMoeLayer::count_launches(int, bool) { no_cuda("GpuMoeLayer::count_launches"); }

std::vector<float> GpuMoeLayer::last_logits(int) const { no_cuda("GpuMoeLayer::last_logits"); }
void GpuMoeLayer::set_trace(unsigned long long*) { no_cuda("GpuMoeLayer::set_trace"); }
MoeStatus GpuMoeLayer::read_status(CUstream_st*, bool) { no_cuda("GpuMoeLayer::read_status"); }
Routing route_on_device(const RoutingConfig&, const float*, int, const float*, int, GpuDispatch*) {
  no_cuda("cuda::route_on_device");
}

ForwardResult forward_once(const LayerWeights&, const Bf16*, int, FuseShared,
                           const plan::PlanOverrides&) {
  no_cuda("cuda::forward_once");
}

std::vector<GpuBenchRecord> bench_layer(const GpuBenchOptions&, bool) { no_cuda("bench_layer"); }
double measure_read_bandwidth(size_t, int) { no_cuda("measure_read_bandwidth"); }
GroupedGemmBenchRun bench_grouped_gemms(const GroupedGemmBenchOptions&) {
  no_cuda("bench_grouped_gemms");
}
std::vector<StreamProbeConfig> stream_probe_configs() { no_cuda("stream_probe_configs"); }
void check_stream_probe_config(const StreamProbeConfig&) { no_cuda("check_stream_probe_config"); }
StreamProbeRun bench_stream(const std::vector<StreamProbeConfig>&, size_t, int, int) {
  no_cuda("bench_stream");
}
uint32_t stream_probe_checksum(const StreamProbeConfig&, const void*, size_t, size_t*) {
  no_cuda("stream_probe_checksum");
}

}  // namespace moekit::cuda
