#include "forward_backends.h"

#include "cli_context.h"
#include "moekit/cpu_fast.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"

namespace moekit::cli {

std::string resolve_device(const std::string& requested) {
  if (requested == "cpu") return "cpu";
  std::string why;
  const bool gpu = cuda::available(&why);
  if (requested == "auto") return gpu ? "cuda" : "cpu";
  MK_CHECK(requested == "cuda", "--device '" << requested << "' is not one of auto, cpu, cuda");
  MK_CHECK(gpu, "--device cuda: CUDA is unavailable: " << why);
  return "cuda";
}

ForwardResult forward_on(const std::string& device, const std::string& backend,
                         const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                         Fp8Compute fp8) {
  const bool fp8_weights = w.expert_format() == ExpertFormat::Fp8Block;
  if (device == "cuda") return cuda::forward_once(w, x, tokens, fuse, env_overrides());
  if (backend == "reference") return cpu_reference::forward(w, x, tokens, fuse, fp8);
  MK_CHECK(backend == "fast", "--backend '" << backend << "' is not one of fast, reference");
  MK_CHECK(!fp8_weights || fp8 == Fp8Compute::WeightOnly,
           "the fast CPU backend runs fp8 experts weight-only, not "
               << fp8_compute_name(fp8) << " (--fp8-compute weight-only, or --backend reference)");
  return cpu_fast::forward(w, x, tokens, fuse);
}

}  // namespace moekit::cli
