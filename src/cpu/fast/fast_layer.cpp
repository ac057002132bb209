// The fast CPU MoE layer: same result as cpu_reference::forward, bound by memory bandwidth.
//
//   1. router     logits[T, C] = x . Wg^T (+ router bias), double accumulation (kernels.h
//                 router_dot), columns split over the threads; then cpu_reference::route (cheap).
//   2. group      the T*(k+S) (token, slot) pairs become one job per touched expert (ascending id)
//                 holding its tokens and weights; the unfused shared MLP is one more job (width
//                 Is, every token, weight = shared_scale). Experts are looked up (materialised)
//                 in parallel.
//   3. gate/up    thread p takes intermediate columns [I*p/P, I*(p+1)/P) of EVERY job: it streams
//                 those gate and up rows once for all of the job's tokens, then applies the
//                 activation (SiLU·mul, clamps, swigluoai, biases) to its columns in cache.
//   4. down       thread p takes output rows [H*p/P, H*(p+1)/P) of every job's W2 and adds
//                 w * (W2 a + b2) into y[token, rows]: the weighted combine fused, no atomics
//                 (each y element is owned by one thread), and jobs are combined in a fixed order.
//
// Why slices of every expert rather than whole experts per thread: every thread then streams the
// same number of bytes and does the same number of FMAs whatever the routing (balanced at T=1
// with 8 experts on 3 cores as well as at T=128), and the result does not depend on P since each
// output element is computed by one kernel call whose order depends only on k.
//
// The first GEMM uses bf16 activations with vdpbf16ps on AVX512-BF16 CPUs (exact products), fp32
// activations elsewhere; the down projection always uses fp32 activations.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu/fast/kernels.h"
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

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return detail::avx512_kernels();
    case Isa::Avx2:
      return detail::avx2_kernels();
    default:
      return detail::portable_kernels();
  }
}

// Runs fn(index, participants) on `threads` threads of the global pool.
void parallel(int threads, const std::function<void(int, int)>& fn) {
  detail::global_pool().run(threads, fn);
}

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

// One MLP to run over a set of tokens: a routed expert, a fused shared slot, or the unfused
// shared MLP (width Is).
struct Job {
  const Bf16* gate = nullptr;  // [inter, H]
  const Bf16* up = nullptr;    // [inter, H]
  const Bf16* down = nullptr;  // [H, down_stride]
  int inter = 0;
  int down_stride = 0;
  const float* b_gate = nullptr;
  const float* b_up = nullptr;
  const float* b_down = nullptr;
  int count = 0;        // tokens routed to it
  size_t first = 0;     // index of its first token in the flat token/weight/pointer arrays
  size_t act = 0;       // offset of its [count, inter] gate/activation block; up follows it
};

}  // namespace

ForwardResult forward(const LayerWeights& w, const Bf16* x, int tokens, FuseShared fuse,
                      const FastOptions& opt) {
  const MoeSpec& spec = w.spec();
  const int H = spec.hidden;
  check_finite_input(x, tokens, H);
  const Isa isa = resolve_isa(opt.isa);
  const Kernels& kern = kernels_for(isa);
  const bool bf16_dot = kern.dot_rows_bf16 != nullptr && opt.use_bf16_dot && cpu_has_avx512_bf16();
  const int threads = resolve_threads(opt.threads);

  const bool fused = fuse == FuseShared::On || (fuse == FuseShared::Auto && spec.can_fuse_shared());
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, fused);  // throws if On is impossible

  ForwardResult result;
  result.tokens = tokens;
  result.hidden = H;
  result.fused = fused;

  // ---- router GEMM (double accumulation, like the reference, so both pick the same experts)
  const DType rdt = w.router_dtype();
  MK_CHECK(rdt == DType::BF16 || rdt == DType::F32,
           "expected router dtype BF16 or F32, got " << dtype_name(rdt));
  MK_CHECK(w.router_weight() != nullptr, "router weight of " << spec.name << " is missing");
  MK_CHECK(!spec.has_router_bias || w.router_bias() != nullptr,
           spec.name << " has a router bias but the weights hold none");
  const int C = spec.router_columns();
  const size_t TH = static_cast<size_t>(tokens) * H;
  std::vector<double> xd(TH);
  std::vector<float> xf(bf16_dot ? 0 : TH);
  for (size_t i = 0; i < TH; ++i) {
    const float v = bf16_to_float(x[i]);
    xd[i] = v;
    if (!bf16_dot) xf[i] = v;
  }
  std::vector<const double*> xd_rows(tokens);
  for (int t = 0; t < tokens; ++t) xd_rows[t] = xd.data() + static_cast<size_t>(t) * H;
  std::vector<double> logits_d(static_cast<size_t>(tokens) * C);
  if (tokens > 0) {
    const bool w_f32 = rdt == DType::F32;
    const size_t row_bytes = static_cast<size_t>(H) * (w_f32 ? 4 : 2);
    parallel(std::min(threads, C), [&](int p, int parts) {
      const int c0 = slice_begin(C, p, parts), c1 = slice_begin(C, p + 1, parts);
      if (c0 == c1) return;
      const void* wrows = static_cast<const uint8_t*>(w.router_weight()) + c0 * row_bytes;
      kern.router_dot(wrows, w_f32, H, c1 - c0, H, xd_rows.data(), tokens, logits_d.data() + c0,
                      C);
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
  result.routing = cpu_reference::route(cfg, logits.data(), tokens, w.correction_bias());
  const Routing& r = result.routing;
  result.y.assign(TH, 0.0f);
  if (tokens == 0) return result;

  // ---- group (token, slot) pairs by expert: counting sort, ascending expert id
  const int rows = spec.weight_rows(fused);  // E + S: the fused slots are experts too
  std::vector<int> count(rows, 0);
  for (int32_t id : r.ids) {
    MK_CHECK(id >= 0 && id < rows, "routing picked expert " << id << ", expected [0, " << rows
                                                            << ")");
    ++count[id];
  }
  std::vector<int> used;
  for (int e = 0; e < rows; ++e) {
    if (count[e] > 0) used.push_back(e);
  }
  const bool add_shared = !fused && spec.shared_kind != SharedKind::None;
  const size_t pairs = r.ids.size() + (add_shared ? tokens : 0);
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

  // ---- look the experts up (materialising them, in parallel, on first use)
  std::vector<ExpertView> views(used.size());
  {
    std::atomic<size_t> next{0};
    parallel(std::min<int>(threads, static_cast<int>(used.size())), [&](int, int) {
      for (size_t i; (i = next.fetch_add(1)) < used.size();) views[i] = w.expert(used[i]);
    });
  }
  const int I = spec.expert_intermediate;
  for (size_t j = 0; j < used.size(); ++j) {
    const ExpertView& ex = views[j];
    MK_CHECK(ex.w13 != nullptr && ex.w2 != nullptr,
             "expert " << used[j] << " of " << spec.name << " has null weights");
    if (spec.has_expert_bias && used[j] < spec.num_experts) {
      MK_CHECK(ex.b13 != nullptr && ex.b2 != nullptr,
               spec.name << " has expert biases but expert " << used[j] << " holds none");
    }
    Job& job = jobs[j];
    job.gate = ex.w13;
    job.up = ex.w13 + static_cast<size_t>(I) * H;
    job.down = ex.w2;
    job.inter = I;
    job.down_stride = I;
    if (ex.b13) {
      job.b_gate = ex.b13;
      job.b_up = ex.b13 + I;
    }
    job.b_down = ex.b2;
  }
  if (add_shared) {
    const int Is = spec.shared_intermediate;
    MK_CHECK(Is > 0 && w.shared_w13() != nullptr && w.shared_w2() != nullptr,
             "shared expert weights of " << spec.name << " are missing (shared_intermediate "
                                         << Is << ")");
    Job& sj = jobs.back();
    sj.gate = w.shared_w13();
    sj.up = w.shared_w13() + static_cast<size_t>(Is) * H;
    sj.down = w.shared_w2();
    sj.inter = Is;
    sj.down_stride = Is;
  }

  // ---- buffers: per job [count, inter] gate (then activation) and up blocks
  size_t act_size = 0;
  int max_count = 0;
  for (Job& job : jobs) {
    job.act = act_size;
    act_size += 2 * static_cast<size_t>(job.count) * job.inter;
    max_count = std::max(max_count, job.count);
  }
  std::vector<float> act(act_size);
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
        xf_ptr[i] = xf.data() + row;
      }
      act_ptr[i] = act.data() + job.act + static_cast<size_t>(j) * job.inter;
    }
  }
  const ActivationFn activate{spec.activation, spec.swiglu_limit, spec.swiglu_alpha,
                            spec.swiglu_beta};

  // ---- gate/up GEMM + activation: participant p owns columns [i0, i1) of every job
  parallel(threads, [&](int p, int parts) {
    for (const Job& job : jobs) {
      const int i0 = slice_begin(job.inter, p, parts), i1 = slice_begin(job.inter, p + 1, parts);
      if (i0 == i1) continue;
      float* g = act.data() + job.act;
      float* u = g + static_cast<size_t>(job.count) * job.inter;
      const size_t off = static_cast<size_t>(i0) * H;
      if (bf16_dot) {
        kern.dot_rows_bf16(job.gate + off, H, i1 - i0, H, &xb_ptr[job.first], job.count, g + i0,
                           job.inter);
        kern.dot_rows_bf16(job.up + off, H, i1 - i0, H, &xb_ptr[job.first], job.count, u + i0,
                           job.inter);
      } else {
        kern.dot_rows_f32(job.gate + off, H, i1 - i0, H, &xf_ptr[job.first], job.count, g + i0,
                          job.inter);
        kern.dot_rows_f32(job.up + off, H, i1 - i0, H, &xf_ptr[job.first], job.count, u + i0,
                          job.inter);
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
    }
  });

  // ---- down GEMM + weighted combine: participant p owns output rows [h0, h1) of y
  parallel(threads, [&](int p, int parts) {
    const int h0 = slice_begin(H, p, parts), h1 = slice_begin(H, p + 1, parts);
    const int nh = h1 - h0;
    if (nh == 0) return;
    std::vector<float> tmp(static_cast<size_t>(max_count) * nh);
    for (const Job& job : jobs) {
      kern.dot_rows_f32(job.down + static_cast<size_t>(h0) * job.down_stride, job.down_stride, nh,
                        job.inter, &act_ptr[job.first], job.count, tmp.data(), nh);
      for (int j = 0; j < job.count; ++j) {
        const float weight = wt[job.first + j];
        float* yt = result.y.data() + static_cast<size_t>(tok[job.first + j]) * H + h0;
        const float* o = tmp.data() + static_cast<size_t>(j) * nh;
        if (job.b_down) {
          for (int h = 0; h < nh; ++h) yt[h] += weight * (o[h] + job.b_down[h0 + h]);
        } else {
          for (int h = 0; h < nh; ++h) yt[h] += weight * o[h];
        }
      }
    }
  });
  return result;
}

// ---------------------------------------------------------------- read bandwidth

double measure_read_bandwidth(size_t bytes, int threads, int repeats, Isa isa) {
  MK_CHECK(bytes >= 1024, "expected a probe buffer of >= 1 KiB, got " << bytes << " bytes");
  MK_CHECK(repeats >= 1, "expected repeats >= 1, got " << repeats);
  const Kernels& kern = kernels_for(resolve_isa(isa));
  const int P = resolve_threads(threads);
  const size_t count = bytes / sizeof(float);
  // Not std::vector<float>(count): its zero-fill would first-touch every page on this thread.
  std::unique_ptr<float[]> buf(new float[count]);
  auto slice = [&](int p, int parts, size_t& b, size_t& e) {
    // 64-float (256-byte) aligned slices so no two threads share a cache line
    b = (count / 64) * p / parts * 64;
    e = p + 1 == parts ? count : (count / 64) * (p + 1) / parts * 64;
  };
  parallel(P, [&](int p, int parts) {
    size_t b, e;
    slice(p, parts, b, e);
    std::memset(buf.get() + b, 0, (e - b) * sizeof(float));
  });
  std::vector<float> sink(P);
  double best = 0.0;
  for (int rep = 0; rep <= repeats; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel(P, [&](int p, int parts) {
      size_t b, e;
      slice(p, parts, b, e);
      sink[p] += kern.read_sum(buf.get() + b, e - b);
    });
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, static_cast<double>(count * sizeof(float)) / s);
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
}

}  // namespace moekit::cpu_fast
