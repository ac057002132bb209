// The fast CPU backend: the same MoE layer as cpu_reference::forward, at the machine's memory
// bandwidth. It is the default for `--device cpu`; the reference stays the oracle.
//
// Decode on a CPU is bound by streaming the touched experts' weights once. The backend groups the
// (token, slot) pairs by expert and streams every touched expert's rows exactly once for all of
// its tokens, on every core at once (each thread owns a slice of the rows of every expert), with
// SiLU·mul fused after the first GEMM and the weighted combine fused after the second. SIMD code
// for AVX-512 (with AVX512-BF16 dot products where the CPU has them) and AVX2 is chosen at run
// time from the CPU's features; a portable path runs everywhere. Routing reuses
// cpu_reference::route, fed by a router GEMM that accumulates in double like the reference, so
// both backends pick the same experts.
//
// Numerical contract: weights and x are read exactly (bf16, or fp32 router weights); the expert
// GEMMs accumulate in fp32 (the reference in double), so y agrees with the reference to ~3e-7
// of the output's magnitude on real shapes (tests allow 2e-5). For a given ISA the result does
// not depend on the thread count (each output element is summed in the same order whatever the
// split). Scratch buffers are kept per calling thread between calls (grown, never shrunk).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "moekit/layer.h"

namespace moekit::cpu_fast {

enum class Isa { Auto, Avx512, Avx2, Portable };
const char* isa_name(Isa isa);        // "auto" | "avx512" | "avx2" | "portable"
Isa parse_isa(const std::string& s);  // throws naming the value and the allowed spellings
// Whether this CPU (and OS) can run the code of `isa`; Auto and Portable are always supported.
bool isa_supported(Isa isa);
// Whether this CPU has AVX512-BF16 (vdpbf16ps), which the AVX-512 path uses for the first GEMM.
bool cpu_has_avx512_bf16();
// The ISA a forward runs with: `requested` unless Auto; Auto takes $MOEKIT_CPU_ISA when set, else
// the best the CPU supports. Throws when the result is not supported by this CPU.
Isa resolve_isa(Isa requested);

// Where one forward's wall time went (FastOptions::phases), in microseconds.
struct PhaseTimes {
  double router = 0;   // router GEMM and routing (forward() only)
  double gate_up = 0;  // grouping the pairs by expert, the gate/up GEMM and the activation
  double down = 0;     // the down GEMM after the last gate/up unit (its first units run beside it)
  double combine = 0;  // the weighted sum into y
};

struct FastOptions {
  int threads = 0;      // 0 = every core (std::thread::hardware_concurrency)
  Isa isa = Isa::Auto;  // force a SIMD path (tests); Auto = detect (or $MOEKIT_CPU_ISA)
  // AVX-512 only: compute the first GEMM with vdpbf16ps when the CPU has AVX512-BF16 (products of
  // two bf16 values are exact in fp32, so this only changes the summation order).
  bool use_bf16_dot = true;
  PhaseTimes* phases = nullptr;  // when set, forward() and experts() write their phases' times
};

// The whole layer, same arguments and semantics as cpu_reference::forward: fuse Off runs the
// shared expert as its own MLP, On as S fused slots (throws if the spec cannot fuse), Auto = On
// when fusable. Throws on non-finite x. Experts the routing touches are materialised here (in
// parallel) if they were not already.
ForwardResult forward(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                      const FastOptions& opt = {});

// The forward's two halves, for callers with their own routing (moekit/moe.h):
// router_logits: logits [tokens, router_columns] fp32 (router bias added), accumulated in double.
std::vector<float> router_logits(const LayerWeights& w, const Bf16* x, int tokens,
                                 const FastOptions& opt = {});
// experts: cpu_reference::experts' contract (the k routed ids then any fused slots per token,
// add_shared for the unfused shared MLP, routed experts outside [held_begin, held_end) skipped)
// at this backend's speed; empty r.shared_scale means 1.
std::vector<float> experts(const LayerWeights& w, const Bf16* x, int tokens, const Routing& r,
                           bool add_shared, const FastOptions& opt = {}, int held_begin = 0,
                           int held_end = -1);

// Threads a forward with opt.threads = `requested` uses (0 = all cores).
int resolve_threads(int requested);

// The read-bandwidth probe: a buffer of `bytes` (>= 1 GB to defeat caches) that pass() sums with
// `threads` threads (0 = all) taking 4 MiB chunks dynamically, as the layer takes its units.
// Benchmarks interleave passes with the timed forwards, so a shared machine's changing load
// affects both alike. Uses the SIMD path of resolve_isa(isa).
class ReadProbe {
 public:
  explicit ReadProbe(size_t bytes, Isa isa = Isa::Auto);
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;
  // One pass over the buffer; returns bytes/s.
  double pass(int threads = 0);
  size_t bytes() const { return count_ * sizeof(float); }

 private:
  float* data_ = nullptr;
  size_t count_ = 0;
  Isa isa_;
  float sink_ = 0.0f;
};

// Best of `repeats` probe passes (after a warm one), in bytes/s.
double measure_read_bandwidth(size_t bytes, int threads = 0, int repeats = 5, Isa isa = Isa::Auto);

}  // namespace moekit::cpu_fast
