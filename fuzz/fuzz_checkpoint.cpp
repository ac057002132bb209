// libFuzzer target: bytes -> a one-file checkpoint directory -> load_checkpoint_weights for a tiny
// spec of one family (chosen by the input's last byte) -> every expert materialised -> one token
// through the reference layer, fused and unfused.
//
// This walks the checkpoint name mapping (family namings, per-expert / stacked / gpt-oss forms,
// fp8 block scales, MXFP4 blocks) with hostile shapes, dtypes and offsets. Contract checked: each
// step either throws moekit::Error or succeeds, and a successful forward routes only to weight
// rows that exist. The selector byte sits in the data section's tail, which the format allows.
// Seeds: fuzz_make_seeds writes each family's tiny checkpoint in several forms.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/weights.h"

namespace {

[[noreturn]] void fail(const char* what, long long value) {
  std::fprintf(stderr, "fuzz_checkpoint: invariant broken: %s (%lld)\n", what, value);
  __builtin_trap();
}

const std::vector<moekit::MoeSpec>& specs() {
  static const std::vector<moekit::MoeSpec> kSpecs = [] {
    std::vector<moekit::MoeSpec> v;
    for (const std::string& m : moekit::fuzz::checkpoint_models())
      v.push_back(moekit::fuzz::tiny_spec(m));
    return v;
  }();
  return kSpecs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string dir = moekit::fuzz::scratch_path("checkpoint");
  const moekit::MoeSpec& spec = specs()[data[size - 1] % specs().size()];
  moekit::fuzz::write_file(dir + "/model.safetensors", data, size);
  try {
    const auto w = moekit::load_checkpoint_weights(spec, spec.moe_layers.front(), dir);
    const int rows = spec.weight_rows(spec.can_fuse_shared());
    for (int e = 0; e < rows; ++e) w->expert(e);
    std::vector<moekit::Bf16> x(spec.hidden);
    for (int h = 0; h < spec.hidden; ++h) x[h] = moekit::float_to_bf16(0.25f * (h % 7) - 0.75f);
    for (moekit::FuseShared fuse : {moekit::FuseShared::Auto, moekit::FuseShared::Off}) {
      const moekit::ForwardResult r = moekit::cpu_reference::forward(*w, x.data(), 1, fuse);
      if (r.y.size() != static_cast<size_t>(spec.hidden)) fail("output size", r.y.size());
      for (int32_t id : r.routing.ids)
        if (id < 0 || id >= spec.weight_rows(r.fused)) fail("expert id outside weight rows", id);
    }
  } catch (const moekit::Error&) {
  }
  return 0;
}
