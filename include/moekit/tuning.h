// Router GEMM tuning: configs, per-architecture tables as data, and the lookup (host only).
//
// A RouterGemmConfig names a backend and its parameters. It changes speed, never results (every
// config is tested against the CPU reference). Tables map (weight dtype, K, N, M range) to a
// config, one table per architecture family (tuning/sm90.inc, sm100.inc, generic.inc), compiled
// in and checked at build time (src/tuning/router_gemm_tables.cpp). Lookup order:
//   1. the override file (--tuning-file, else $MOEKIT_TUNING_FILE; JSON written by `moekit tune`)
//   2. the built-in table of this GPU's architecture
//   3. the generic table (the heuristic, as data; rows may use K = 0 / N = 0 for "any")
//   4. the fallback, which runs every shape (the naive kernel).
// A row is taken only when its config is legal for the shape (router_gemm_config_problem), so a
// wildcard row that cannot run a shape falls through. MOEKIT_PRINT_CONFIG=1 prints each choice once.
// This code does not need a GPU and is compiled with or without CUDA.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/dtype.h"

namespace moekit {
struct MoeSpec;
}

namespace moekit::tuning {

enum class Arch : uint8_t { Generic, Sm90, Sm100 };
const char* arch_name(Arch a);                 // "generic", "sm90", "sm100"
Arch parse_arch(std::string_view name);        // throws naming the string
Arch arch_from_compute_capability(int major, int minor);  // 9.x -> sm90, 10.x -> sm100

enum class RouterGemmBackend : uint8_t {
  Naive,   // one thread per output, fp32 FMA chain: the second reference; runs every shape
  Dot,     // CUDA cores: a CTA per tile_n expert columns, tile_m tokens per pass, 16 B loads on K
  SplitK,  // bf16 mma.sync tiles over experts x tokens, K split across warps and a CTA cluster
  Cublas,  // cublasGemmEx with fp32 output (fp32 weights: x converted to fp32 first)
};
const char* backend_name(RouterGemmBackend b);  // "naive", "dot", "splitk", "cublas"
RouterGemmBackend parse_backend(std::string_view name);

// Should not affect results, only speed. Fields a backend does not use are 0 (split_k 1).
struct RouterGemmConfig {
  RouterGemmBackend backend = RouterGemmBackend::Naive;
  int block = 0;    // threads per CTA. dot: 64/128/256; splitk: 128/256 (4/8 warps)
  int tile_n = 0;   // experts per CTA. dot: 1/2 columns; splitk: 16/32 (one or two mma rows)
  int tile_m = 0;   // tokens per pass. dot: 1/2/4/8; splitk: 8/16/32 (one to four mma columns)
  int split_k = 1;  // splitk: CTAs of one cluster that split K and reduce through DSMEM (1..8)

  friend constexpr bool operator==(const RouterGemmConfig&, const RouterGemmConfig&) = default;
};
std::string describe(const RouterGemmConfig& c);  // "splitk block=256 tile_n=16 tile_m=8 split_k=4"

// One table row. k == 0 or n == 0 means any K / any N (generic rows).
struct RouterGemmRow {
  DType weight_dtype = DType::BF16;
  int k = 0;
  int n = 0;
  int m_min = 1;
  int m_max = 1;
  RouterGemmConfig config;
};

// What the kernel sees: weight dtype (x is always bf16, out fp32), K = hidden, N = columns, M.
struct RouterGemmShape {
  DType weight_dtype = DType::BF16;
  int k = 0;
  int n = 0;
  bool has_bias = false;
  friend bool operator==(const RouterGemmShape&, const RouterGemmShape&) = default;
};
std::string describe(const RouterGemmShape& s);  // "BF16 K=7168 N=256"
// The gate shapes of every MoE layer of a spec, deduplicated, in layer order.
std::vector<RouterGemmShape> router_gemm_shapes(const MoeSpec& spec);

// ---- legality, shared by table checks, candidates, the tuner and the op ----
// Parameter sets with a compiled kernel. One list drives the instantiations, the dispatch switch
// and these checks (src/tuning/router_gemm_variants.h).
constexpr int kMaxSplitK = 8;       // portable cluster size limit
constexpr int kMaxTokensPerCall = 1 << 20;

// nullptr when the config can run this shape, else why not (a static string). m == 0 skips the
// checks on M. k == 0 / n == 0 skip the checks on K / N (for wildcard rows).
const char* router_gemm_config_problem(const RouterGemmConfig& c, DType weight_dtype, int k, int n,
                                       int m);

// Every legal config worth timing for (shape, m); the tuner times all of them and the heuristic
// rows are drawn from the same set. Each filter says why in router_gemm_candidates.cpp.
std::vector<RouterGemmConfig> router_gemm_candidates(DType weight_dtype, int k, int n, int m);
// Runs every shape (x, weights any alignment, any K, N, M).
constexpr RouterGemmConfig router_gemm_fallback() { return RouterGemmConfig{}; }

// ---- tables ----
std::span<const RouterGemmRow> builtin_table(Arch a);  // Generic is the generic table

enum class ConfigSource : uint8_t { Override, ArchTable, GenericTable, Fallback };
const char* source_name(ConfigSource s);  // "override", "arch table", "generic table", "fallback"

struct RouterGemmChoice {
  RouterGemmConfig config;
  ConfigSource source = ConfigSource::Fallback;
  int row = -1;  // index of the row in its table, -1 for the fallback
};

// The lookup, pure: override rows, then builtin_table(arch), then the generic table, then the
// fallback. A row matches when dtype, K (or 0), N (or 0) and m_min <= m <= m_max match and its
// config is legal for the shape; the first match in a table wins.
RouterGemmChoice choose_router_gemm(std::span<const RouterGemmRow> overrides, Arch arch,
                                    DType weight_dtype, int k, int n, int m);
// The same over explicit tables (what the line above runs with the built-in ones; for tests).
RouterGemmChoice choose_router_gemm(std::span<const RouterGemmRow> overrides,
                                    std::span<const RouterGemmRow> arch_rows,
                                    std::span<const RouterGemmRow> generic_rows,
                                    DType weight_dtype, int k, int n, int m);

// The process-wide override rows: the file given to set_tuning_file(), else $MOEKIT_TUNING_FILE,
// else none. Loaded (and validated) once, on first use. Thread-safe.
void set_tuning_file(const std::string& path);  // "" clears; takes effect on the next lookup
std::span<const RouterGemmRow> override_rows();

// choose_router_gemm with override_rows(); when MOEKIT_PRINT_CONFIG=1 prints each distinct
// (arch, dtype, K, N, M) choice once to stderr.
RouterGemmChoice choose_router_gemm(Arch arch, DType weight_dtype, int k, int n, int m);

// ---- files ----
// Table JSON (what `moekit tune` writes):
//   {"arch": "sm90", "device": "...", "rows": [{"dtype": "BF16", "k": 7168, "n": 256, "m_min": 1,
//     "m_max": 4, "backend": "dot", "block": 256, "tile_n": 1, "tile_m": 1, "split_k": 1}, ...]}
// "arch", "device" and per-row extra keys ("us", ...) are informative. Throws naming the row and
// key of anything malformed or illegal. `name` is what the text is called in messages.
std::vector<RouterGemmRow> parse_tuning_json(const std::string& text, const std::string& name);
std::vector<RouterGemmRow> load_tuning_file(const std::string& path);
// The same rows as a C++ .inc body (MK_ROUTER_GEMM_ROW lines) for tuning/<arch>.inc.
std::string tuning_inc(std::span<const RouterGemmRow> rows);
// Throws naming the row when a row is malformed or its config illegal for its (dtype, K, N, M).
void validate_row(const RouterGemmRow& row, const std::string& where);

}  // namespace moekit::tuning
