// The fast CPU MoE layer: same result as cpu_reference::forward, bound by memory bandwidth.
//
//   1. router     logits[T, C] = x . Wg^T (+ router bias), double accumulation (kernels.h
//                 router_dot), columns split over the threads when large enough; then
//                 cpu_reference::route (cheap).
//   2. group      the T*(k+S) (token, slot) pairs become one job per touched expert (ascending id)
//                 holding its tokens and weights; the unfused shared MLP is one more job (width
//                 Is, every token, weight = shared_scale).
//   3. gate/up    units of ~256 KB of weights (a block of intermediate columns of one job: its
//                 gate and up rows) are taken by the threads dynamically; each unit streams its
//                 rows once for all of the job's tokens, then applies the activation (SiLU·mul,
//                 clamps, swigluoai, biases) to its columns while they are in cache. Experts used
//                 for the first time are materialised here, by the units that need them.
//   4. down       units of ~256 KB of one job's W2 rows: down[pair, rows] = W2 a.
//   5. combine    y[t] += w * (down + b2), blocks of y columns per thread, jobs in a fixed order
//                 (no atomics; the combine reads ~T*(k+S)*H*4 bytes, << the weights).
//
// Why small units of every expert rather than whole experts per thread: all threads stream
// whatever the routing (balanced at T=1 with 8 experts on 3 cores as well as at T=128), and a
// thread that the OS deschedules does not hold up a phase. Each output element is computed by one
// kernel call whose summation order depends only on k, and units depend only on the shapes, so
// the result does not depend on the thread count.
//
// The first GEMM uses bf16 activations with vdpbf16ps on AVX512-BF16 CPUs (exact products), fp32
// activations elsewhere; the down projection always uses fp32 activations.
//
// fp8 weights (LayerWeights::expert_dtype() F8_E4M3) run weight-only, each weight bf16(fp8 x tile
// scale) (the value of a bf16 load). At decode token counts an ISA with a fused fp8 row kernel
// (kernels.h dot_rows_fp8_f32) makes the weights in registers; otherwise each unit dequantises its
// rows, kFp8ChunkRows at a time, into a per-thread bf16 buffer that stays in cache (kernels.h
// dequant_fp8_row) and runs the bf16 kernels on it. Chunks are multiples of the kernels' 4-row
// tiles and start at the unit's first row, and the fused kernels sum as the bf16 ones do, so y
// equals the bf16 path's on the dequantised checkpoint bit for bit, while the weights cross the
// memory bus as fp8 bytes. MX weights (expert_format() Mxfp4 / Mxfp8, W4A16 / W8A16) take the
// same two ways (mx_rows.h: fused MX row kernels at decode token counts, gate/up on the
// activations' type; else rows dequantised into a per-thread buffer), so y equals the bf16 path's
// on the same checkpoint loaded as bf16, bit for bit.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/experts_routing_check.h"
#include "cpu/fast/fast_common.h"
#include "cpu/fast/kernels.h"
#include "cpu/fast/mx_rows.h"
#include "cpu/fast/thread_pool.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"

namespace moekit::cpu_fast {

// ---------------------------------------------------------------- ISA selection

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Auto:
      return "auto";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    case Isa::Portable:
      return "portable";
  }
  return "?";
}

Isa parse_isa(const std::string& s) {
  if (s == "auto") return Isa::Auto;
  if (s == "avx512") return Isa::Avx512;
  if (s == "avx2") return Isa::Avx2;
  if (s == "portable") return Isa::Portable;
  MK_FAIL("unknown CPU ISA '" << s << "' (expected auto, avx512, avx2 or portable)");
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Auto:
    case Isa::Portable:
      return true;
#if defined(__x86_64__) || defined(__i386__)
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
#else
    case Isa::Avx2:
    case Isa::Avx512:
      return false;
#endif
  }
  return false;
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  return isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

Isa resolve_isa(Isa requested) {
  Isa isa = requested;
  const char* source = "requested";
  if (isa == Isa::Auto) {
    const char* env = std::getenv("MOEKIT_CPU_ISA");
    if (env != nullptr && env[0] != '\0') {
      isa = parse_isa(env);
      source = "MOEKIT_CPU_ISA";
    }
  }
  if (isa == Isa::Auto) {
    if (isa_supported(Isa::Avx512)) return Isa::Avx512;
    if (isa_supported(Isa::Avx2)) return Isa::Avx2;
    return Isa::Portable;
  }
  MK_CHECK(isa_supported(isa), "CPU ISA '" << isa_name(isa) << "' (" << source
                                           << ") is not supported by this CPU (expected one of: "
                                           << (isa_supported(Isa::Avx512) ? "avx512, " : "")
                                           << (isa_supported(Isa::Avx2) ? "avx2, " : "")
                                           << "portable)");
  return isa;
}

int resolve_threads(int requested) {
  MK_CHECK(requested >= 0, "expected threads >= 0 (0 = all cores), got " << requested);
  if (requested > 0) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

using detail::Kernels;
using detail::kernels_for;
using detail::parallel;
using detail::run_units;

// [n*p/P, n*(p+1)/P): the slice of n items participant p of P owns.
inline int slice_begin(int n, int p, int parts) {
  return static_cast<int>(static_cast<int64_t>(n) * p / parts);
}

// The gated nonlinearity on one intermediate element (DESIGN.md §1; same cases as the reference's
// activate(), in fp32).
struct ActivationFn {
  Activation kind;
  float limit, alpha, beta;

  float operator()(float g, float u) const {
    if (limit > 0.0f) {
      // gate clamped from above only, up on both sides (gpt-oss, swigluoai, DeepSeek-V4 silu)
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
    }
    if (kind == Activation::Silu) return g / (1.0f + std::exp(-g)) * u;
    // swigluoai, split or (de-interleaved by the loader) interleaved: same math
    return (u + beta) * (g / (1.0f + std::exp(-alpha * g)));
  }
};

// Below these sizes a phase runs on the calling thread: waking a worker costs more than it saves.
constexpr double kSerialRouterMacs = 4e6;
constexpr double kSerialCombineElements = 1e6;

// A thread's scratch buffer, grown but never shrunk. why: a decode step allocates the same few MB
// every call; fresh allocations of that size are mmap'd and page-faulted each time (measured ~5%
// of a Qwen3 T=32 forward), reused ones are not.
template <typename T>
T* scratch(std::vector<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// One MLP to run over a set of tokens: a routed expert, a fused shared slot, or the unfused
// shared MLP (width Is).
struct Job {
  const Bf16* gate = nullptr;  // [inter, H]
  const Bf16* up = nullptr;    // [inter, H]
  const Bf16* down = nullptr;  // [H, down_stride]
  // fp8 weights instead (same shapes, e4m3 codes) with their 128x128 tile scales: rows of
  // ceil(H/128) scales for gate/up, of ceil(down_stride/128) for down.
  const uint8_t* gate8 = nullptr;
  const uint8_t* up8 = nullptr;
  const uint8_t* down8 = nullptr;
  const float* gate_scale = nullptr;
  const float* up_scale = nullptr;
  const float* down_scale = nullptr;
  // MX weights instead (ExpertView's mx fields; gate/up rows of H columns, down of down_stride).
  detail::MxMatrix gate_mx, up_mx, down_mx;
  int inter = 0;
  int down_stride = 0;
  const float* b_gate = nullptr;
  const float* b_up = nullptr;
  const float* b_down = nullptr;
  int expert = -1;   // routed expert or fused slot id; -1 = the unfused shared MLP
  int count = 0;     // tokens routed to it
  size_t first = 0;  // index of its first token in the flat token/weight/pointer arrays
  size_t act = 0;    // offset of its [count, inter] gate/activation block; up follows it
};

size_t fp8_tiles(size_t n) { return (n + kFp8Tile - 1) / kFp8Tile; }

// Rows per dequantisation chunk of the fp8 path: a multiple of the kernels' 4-row tiles, small
// enough that a chunk's gate and up rows stay in L2 (4 x 7168 x 2 x 2 bytes = 112 KB).
constexpr int kFp8ChunkRows = 4;

// Rows [r0, r1) of an fp8 matrix whose rows hold ld codes (the first k used) into
// out[r1 - r0, k] as bf16.
void dequant_rows(const detail::Kernels& kern, const uint8_t* q, const float* scale, size_t ld,
                  int r0, int r1, int k, Bf16* out) {
  const size_t scale_ld = fp8_tiles(ld);
  for (int r = r0; r < r1; ++r) {
    kern.dequant_fp8_row(q + static_cast<size_t>(r) * ld,
                         scale + static_cast<size_t>(r / kFp8Tile) * scale_ld, k,
                         out + static_cast<size_t>(r - r0) * k);
  }
}

// Points an MX job at gate/up rows w13 [2 inter, H] and down rows w2 [H, down_stride].
void set_mx(Job& job, ExpertFormat f, size_t H, const uint8_t* w13, const uint8_t* s13,
            const uint8_t* w2, const uint8_t* s2) {
  job.gate_mx = {f, w13, s13, H};
  job.up_mx = job.gate_mx.offset_rows(job.inter);
  job.down_mx = {f, w2, s2, static_cast<size_t>(job.down_stride)};
}

// Points a routed expert's (or fused slot's) job at its weights, materialising them on first use
// (thread-safe: LayerWeights builds each expert once).
void attach_weights(const LayerWeights& w, Job& job) {
  const MoeSpec& spec = w.spec();
  const ExpertView ex = w.expert(job.expert);
  MK_CHECK((ex.w13 != nullptr && ex.w2 != nullptr) ||
               (ex.w13_mx != nullptr && ex.w2_mx != nullptr && ex.w13_mx_scale != nullptr &&
                ex.w2_mx_scale != nullptr) ||
               (ex.w13_fp8 != nullptr && ex.w2_fp8 != nullptr && ex.w13_scale != nullptr &&
                ex.w2_scale != nullptr),
           "expert " << job.expert << " of " << spec.name << " has null weights");
  if (spec.has_expert_bias && job.expert < spec.num_experts) {
    MK_CHECK(ex.b13 != nullptr && ex.b2 != nullptr,
             spec.name << " has expert biases but expert " << job.expert << " holds none");
  }
  if (ex.w13_mx != nullptr) {
    set_mx(job, ex.mx_format, spec.hidden, ex.w13_mx, ex.w13_mx_scale, ex.w2_mx, ex.w2_mx_scale);
  } else if (ex.w13_fp8 != nullptr) {
    const size_t H = spec.hidden, inter = job.inter;
    job.gate8 = ex.w13_fp8;
    job.up8 = ex.w13_fp8 + inter * H;
    job.down8 = ex.w2_fp8;
    job.gate_scale = ex.w13_scale;
    job.up_scale = ex.w13_scale + fp8_tiles(inter) * fp8_tiles(H);
    job.down_scale = ex.w2_scale;
  } else {
    job.gate = ex.w13;
    job.up = ex.w13 + static_cast<size_t>(job.inter) * spec.hidden;
    job.down = ex.w2;
  }
  job.b_gate = ex.b13;
  job.b_up = ex.b13 ? ex.b13 + job.inter : nullptr;
  job.b_down = ex.b2;
}

// A piece of work: rows [begin, end) of one job's weight matrix.
struct Unit {
  int job;
  int begin, end;
};

// Cuts every job's `extent(job)` rows into units of about kUnitBytes of weights. why: units are
// taken dynamically by whichever thread is free (the dev machine is shared, and a thread that
// is descheduled must not hold up the phase), and a unit is long enough to be one sequential
// stream. Unit boundaries depend only on the shapes, never on the thread count.
constexpr size_t kUnitBytes = size_t{256} << 10;

template <typename Extent, typename RowBytes>
std::vector<Unit> make_units(const std::vector<Job>& jobs, Extent extent, RowBytes row_bytes) {
  std::vector<Unit> units;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int n = extent(jobs[j]);
    const int step = static_cast<int>(std::max<size_t>(1, kUnitBytes / row_bytes(jobs[j])));
    for (int b = 0; b < n; b += step) {
      units.push_back({static_cast<int>(j), b, std::min(n, b + step)});
    }
  }
  return units;
}

}  // namespace

std::vector<float> router_logits(const LayerWeights& w, const Bf16* x, int tokens,
                                 const FastOptions& opt) {
  const MoeSpec& spec = w.spec();
  const int H = spec.hidden;
  const Kernels& kern = kernels_for(resolve_isa(opt.isa));
  const int threads = resolve_threads(opt.threads);
  MK_CHECK(tokens >= 0, "expected tokens >= 0, got " << tokens);

  // ---- router GEMM (double accumulation, like the reference, so both pick the same experts)
  const DType rdt = w.router_dtype();
  MK_CHECK(rdt == DType::BF16 || rdt == DType::F32,
           "expected router dtype BF16 or F32, got " << dtype_name(rdt));
  MK_CHECK(w.router_weight() != nullptr, "router weight of " << spec.name << " is missing");
  MK_CHECK(!spec.has_router_bias || w.router_bias() != nullptr,
           spec.name << " has a router bias but the weights hold none");
  const int C = spec.router_columns();
  const size_t TH = static_cast<size_t>(tokens) * H;
  thread_local std::vector<double> xd_buffer;
  double* xd = scratch(xd_buffer, TH);
  for (size_t i = 0; i < TH; ++i) xd[i] = bf16_to_float(x[i]);
  std::vector<const double*> xd_rows(tokens);
  for (int t = 0; t < tokens; ++t) xd_rows[t] = xd + static_cast<size_t>(t) * H;
  std::vector<double> logits_d(static_cast<size_t>(tokens) * C);
  if (tokens > 0) {
    const bool w_f32 = rdt == DType::F32;
    const size_t row_bytes = static_cast<size_t>(H) * (w_f32 ? 4 : 2);
    // why: at decode the router is ~0.1% of the layer's bytes; a parallel phase costs a thread
    // wake-up (tens of us, and milliseconds when the OS is slow to schedule the worker)
    const bool small = static_cast<double>(tokens) * C * H <= kSerialRouterMacs;
    parallel(small ? 1 : std::min(threads, C), [&](int p, int parts) {
      const int c0 = slice_begin(C, p, parts), c1 = slice_begin(C, p + 1, parts);
      if (c0 == c1) return;
      const void* wrows = static_cast<const uint8_t*>(w.router_weight()) + c0 * row_bytes;
      kern.router_dot(wrows, w_f32, H, c1 - c0, H, xd_rows.data(), tokens, logits_d.data() + c0, C);
    });
  }
  std::vector<float> logits(logits_d.size());
  for (int t = 0; t < tokens; ++t) {
    for (int c = 0; c < C; ++c) {
      double v = logits_d[static_cast<size_t>(t) * C + c];
      // gpt-oss router bias on the routed columns (never on a gated shared expert's gate column)
      if (spec.has_router_bias && c < spec.num_experts) v += w.router_bias()[c];
      logits[static_cast<size_t>(t) * C + c] = static_cast<float>(v);
    }
  }
  return logits;
}

ForwardResult forward(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                      const FastOptions& opt) {
  const MoeSpec& spec = w.spec();
  check_finite_input(x, tokens, spec.hidden);
  const bool fused = fuse == FuseShared::On || (fuse == FuseShared::Auto && spec.can_fuse_shared());
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, fused);  // throws if On is impossible
  check_forward_memory(w, tokens, fused);  // refuse before allocating, naming both sizes

  ForwardResult result;
  result.tokens = tokens;
  result.hidden = spec.hidden;
  result.fused = fused;
  const std::vector<float> logits = router_logits(w, x, tokens, opt);
  result.routing = cpu_reference::route(cfg, logits.data(), tokens, w.correction_bias());
  const bool add_shared = !fused && spec.shared_kind != SharedKind::None;
  result.y = experts(w, x, tokens, result.routing, add_shared, opt);
  return result;
}

std::vector<float> experts(const LayerWeights& w, const Bf16* x, int tokens, const Routing& r,
                           bool add_shared, const FastOptions& opt, int held_begin,
                           int held_end) {
  const MoeSpec& spec = w.spec();
  const int H = spec.hidden;
  const int E = spec.num_experts;
  const Isa isa = resolve_isa(opt.isa);
  const Kernels& kern = kernels_for(isa);
  const bool bf16_dot = kern.dot_rows_bf16 != nullptr && opt.use_bf16_dot && cpu_has_avx512_bf16();
  const int threads = resolve_threads(opt.threads);
  const ExpertFormat format = w.expert_format();
  const bool mx = format == ExpertFormat::Mxfp4 || format == ExpertFormat::Mxfp8;
  const int fused_slots =
      cpu_detail::check_experts_routing(spec, tokens, r, add_shared, held_begin, held_end);
  MK_CHECK(!add_shared || r.shared_scale.empty() ||
               r.shared_scale.size() == static_cast<size_t>(tokens),
           "expected " << tokens << " shared scales, got " << r.shared_scale.size());
  const size_t TH = static_cast<size_t>(tokens) * H;
  std::vector<float> y(TH, 0.0f);
  if (tokens == 0) return y;
  thread_local std::vector<float> xf_buffer, act_buffer, down_buffer;
  float* xf = bf16_dot ? nullptr : scratch(xf_buffer, TH);
  if (xf) {
    for (size_t i = 0; i < TH; ++i) xf[i] = bf16_to_float(x[i]);
  }

  // ---- group (token, slot) pairs by expert: counting sort, ascending expert id
  const int rows = E + fused_slots;  // E + S: the fused slots are experts too
  // routed experts outside [held_begin, held_end) are another rank's: their pairs are skipped
  auto held = [&](int32_t id) { return id >= E || (id >= held_begin && id < held_end); };
  std::vector<int> count(rows, 0);
  size_t held_pairs = 0;
  for (int32_t id : r.ids) {
    MK_CHECK(id >= 0 && id < rows,
             "routing picked expert " << id << ", expected [0, " << rows << ")");
    if (held(id)) {
      ++count[id];
      ++held_pairs;
    }
  }
  std::vector<int> used;
  for (int e = 0; e < rows; ++e) {
    if (count[e] > 0) used.push_back(e);
  }
  const size_t pairs = held_pairs + (add_shared ? tokens : 0);
  std::vector<int> tok(pairs);
  std::vector<float> wt(pairs);
  std::vector<Job> jobs(used.size() + (add_shared ? 1 : 0));
  {
    std::vector<size_t> cursor(rows, 0);
    size_t first = 0;
    for (size_t j = 0; j < used.size(); ++j) {
      jobs[j].count = count[used[j]];
      jobs[j].first = first;
      cursor[used[j]] = first;
      first += jobs[j].count;
    }
    for (int t = 0; t < tokens; ++t) {
      for (int s = 0; s < r.slots; ++s) {
        const size_t slot = static_cast<size_t>(t) * r.slots + s;
        if (!held(r.ids[slot])) continue;
        const size_t at = cursor[r.ids[slot]]++;
        tok[at] = t;
        wt[at] = r.weights[slot];
      }
    }
    if (add_shared) {
      Job& sj = jobs.back();
      sj.count = tokens;
      sj.first = first;
      for (int t = 0; t < tokens; ++t) {
        tok[first + t] = t;
        wt[first + t] = r.shared_scale.empty() ? 1.0f : r.shared_scale[t];
      }
    }
  }

  // Routed experts and fused slots get their weights in the gate/up phase (attach_weights), so
  // experts used for the first time are materialised there, in parallel, without a phase of
  // their own.
  const int I = spec.expert_intermediate;
  for (size_t j = 0; j < used.size(); ++j) {
    jobs[j].expert = used[j];
    jobs[j].inter = I;
    jobs[j].down_stride = I;
  }
  if (add_shared) {
    const int Is = spec.shared_intermediate;
    Job& sj = jobs.back();
    sj.inter = Is;
    sj.down_stride = Is;
    if (mx) {
      MK_CHECK(Is > 0 && w.shared_w13_mx() && w.shared_w13_mx_scale() && w.shared_w2_mx() &&
                   w.shared_w2_mx_scale(),
               expert_format_name(format) << " shared expert weights of " << spec.name
                                          << " are missing");
      set_mx(sj, format, H, w.shared_w13_mx(), w.shared_w13_mx_scale(), w.shared_w2_mx(),
             w.shared_w2_mx_scale());
    } else if (format == ExpertFormat::Fp8Block) {
      MK_CHECK(Is > 0 && w.shared_w13_fp8() && w.shared_w13_scale() && w.shared_w2_fp8() &&
                   w.shared_w2_scale(),
               "fp8 shared expert weights of " << spec.name << " are missing");
      sj.gate8 = w.shared_w13_fp8();
      sj.up8 = w.shared_w13_fp8() + static_cast<size_t>(Is) * H;
      sj.down8 = w.shared_w2_fp8();
      sj.gate_scale = w.shared_w13_scale();
      sj.up_scale = w.shared_w13_scale() + fp8_tiles(Is) * fp8_tiles(H);
      sj.down_scale = w.shared_w2_scale();
    } else {
      MK_CHECK(Is > 0 && w.shared_w13() != nullptr && w.shared_w2() != nullptr,
               "shared expert weights of " << spec.name << " are missing (shared_intermediate "
                                           << Is << ")");
      sj.gate = w.shared_w13();
      sj.up = w.shared_w13() + static_cast<size_t>(Is) * H;
      sj.down = w.shared_w2();
    }
  }

  // ---- buffers: per job [count, inter] gate (then activation) and up blocks
  size_t act_size = 0;
  for (Job& job : jobs) {
    job.act = act_size;
    act_size += 2 * static_cast<size_t>(job.count) * job.inter;
  }
  float* act = scratch(act_buffer, act_size);
  std::vector<const float*> xf_ptr(bf16_dot ? 0 : pairs);
  std::vector<const Bf16*> xb_ptr(bf16_dot ? pairs : 0);
  std::vector<const float*> act_ptr(pairs);
  for (const Job& job : jobs) {
    for (int j = 0; j < job.count; ++j) {
      const size_t i = job.first + j;
      const size_t row = static_cast<size_t>(tok[i]) * H;
      if (bf16_dot) {
        xb_ptr[i] = x + row;
      } else {
        xf_ptr[i] = xf + row;
      }
      act_ptr[i] = act + job.act + static_cast<size_t>(j) * job.inter;
    }
  }
  const ActivationFn activate{spec.activation, spec.swiglu_limit, spec.swiglu_alpha,
                              spec.swiglu_beta};

  // The fp8 rows of a job go straight into an ISA's fused fp8 kernel where it has one for the
  // job's token count (the down projection always; gate/up when it runs on fp32 activations).
  const auto fp8_rows = [&](const Job& job) {
    return kern.dot_rows_fp8_f32 != nullptr && job.count <= kern.fp8_row_tokens;
  };
  const auto fp8_rows_gate_up = [&](const Job& job) { return !bf16_dot && fp8_rows(job); };


  // ---- gate/up GEMM + activation, in units of intermediate columns of one job
  const std::vector<Unit> up_units = make_units(
      jobs, [&](const Job& j) { return j.inter; },
      [&](const Job&) { return 4 * static_cast<size_t>(H); });  // gate + up row, bf16
  run_units(threads, up_units.size(), [&](size_t ui) {
    const Unit& unit = up_units[ui];
    Job job = jobs[unit.job];
    if (job.expert >= 0) attach_weights(w, job);
    const int i0 = unit.begin, i1 = unit.end;
    float* g = act + job.act;
    float* u = g + static_cast<size_t>(job.count) * job.inter;
    // gate and up rows [a, b), their first rows at gw / uw
    auto project = [&](const Bf16* gw, const Bf16* uw, int a, int b) {
      if (bf16_dot) {
        kern.dot_rows_bf16(gw, H, b - a, H, &xb_ptr[job.first], job.count, g + a, job.inter);
        kern.dot_rows_bf16(uw, H, b - a, H, &xb_ptr[job.first], job.count, u + a, job.inter);
      } else {
        kern.dot_rows_f32(gw, H, b - a, H, &xf_ptr[job.first], job.count, g + a, job.inter);
        kern.dot_rows_f32(uw, H, b - a, H, &xf_ptr[job.first], job.count, u + a, job.inter);
      }
    };
    if (job.gate8 != nullptr && fp8_rows_gate_up(job)) {
      kern.dot_rows_fp8_f32(job.gate8 + static_cast<size_t>(i0) * H, H, job.gate_scale,
                            fp8_tiles(H), i0, i1 - i0, H, &xf_ptr[job.first], job.count, g + i0,
                            job.inter);
      kern.dot_rows_fp8_f32(job.up8 + static_cast<size_t>(i0) * H, H, job.up_scale, fp8_tiles(H),
                            i0, i1 - i0, H, &xf_ptr[job.first], job.count, u + i0, job.inter);
    } else if (!job.gate_mx.empty()) {
      const float* const* xf = bf16_dot ? nullptr : &xf_ptr[job.first];
      const Bf16* const* xb = bf16_dot ? &xb_ptr[job.first] : nullptr;
      detail::mx_project(kern, job.gate_mx, i0, i1, H, xf, xb, job.count, g + i0, job.inter);
      detail::mx_project(kern, job.up_mx, i0, i1, H, xf, xb, job.count, u + i0, job.inter);
    } else if (job.gate8 != nullptr) {
      thread_local std::vector<Bf16> rows_buffer;
      Bf16* gw = scratch(rows_buffer, 2 * static_cast<size_t>(kFp8ChunkRows) * H);
      Bf16* uw = gw + static_cast<size_t>(kFp8ChunkRows) * H;
      for (int a = i0; a < i1; a += kFp8ChunkRows) {
        const int b = std::min(i1, a + kFp8ChunkRows);
        dequant_rows(kern, job.gate8, job.gate_scale, H, a, b, H, gw);
        dequant_rows(kern, job.up8, job.up_scale, H, a, b, H, uw);
        project(gw, uw, a, b);
      }
    } else {
      const size_t off = static_cast<size_t>(i0) * H;
      project(job.gate + off, job.up + off, i0, i1);
    }
    for (int j = 0; j < job.count; ++j) {
      float* gj = g + static_cast<size_t>(j) * job.inter;
      const float* uj = u + static_cast<size_t>(j) * job.inter;
      for (int i = i0; i < i1; ++i) {
        const float gv = job.b_gate ? gj[i] + job.b_gate[i] : gj[i];
        const float uv = job.b_up ? uj[i] + job.b_up[i] : uj[i];
        gj[i] = activate(gv, uv);
      }
    }
  });

  for (Job& job : jobs) {
    if (job.expert >= 0) attach_weights(w, job);  // materialised by now: a lookup
  }

  // ---- down GEMM, in units of output rows of one job: down[pair, H] = W2 a (no bias yet)
  float* down = scratch(down_buffer, pairs * static_cast<size_t>(H));
  const std::vector<Unit> down_units = make_units(
      jobs, [&](const Job&) { return H; },
      [&](const Job& j) { return 2 * static_cast<size_t>(j.inter); });
  run_units(threads, down_units.size(), [&](size_t ui) {
    const Unit& unit = down_units[ui];
    const Job& job = jobs[unit.job];
    if (job.down8 != nullptr && fp8_rows(job)) {
      kern.dot_rows_fp8_f32(job.down8 + static_cast<size_t>(unit.begin) * job.down_stride,
                            job.down_stride, job.down_scale, fp8_tiles(job.down_stride),
                            unit.begin, unit.end - unit.begin, job.inter, &act_ptr[job.first],
                            job.count, down + job.first * H + unit.begin, H);
      return;
    }
    if (!job.down_mx.empty()) {
      detail::mx_project(kern, job.down_mx, unit.begin, unit.end, job.inter, &act_ptr[job.first],
                         nullptr, job.count, down + job.first * H + unit.begin, H);
      return;
    }
    if (job.down8 != nullptr) {
      thread_local std::vector<Bf16> rows_buffer;
      Bf16* dw = scratch(rows_buffer, static_cast<size_t>(kFp8ChunkRows) * job.inter);
      for (int a = unit.begin; a < unit.end; a += kFp8ChunkRows) {
        const int b = std::min(unit.end, a + kFp8ChunkRows);
        dequant_rows(kern, job.down8, job.down_scale, job.down_stride, a, b, job.inter, dw);
        kern.dot_rows_f32(dw, job.inter, b - a, job.inter, &act_ptr[job.first], job.count,
                          down + job.first * H + a, H);
      }
      return;
    }
    kern.dot_rows_f32(job.down + static_cast<size_t>(unit.begin) * job.down_stride, job.down_stride,
                      unit.end - unit.begin, job.inter, &act_ptr[job.first], job.count,
                      down + job.first * H + unit.begin, H);
  });

  // ---- weighted combine, in column blocks of y: every y element sums the jobs in job order,
  // so the result does not depend on which thread ran which unit
  constexpr int kCombineColumns = 256;
  const int blocks = (H + kCombineColumns - 1) / kCombineColumns;
  const bool small_combine = static_cast<double>(pairs) * H <= kSerialCombineElements;
  run_units(small_combine ? 1 : threads, blocks, [&](size_t b) {
    const int h0 = static_cast<int>(b) * kCombineColumns;
    const int h1 = std::min(H, h0 + kCombineColumns);
    for (const Job& job : jobs) {
      for (int j = 0; j < job.count; ++j) {
        const size_t pair = job.first + j;
        const float weight = wt[pair];
        float* yt = y.data() + static_cast<size_t>(tok[pair]) * H;
        const float* o = down + pair * H;
        if (job.b_down) {
          for (int h = h0; h < h1; ++h) yt[h] += weight * (o[h] + job.b_down[h]);
        } else {
          for (int h = h0; h < h1; ++h) yt[h] += weight * o[h];
        }
      }
    }
  });
  return y;
}

}  // namespace moekit::cpu_fast
