// Router GEMM tuning, host side: names, legality, the candidate generator, the table lookup, the
// override file (JSON) and the .inc writer. No CUDA here, so the lookup order is tested on the CPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/json_safe.h"
#include "common/regular_file.h"
#include "common/text_escape.h"
#include "moekit/error.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"
#include "tuning/router_gemm_variants.h"

namespace moekit::tuning {

// ---- names ----

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Generic:
      return "generic";
    case Arch::Sm90:
      return "sm90";
    case Arch::Sm100:
      return "sm100";
  }
  return "?";
}

Arch parse_arch(std::string_view name) {
  if (name == "generic") return Arch::Generic;
  if (name == "sm90") return Arch::Sm90;
  if (name == "sm100") return Arch::Sm100;
  MK_FAIL("unknown architecture '" << name << "' (expected generic, sm90 or sm100)");
}

Arch arch_from_compute_capability(int major, int /*minor*/) {
  // why: sm_90 tables are measured on H100/H200; sm_100 covers B200/GB200 (10.x). Consumer
  // Blackwell (12.x) has other limits (no clusters > 8? smaller smem), so it takes generic.
  if (major == 9) return Arch::Sm90;
  if (major == 10) return Arch::Sm100;
  return Arch::Generic;
}

const char* backend_name(RouterGemmBackend b) {
  switch (b) {
    case RouterGemmBackend::Naive:
      return "naive";
    case RouterGemmBackend::Dot:
      return "dot";
    case RouterGemmBackend::SplitK:
      return "splitk";
    case RouterGemmBackend::Cublas:
      return "cublas";
  }
  return "?";
}

RouterGemmBackend parse_backend(std::string_view name) {
  if (name == "naive") return RouterGemmBackend::Naive;
  if (name == "dot") return RouterGemmBackend::Dot;
  if (name == "splitk") return RouterGemmBackend::SplitK;
  if (name == "cublas") return RouterGemmBackend::Cublas;
  MK_FAIL("unknown router GEMM backend '" << name
                                          << "' (expected naive, dot, splitk or cublas)");
}

const char* source_name(ConfigSource s) {
  switch (s) {
    case ConfigSource::Override:
      return "override";
    case ConfigSource::ArchTable:
      return "arch table";
    case ConfigSource::GenericTable:
      return "generic table";
    case ConfigSource::Fallback:
      return "fallback";
  }
  return "?";
}

std::string describe(const RouterGemmConfig& c) {
  std::ostringstream os;
  os << backend_name(c.backend);
  if (c.backend == RouterGemmBackend::Dot || c.backend == RouterGemmBackend::SplitK) {
    os << " block=" << c.block << " tile_n=" << c.tile_n << " tile_m=" << c.tile_m
       << " split_k=" << c.split_k;
  }
  return os.str();
}

std::string describe(const RouterGemmShape& s) {
  std::ostringstream os;
  os << dtype_name(s.weight_dtype) << " K=" << s.k << " N=" << s.n << (s.has_bias ? " +bias" : "");
  return os.str();
}

std::vector<RouterGemmShape> router_gemm_shapes(const MoeSpec& spec) {
  MK_CHECK(spec.hidden > 0 && spec.router_columns() > 0,
           "router_gemm_shapes: expected hidden > 0 and router columns > 0, got hidden="
               << spec.hidden << " columns=" << spec.router_columns() << " in " << spec.name);
  std::vector<RouterGemmShape> shapes;
  // Every MoE layer's gate. All layers of one spec share the shape today; walking the layers keeps
  // this right if a spec ever varies them.
  for (size_t i = 0; i < spec.moe_layers.size(); ++i) {
    RouterGemmShape s{spec.router_dtype, spec.hidden, spec.router_columns(), spec.has_router_bias};
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
  }
  return shapes;
}

// ---- legality and candidates ----

const char* router_gemm_config_problem(const RouterGemmConfig& c, DType weight_dtype, int k, int n,
                                       int m) {
  return detail::config_problem(c, weight_dtype, k, n, m);
}

namespace {

int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

}  // namespace

std::vector<RouterGemmConfig> router_gemm_candidates(DType weight_dtype, int k, int n, int m) {
  std::vector<RouterGemmConfig> out;
  auto add = [&](const RouterGemmConfig& c) {
    if (detail::config_problem(c, weight_dtype, k, n, m) == nullptr) out.push_back(c);
  };
  const int m_pow2 = next_pow2(std::max(m, 1));
  // Dot. why tile_m <= next_pow2(M): a larger token tile only idles lanes and spends registers.
  // why bf16 M <= 64 only: past that the dot kernel re-reads the weights M / 8 times (from L2)
  // where split-K's tensor cores read them once per 32 tokens; fp32 weights have no mma path.
// Split dot (K over a cluster of 2..8 CTAs): why M <= 16 only: it exists for latency at decode,
// where one CTA per column tile leaves ~1 CTA per SM; why split * block * 4 <= K: at least half
// the threads of every CTA get a 16-byte vector (8 elements), else the split only adds idle
// CTAs (DeepSeek-V3's K = 7168 still takes split 8 at block 128); why
// block >= 128: 64-thread CTAs split further would hit the SM's CTA limit before filling it
// (and keep the tuner's run time in bounds).
#define MK_ROUTER_GEMM_DOT_CAND_(TN, TM)                                                 \
  if ((TM) <= m_pow2 && (weight_dtype == DType::F32 || m <= 64)) {                       \
    for (int block : {64, 128, 256}) {                                                   \
      for (int split : {1, 2, 4, 8}) {                                                   \
        if (split == 1 || (m <= 16 && block >= 128 && split * block * 4LL <= k))         \
          add({RouterGemmBackend::Dot, block, TN, TM, split});                           \
      }                                                                                  \
    }                                                                                    \
  }
  MK_ROUTER_GEMM_DOT_VARIANTS(MK_ROUTER_GEMM_DOT_CAND_)
#undef MK_ROUTER_GEMM_DOT_CAND_
  // Split-K. why tile_m <= max(8, next_pow2(M)): as above (8 is the smallest mma tile).
  // why tile_n 32 only when N >= 32: a 32-expert warp tile over fewer experts idles mma rows.
  // why split_k * warps <= K / 32: every warp needs at least one 32-wide K chunk, else it only
  // adds a CTA that waits at the cluster barrier.
#define MK_ROUTER_GEMM_SPLITK_CAND_(TN, TM)                                        \
  if ((TM) <= std::max(8, m_pow2) && ((TN) == 16 || n >= 32)) {                    \
    for (int block : {128, 256}) {                                                 \
      for (int split : {1, 2, 4, 8}) {                                             \
        if (split * (block / 32) <= std::max(1, k / 32))                           \
          add({RouterGemmBackend::SplitK, block, TN, TM, split});                  \
      }                                                                            \
    }                                                                              \
  }
  MK_ROUTER_GEMM_SPLITK_VARIANTS(MK_ROUTER_GEMM_SPLITK_CAND_)
#undef MK_ROUTER_GEMM_SPLITK_CAND_
  add({RouterGemmBackend::Cublas, 0, 0, 0, 1});
  // why naive only when nothing else runs: one thread walks a whole weight row, never faster.
  if (out.size() <= 1) add(router_gemm_fallback());
  return out;
}

// ---- lookup ----

namespace {

bool row_matches(const RouterGemmRow& r, DType dt, int k, int n, int m) {
  return r.weight_dtype == dt && (r.k == 0 || r.k == k) && (r.n == 0 || r.n == n) &&
         r.m_min <= m && m <= r.m_max &&
         detail::config_problem(r.config, dt, k, n, m) == nullptr;
}

int find_row(std::span<const RouterGemmRow> rows, DType dt, int k, int n, int m) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (row_matches(rows[i], dt, k, n, m)) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

RouterGemmChoice choose_router_gemm(std::span<const RouterGemmRow> overrides,
                                    std::span<const RouterGemmRow> arch_rows,
                                    std::span<const RouterGemmRow> generic_rows, DType dt, int k,
                                    int n, int m) {
  if (int i = find_row(overrides, dt, k, n, m); i >= 0) {
    return {overrides[i].config, ConfigSource::Override, i};
  }
  if (int i = find_row(arch_rows, dt, k, n, m); i >= 0) {
    return {arch_rows[i].config, ConfigSource::ArchTable, i};
  }
  if (int i = find_row(generic_rows, dt, k, n, m); i >= 0) {
    return {generic_rows[i].config, ConfigSource::GenericTable, i};
  }
  return {router_gemm_fallback(), ConfigSource::Fallback, -1};
}

RouterGemmChoice choose_router_gemm(std::span<const RouterGemmRow> overrides, Arch arch, DType dt,
                                    int k, int n, int m) {
  // why: on a GPU without its own table the generic table is consulted once, as "generic"
  const std::span<const RouterGemmRow> arch_rows =
      arch == Arch::Generic ? std::span<const RouterGemmRow>{} : builtin_table(arch);
  return choose_router_gemm(overrides, arch_rows, builtin_table(Arch::Generic), dt, k, n, m);
}

namespace {

struct OverrideState {
  std::mutex mutex;
  bool loaded = false;
  bool path_set = false;  // set_tuning_file was called: the environment no longer applies
  std::string path;
  std::vector<RouterGemmRow> rows;
  std::set<std::tuple<int, int, int, int, int>> printed;
};

OverrideState& override_state() {
  static OverrideState s;
  return s;
}

bool print_config_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOEKIT_PRINT_CONFIG");
    return v != nullptr && std::string(v) != "0" && std::string(v) != "";
  }();
  return on;
}

}  // namespace

void set_tuning_file(const std::string& path) {
  OverrideState& s = override_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.path_set = true;
  s.path = path;
  s.loaded = false;
  s.rows.clear();
}

std::span<const RouterGemmRow> override_rows() {
  OverrideState& s = override_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.loaded) {
    std::string path = s.path;
    if (!s.path_set) {
      const char* env = std::getenv("MOEKIT_TUNING_FILE");
      path = env != nullptr ? env : "";
    }
    s.rows = path.empty() ? std::vector<RouterGemmRow>{} : load_tuning_file(path);
    s.loaded = true;
  }
  return s.rows;
}

RouterGemmChoice choose_router_gemm(Arch arch, DType dt, int k, int n, int m) {
  const RouterGemmChoice c = choose_router_gemm(override_rows(), arch, dt, k, n, m);
  if (print_config_enabled()) {
    OverrideState& s = override_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.printed.emplace(static_cast<int>(arch), static_cast<int>(dt), k, n, m).second) {
      std::fprintf(stderr, "moekit: router_gemm %s %s M=%d K=%d N=%d -> %s (%s%s%d)\n",
                   arch_name(arch), dtype_name(dt), m, k, n, describe(c.config).c_str(),
                   source_name(c.source), c.row >= 0 ? " row " : "", c.row >= 0 ? c.row : 0);
    }
  }
  return c;
}

// ---- files ----

void validate_row(const RouterGemmRow& row, const std::string& where) {
  if (const char* p = detail::row_problem(row)) {
    MK_FAIL(where << ": " << p << " (got dtype " << dtype_name(row.weight_dtype) << " K=" << row.k
                  << " N=" << row.n << " M=" << row.m_min << ".." << row.m_max << ", config '"
                  << describe(row.config) << "')");
  }
}

std::vector<RouterGemmRow> parse_tuning_json(const std::string& text, const std::string& name) {
  const nlohmann::json j = parse_json_bounded(text, "tuning file " + name);
  MK_CHECK(j.is_object() && j.contains("rows") && j["rows"].is_array(),
           "tuning file " << name << ": expected an object with a \"rows\" array, got "
                          << describe_json(j));
  if (j.contains("arch")) {
    MK_CHECK(j["arch"].is_string(), "tuning file " << name << ": expected \"arch\" as a string, got "
                                                   << describe_json(j["arch"]));
    parse_arch(j["arch"].get<std::string>());
  }
  std::vector<RouterGemmRow> rows;
  int index = 0;
  for (const nlohmann::json& r : j["rows"]) {
    std::ostringstream where;
    where << "tuning file " << name << ": row " << index;
    MK_CHECK(r.is_object(), where.str() << ": expected an object, got " << describe_json(r));
    auto get_int = [&](const char* key, bool required, int dflt) {
      if (!r.contains(key)) {
        MK_CHECK(!required, where.str() << ": missing key \"" << key << "\"");
        return dflt;
      }
      const std::optional<int> v = json_as_int(r[key]);
      MK_CHECK(v.has_value(), where.str() << ": expected \"" << key
                                          << "\" as an integer in the range of int, got "
                                          << describe_json(r[key]));
      return *v;
    };
    auto get_str = [&](const char* key) {
      MK_CHECK(r.contains(key) && r[key].is_string(),
               where.str() << ": expected \"" << key << "\" as a string");
      return r[key].get<std::string>();
    };
    RouterGemmRow row;
    try {
      row.weight_dtype = parse_dtype(get_str("dtype"));
      row.config.backend = parse_backend(get_str("backend"));
    } catch (const Error& e) {
      MK_FAIL(where.str() << ": " << e.what());
    }
    row.k = get_int("k", true, 0);
    row.n = get_int("n", true, 0);
    row.m_min = get_int("m_min", true, 0);
    row.m_max = get_int("m_max", true, 0);
    row.config.block = get_int("block", false, 0);
    row.config.tile_n = get_int("tile_n", false, 0);
    row.config.tile_m = get_int("tile_m", false, 0);
    row.config.split_k = get_int("split_k", false, 1);
    validate_row(row, where.str());
    rows.push_back(row);
    ++index;
  }
  return rows;
}

std::vector<RouterGemmRow> load_tuning_file(const std::string& path) {
  return parse_tuning_json(read_regular_file(path, "tuning file", kMaxConfigBytes),
                           "'" + escape_text(path) + "'");
}

std::string tuning_inc(std::span<const RouterGemmRow> rows) {
  auto backend_enum = [](RouterGemmBackend b) {
    switch (b) {
      case RouterGemmBackend::Naive:
        return "Naive";
      case RouterGemmBackend::Dot:
        return "Dot";
      case RouterGemmBackend::SplitK:
        return "SplitK";
      case RouterGemmBackend::Cublas:
        return "Cublas";
    }
    return "?";
  };
  std::ostringstream os;
  os << "// dtype, K, N, m_min, m_max, backend, block, tile_n, tile_m, split_k\n";
  for (const RouterGemmRow& r : rows) {
    os << "MK_ROUTER_GEMM_ROW(" << dtype_name(r.weight_dtype) << ", " << r.k << ", " << r.n << ", "
       << r.m_min << ", " << r.m_max << ", " << backend_enum(r.config.backend) << ", "
       << r.config.block << ", " << r.config.tile_n << ", " << r.config.tile_m << ", "
       << r.config.split_k << ")\n";
  }
  return os.str();
}

}  // namespace moekit::tuning
