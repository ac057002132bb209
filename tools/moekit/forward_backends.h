// Which backend runs a forward: the CLI's one switch over devices and CPU backends.
#pragma once

#include <string>

#include "moekit/layer.h"

namespace moekit::cli {

// "auto" -> "cuda" when moekit has CUDA and a GPU is usable, else "cpu"; "cuda" without a usable
// GPU is an error saying why.
std::string resolve_device(const std::string& requested);

// One layer forward on `device` ("cpu" with backend "fast" or "reference", or "cuda"). fp8:
// how fp8-held weights compute (the reference runs both modes, the fast backend weight-only).
ForwardResult forward_on(const std::string& device, const std::string& backend,
                         const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                         Fp8Compute fp8 = Fp8Compute::W8A8);

}  // namespace moekit::cli
