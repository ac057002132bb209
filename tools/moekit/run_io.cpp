// Input and output files of `moekit run` (run_io.h), through moekit's own safetensors reader and
// writer (src/io/safetensors.cpp).
#include "run_io.h"

#include <cstring>
#include <map>

#include "moekit/error.h"
#include "moekit/safetensors.h"

namespace moekit::cli {

std::vector<Bf16> read_run_input(const std::string& path, const MoeSpec& spec, int& tokens) {
  const SafetensorsFile file(path);
  const std::vector<std::string> names = file.names();
  std::string name = "x";
  if (!file.contains(name)) {
    std::string listed;
    for (const std::string& n : names) listed += (listed.empty() ? "'" : ", '") + n + "'";
    MK_CHECK(names.size() == 1, "--input "
                                    << path << ": no tensor 'x' and "
                                    << (names.empty() ? "no tensors" : "several tensors: " + listed)
                                    << "; name the input x");
    name = names.front();
  }
  const SafetensorsTensorInfo& info = file.info(name);
  MK_CHECK(info.dtype_supported && (info.dtype == DType::BF16 || info.dtype == DType::F32),
           "--input " << path << ": tensor '" << name << "' must be BF16 or F32, got "
                      << info.dtype_name);
  MK_CHECK(info.shape.size() == 2 && info.shape[1] == spec.hidden,
           "--input " << path << ": tensor '" << name << "' must have shape [tokens, "
                      << spec.hidden << "] (hidden size of " << spec.name << "), got rank "
                      << info.shape.size()
                      << (info.shape.size() == 2 ? ", width " + std::to_string(info.shape[1])
                                                 : std::string()));
  MK_CHECK(info.shape[0] >= 1 && info.shape[0] <= (1 << 24),
           "--input " << path << ": tensor '" << name << "' must hold 1 to " << (1 << 24)
                      << " tokens, got " << info.shape[0]);
  tokens = static_cast<int>(info.shape[0]);
  const size_t count = static_cast<size_t>(tokens) * spec.hidden;
  std::vector<Bf16> x(count);
  if (info.dtype == DType::BF16) {
    std::memcpy(x.data(), file.data(name), count * sizeof(Bf16));
  } else {
    const auto* src = static_cast<const uint8_t*>(file.data(name));
    for (size_t i = 0; i < count; ++i) {
      float v;
      std::memcpy(&v, src + 4 * i, 4);  // the mapping may not be 4-byte aligned
      x[i] = float_to_bf16(v);
    }
  }
  return x;
}

void write_run_output(const std::string& path, const MoeSpec& spec, const ForwardResult& r,
                      const std::vector<float>& router_logits,
                      const std::map<std::string, std::string>& metadata) {
  const int T = r.tokens, k = spec.top_k, slots = r.routing.slots;
  MK_CHECK(slots >= k && r.routing.tokens == T,
           "internal: routing of " << r.routing.tokens << " tokens x " << slots << " slots for "
                                   << T << " tokens, top-k " << k);
  // The routed slots come first in every token's row; fused shared slots follow them.
  std::vector<int32_t> ids(static_cast<size_t>(T) * k);
  std::vector<float> weights(ids.size());
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      ids[static_cast<size_t>(t) * k + j] = r.routing.ids[static_cast<size_t>(t) * slots + j];
      weights[static_cast<size_t>(t) * k + j] =
          r.routing.weights[static_cast<size_t>(t) * slots + j];
    }
  }
  const int64_t columns = spec.router_columns();
  MK_CHECK(router_logits.size() == static_cast<size_t>(T) * columns,
           "internal: " << router_logits.size() << " router logits for " << T << " x " << columns);
  std::map<std::string, SafetensorsWriteTensor> tensors;
  tensors["y"] = {DType::F32, {T, spec.hidden}, as_bytes_span(r.y.data(), r.y.size())};
  tensors["topk_ids"] = {DType::F32, {T, k}, as_bytes_span(ids.data(), ids.size())};
  tensors["topk_weights"] = {DType::F32, {T, k}, as_bytes_span(weights.data(), weights.size())};
  tensors["router_logits"] = {
      DType::F32, {T, columns}, as_bytes_span(router_logits.data(), router_logits.size())};
  write_safetensors(path, tensors, metadata, {{"topk_ids", "I32"}});
}

}  // namespace moekit::cli
