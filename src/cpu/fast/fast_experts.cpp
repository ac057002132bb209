// experts(): phases 2-5 of the fast CPU layer (fast_layer.cpp), on routing that is given.
//
//   2. group      the T*(k+S) (token, slot) pairs become one job per touched expert (ascending id)
//                 holding its tokens and weights; the unfused shared MLP is one more job (width
//                 Is, every token, weight = shared_scale).
//   3. gate/up    units of 2 MB, then 256 KB, of bf16-equivalent weights (a block of intermediate
//                 columns of one job: its gate and up rows; make_units) are taken by the threads
//                 dynamically; each unit streams its rows once for all of the job's tokens,
//                 then applies the activation (SiLU·mul, clamps, swigluoai, biases) to its
//                 columns while they are in cache. Experts used for the first time are
//                 materialised here, by the units that need them.
//   4. down       units of one job's W2 rows, sized as gate/up's: down[pair, rows] = W2 a + b2;
//                 the same run of the threads as gate/up's, each job's units starting once its
//                 gate/up units are done. (The bias here, not in the combine: its rows are read
//                 by the threads that stream the job, not by one thread after them.)
//   5. combine    y[t] += w * down, blocks of y columns per thread, jobs in a fixed order
//                 (no atomics; the combine reads ~T*(k+S)*H*4 bytes, << the weights).
//
// Why units of every expert rather than whole experts per thread: all threads stream
// whatever the routing (balanced at T=1 with 8 experts on 3 cores as well as at T=128), and a
// thread that the OS deschedules does not hold up a phase. Each output element is computed by one
// kernel call whose summation order depends only on k, and units depend only on the shapes, so
// the result does not depend on the thread count.
//
// The first GEMM uses bf16 activations with vdpbf16ps on AVX512-BF16 CPUs (exact products), fp32
// activations elsewhere; the down projection always uses fp32 activations. Each expert format's
// weights and rows are expert_jobs.h's.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "cpu/experts_routing_check.h"
#include "cpu/fast/expert_jobs.h"
#include "cpu/fast/fast_common.h"
#include "cpu/fast/kernels.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"

namespace moekit::cpu_fast {

namespace {

using detail::Job;
using detail::Kernels;
using detail::kernels_for;
using detail::run_units;
using detail::scratch;

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

// Pauses a down unit spins for its job's gate/up units before it yields its core between polls.
constexpr int kSpinsBeforeYield = 4096;

// Below this size a phase runs on the calling thread: waking a worker costs more than it saves.
constexpr double kSerialCombineElements = 1e6;

// A piece of work: rows [begin, end) of one job's weight matrix.
struct Unit {
  int job;
  int begin, end;
};

// Cuts every job's `extent(job)` rows into units, taken dynamically by whichever thread is free
// (the machine may be shared, and a thread that is descheduled must not hold up the phase): the
// first 3/4 of a job's rows (whole big units) in units of kBigUnitBytes of bf16-equivalent
// weights, every job's big units first, then the rest in units of kUnitBytes, so a phase ends on
// small units and the threads finish together. why big units: each unit costs time beyond its
// bytes once threads stream side by side (docs/decisions/cpu_thread_pool.md). Unit boundaries
// depend only on the shapes, never on the thread count.
constexpr size_t kUnitBytes = size_t{256} << 10;
constexpr size_t kBigUnitBytes = size_t{2} << 20;

template <typename Extent, typename RowBytes>
std::vector<Unit> make_units(const std::vector<Job>& jobs, Extent extent, RowBytes row_bytes) {
  std::vector<Unit> units, small;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int n = extent(jobs[j]);
    const size_t bytes = row_bytes(jobs[j]);
    const int big = static_cast<int>(std::max<size_t>(1, kBigUnitBytes / bytes));
    const int step = static_cast<int>(std::max<size_t>(1, kUnitBytes / bytes));
    const int split = n * 3 / 4 / big * big;
    for (int b = 0; b < split; b += big) units.push_back({static_cast<int>(j), b, b + big});
    for (int b = split; b < n; b += step)
      small.push_back({static_cast<int>(j), b, std::min(n, b + step)});
  }
  units.insert(units.end(), small.begin(), small.end());
  return units;
}

}  // namespace

std::vector<float> experts(const LayerWeights& w, const Bf16* x, int tokens, const Routing& r,
                           bool add_shared, const FastOptions& opt, int held_begin, int held_end) {
  const MoeSpec& spec = w.spec();
  const int H = spec.hidden;
  const int E = spec.num_experts;
  const Isa isa = resolve_isa(opt.isa);
  const Kernels& kern = kernels_for(isa);
  const bool bf16_dot = kern.dot_rows_bf16 != nullptr && opt.use_bf16_dot && cpu_has_avx512_bf16();
  const int threads = resolve_threads(opt.threads);
  const int fused_slots =
      cpu_detail::check_experts_routing(spec, tokens, r, add_shared, held_begin, held_end);
  MK_CHECK(
      !add_shared || r.shared_scale.empty() || r.shared_scale.size() == static_cast<size_t>(tokens),
      "expected " << tokens << " shared scales, got " << r.shared_scale.size());
  const auto start = std::chrono::steady_clock::now();
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
    Job& sj = jobs.back();
    sj.inter = spec.shared_intermediate;
    sj.down_stride = spec.shared_intermediate;
    detail::attach_shared_weights(w, sj);
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

  // ---- gate/up GEMM + activation, in units of intermediate columns of one job; then the down
  // GEMM, in units of output rows of one job: down[pair, H] = W2 a + b2. One run takes
  // the gate/up units and then the down units, and a down unit waits until its job's gate/up units
  // are done (up_left), so no thread idles between the two GEMMs while another ends its last
  // gate/up unit. (Every gate/up unit is taken before any down unit, by a thread that runs it: the
  // waits end; a gate/up unit that throws, e.g. an unreadable expert, counts itself done and
  // fails the run: the down units that follow skip their work, and run_units rethrows.)
  const std::vector<Unit> up_units = make_units(
      jobs, [&](const Job& j) { return j.inter; },
      [&](const Job&) { return 4 * static_cast<size_t>(H); });  // gate + up row, bf16
  const std::vector<Unit> down_units = make_units(
      jobs, [&](const Job&) { return H; },
      [&](const Job& j) { return 2 * static_cast<size_t>(j.inter); });
  float* down = scratch(down_buffer, pairs * static_cast<size_t>(H));
  std::vector<std::atomic<int>> up_left(jobs.size());
  for (auto& n : up_left) n.store(0, std::memory_order_relaxed);
  for (const Unit& u : up_units) up_left[u.job].fetch_add(1, std::memory_order_relaxed);
  std::atomic<size_t> up_units_left{up_units.size()};
  std::atomic<bool> up_failed{false};
  std::chrono::steady_clock::time_point up_end = start;  // (written by the last gate/up unit)
  auto gate_up_work = [&](const Unit& unit) {
    Job job = jobs[unit.job];
    if (job.expert >= 0) detail::attach_weights(w, job);
    const int i0 = unit.begin, i1 = unit.end;
    float* g = act + job.act;
    float* u = g + static_cast<size_t>(job.count) * job.inter;
    const float* const* xfj = bf16_dot ? nullptr : xf_ptr.data() + job.first;
    const Bf16* const* xbj = bf16_dot ? xb_ptr.data() + job.first : nullptr;
    detail::project_gate_up(kern, job, H, i0, i1, xfj, xbj, g, u);
    for (int j = 0; j < job.count; ++j) {
      float* gj = g + static_cast<size_t>(j) * job.inter;
      const float* uj = u + static_cast<size_t>(j) * job.inter;
      for (int i = i0; i < i1; ++i) {
        const float gv = job.b_gate ? gj[i] + job.b_gate[i] : gj[i];
        const float uv = job.b_up ? uj[i] + job.b_up[i] : uj[i];
        gj[i] = activate(gv, uv);
      }
    }
  };
  auto gate_up_unit = [&](const Unit& unit) {
    try {
      gate_up_work(unit);
    } catch (...) {
      up_failed.store(true, std::memory_order_relaxed);
      up_left[unit.job].fetch_sub(1, std::memory_order_release);
      throw;
    }
    up_left[unit.job].fetch_sub(1, std::memory_order_release);
    if (up_units_left.fetch_sub(1, std::memory_order_relaxed) == 1) {
      up_end = std::chrono::steady_clock::now();
    }
  };
  auto down_unit = [&](const Unit& unit) {
    // (after a while the wait yields its core, which the unit it waits for may need)
    for (int spins = 0; up_left[unit.job].load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < kSpinsBeforeYield) {
        detail::cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    if (up_failed.load(std::memory_order_relaxed)) return;
    Job job = jobs[unit.job];
    if (job.expert >= 0) detail::attach_weights(w, job);  // materialised by now: a lookup
    float* out = down + job.first * H;
    detail::project_down(kern, job, H, unit.begin, unit.end, act_ptr.data() + job.first, out);
    if (job.b_down) {
      for (int j = 0; j < job.count; ++j) {
        float* o = out + static_cast<size_t>(j) * H;
        for (int h = unit.begin; h < unit.end; ++h) o[h] += job.b_down[h];
      }
    }
  };
  const size_t n_up = up_units.size();
  run_units(threads, n_up + down_units.size(), [&](size_t i) {
    if (i < n_up) {
      gate_up_unit(up_units[i]);
    } else {
      down_unit(down_units[i - n_up]);
    }
  });
  // opt.phases: each phase's time from the end of the one before (gate/up: to the end of its
  // last unit, which down units may overlap)
  auto phase_start = start;
  auto phase_end = [&](double PhaseTimes::*phase, std::chrono::steady_clock::time_point end) {
    if (opt.phases == nullptr) return;
    opt.phases->*phase = std::chrono::duration<double, std::micro>(end - phase_start).count();
    phase_start = end;
  };
  phase_end(&PhaseTimes::gate_up, up_end);
  phase_end(&PhaseTimes::down, std::chrono::steady_clock::now());

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
        for (int h = h0; h < h1; ++h) yt[h] += weight * o[h];
      }
    }
  });
  phase_end(&PhaseTimes::combine, std::chrono::steady_clock::now());
  return y;
}

}  // namespace moekit::cpu_fast
