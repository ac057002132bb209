// `moekit bench --device cpu`: one MoE layer on the CPU, per batch and fuse mode, against the
// machine's read bandwidth measured in the same run.
//
// For each batch T and fuse mode (fused and unfused when the model has a shared expert):
//   us_per_layer   median wall time of one forward (fast backend with --threads, and again with
//                  1 thread to show the scaling, or the reference with --backend reference)
//   gb_per_s       bytes the layer must read / time: the distinct experts the routing touched
//                  (fused shared slots count as experts) + the unfused shared MLP + the router
//                  weight, the experts and the shared MLP in the bytes of --dtype (fp8: a byte a
//                  weight + its tile scales; MX: packed elements + e8m0 bytes); activations are
//                  negligible and not counted
//   bw_fraction    gb_per_s / the read bandwidth of the same thread count, measured here by
//                  summing a 1 GiB buffer (cpu_fast::ReadProbe) in passes interleaved with the
//                  timed forwards (medians of both), since the machine may be shared
//   tokens_per_s   T / (us_per_layer * MoE layers): a decode step over every MoE layer
//   speedup_vs_reference   reference median / fast median, same inputs (the reference is skipped
//                  where one call would take more than ~10 s, and the field is null)
//   phase_us       the fast backend's medians per phase (cpu_fast::PhaseTimes): router (and
//                  routing), gate_up (grouping, gate/up GEMM, activation), down, combine
//
// --dtype (bf16 | fp8 | mxfp4 | mxfp8, or config: what the config declares) is how the experts are
// held: random weights quantised as save_checkpoint writes that form (make_random_weights), or a
// checkpoint kept in it. fp8 runs weight-only in both backends (the fast one has no W8A8).
// Random expert weights are generated lazily on first use, and generation must not pollute the
// timings. When every expert fits comfortably in memory (Qwen3-30B: 0.45 GB, MiniMax-M2: 7.2 GB)
// all are materialised up front and each iteration takes the next of 8 different inputs, so the
// touched experts change between iterations as in real decoding. Otherwise (DeepSeek-V3: 22.6 GB)
// one fixed input per batch is used and only its experts are materialised, with a message; a
// batch whose experts do not fit is skipped with a message.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli_common.h"
#include "cli_context.h"
#include "commands.h"
#include "io/mem_available.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

namespace moekit::cli {
namespace {

constexpr size_t kProbeBytes = size_t{1} << 30;  // >= 1 GB: far beyond any cache
constexpr int kRotatingInputs = 8;
constexpr double kMinTimedSeconds = 1.0;
constexpr int kMinIterations = 5;
constexpr int kMaxIterations = 200;
// Skip the reference when one call would take longer than this (estimated from its MAC count).
constexpr double kReferenceBudgetSeconds = 10.0;
constexpr double kReferenceMacsPerSecond = 0.4e9;  // double scalar loops, measured on the dev box
constexpr int kReferenceIterations = 3;

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Bytes of one expert and of the shared MLP held in format f.
struct MlpBytes {
  double expert = 0, shared = 0;
};
MlpBytes mlp_bytes(const MoeSpec& spec, ExpertFormat f) {
  switch (f) {
    case ExpertFormat::Fp8Block:
      return {static_cast<double>(spec.fp8_expert_bytes()),
              static_cast<double>(spec.fp8_shared_bytes())};
    case ExpertFormat::Mxfp4:
    case ExpertFormat::Mxfp8:
      return {static_cast<double>(mx_mlp_bytes(f, spec.expert_intermediate, spec.hidden)),
              static_cast<double>(mx_mlp_bytes(f, spec.shared_intermediate, spec.hidden))};
    case ExpertFormat::Bf16:
      break;
  }
  return {static_cast<double>(spec.expert_bytes()), static_cast<double>(spec.shared_bytes())};
}

// Bytes one forward must read: distinct touched experts (and fused slots), the unfused shared
// MLP, the router weight.
double layer_bytes(const MoeSpec& spec, const MlpBytes& b, const ForwardResult& r) {
  const std::set<int32_t> touched(r.routing.ids.begin(), r.routing.ids.end());
  const bool unfused_shared = !r.fused && spec.shared_kind != SharedKind::None;
  return static_cast<double>(touched.size()) * b.expert + (unfused_shared ? b.shared : 0) +
         static_cast<double>(spec.router_bytes());
}

struct Timing {
  double us = 0;        // median per forward
  double gb_per_s = 0;  // median of per-iteration bytes / time
  double read_bw = 0;   // median of the interleaved probe passes, bytes/s (0 = none)
  int iterations = 0;
  double experts = 0;           // mean distinct experts (and fused slots) touched per forward
  cpu_fast::PhaseTimes phases;  // medians of each phase's time (the fast backend)
};

// Times fn(input index) over the inputs in rotation. With a probe, rounds alternate one probe
// pass (same thread count) with forwards for at least as long, so the ceiling and the layer see
// the same machine load; medians of both. Without a probe (the reference), plain iterations.
// iterations > 0 fixes the number of timed forwards, else at least kMinIterations and
// kMinTimedSeconds. phases: where fn's forwards write their phases' times (null: none).
template <typename Fn>
Timing time_forward(const MoeSpec& spec, const MlpBytes& bytes, int inputs, int iterations,
                    bool warmup, cpu_fast::ReadProbe* probe, int probe_threads,
                    const cpu_fast::PhaseTimes* phases, Fn fn) {
  if (warmup) {
    for (int i = 0; i < inputs; ++i) fn(i);
  }
  std::vector<double> us, bw, probe_bw, router, gate_up, down, combine;
  double experts = 0;
  auto done = [&](double elapsed) {
    const int it = static_cast<int>(us.size());
    if (iterations > 0) return it >= iterations;
    const bool enough_probes = probe == nullptr || probe_bw.size() >= 3;
    return (it >= kMinIterations && elapsed >= kMinTimedSeconds && enough_probes) ||
           it >= kMaxIterations;
  };
  const auto start = std::chrono::steady_clock::now();
  int next_input = 0;
  while (!done(seconds_since(start))) {
    double round_budget = 0;  // forwards run at least this long after a probe pass
    if (probe != nullptr) {
      const auto p0 = std::chrono::steady_clock::now();
      probe_bw.push_back(probe->pass(probe_threads));
      round_budget = seconds_since(p0);
    }
    const auto r0 = std::chrono::steady_clock::now();
    do {
      const int i = next_input++ % inputs;
      const auto t0 = std::chrono::steady_clock::now();
      const ForwardResult r = fn(i);
      const double s = seconds_since(t0);
      us.push_back(s * 1e6);
      bw.push_back(layer_bytes(spec, bytes, r) / s / 1e9);
      if (phases != nullptr) {
        router.push_back(phases->router);
        gate_up.push_back(phases->gate_up);
        down.push_back(phases->down);
        combine.push_back(phases->combine);
      }
      experts +=
          static_cast<double>(std::set<int32_t>(r.routing.ids.begin(), r.routing.ids.end()).size());
    } while (seconds_since(r0) < round_budget && !done(seconds_since(start)));
  }
  Timing t{median(us), median(bw), 0, static_cast<int>(us.size()),
           experts / static_cast<double>(us.size())};
  if (!probe_bw.empty()) t.read_bw = median(probe_bw);
  if (phases != nullptr)
    t.phases = {median(router), median(gate_up), median(down), median(combine)};
  return t;
}

}  // namespace

int run_bench_cpu(const BenchOptions& opt) {
  const MoeSpec spec = load_spec(opt.model);
  const int layer = pick_moe_layer(spec, -1);
  // Before anything is allocated: each batch's rotating inputs and activations, and the read
  // probe, must fit (the experts that do not fit skip their batch below).
  for (int tokens : opt.batches) {
    HostMemoryEstimate need = host_memory_estimate(spec, tokens, spec.can_fuse_shared());
    need.weights = 0;
    need.inputs *= kRotatingInputs;
    need.workspace = kProbeBytes;
    check_host_memory(need, spec.name + " (bench --batch " + std::to_string(tokens) + ")");
  }
  const ExpertFormat format = bench_format(spec, opt.dtype);
  const MlpBytes bytes = mlp_bytes(spec, format);
  const auto weights = load_layer_weights(spec, layer, opt.weights, opt.seed, format);
  const std::string backend = opt.backend;
  MK_CHECK(backend == "fast" || backend == "reference",
           "--backend '" << backend << "' is not one of fast, reference");
  const bool fast = backend == "fast";
  const int threads = cpu_fast::resolve_threads(opt.threads);
  const cpu_fast::Isa isa = cpu_fast::resolve_isa(cpu_fast::Isa::Auto);
  const int moe_layers = static_cast<int>(spec.moe_layers.size());
  std::ostream& log = opt.json ? std::cerr : std::cout;

  std::vector<FuseShared> fuses = {opt.fuse};
  if (opt.fuse == FuseShared::Auto && spec.can_fuse_shared()) {
    fuses = {FuseShared::On, FuseShared::Off};
  }

  // ---- the bandwidth ceiling: same process, same thread counts, passes interleaved with the
  // timed forwards (the machine may be shared: its load changes during a run)
  const bool scaling = fast && threads > 1;
  cpu_fast::ReadProbe probe(kProbeBytes);
  probe.pass(threads);  // warm-up
  const double bw_start = probe.pass(threads);

  // ---- weights: all experts up front when they fit, else a fixed input per batch
  const int slots_total = spec.num_experts + spec.shared_slots();
  const double all_bytes = static_cast<double>(slots_total) * bytes.expert;
  const double available = static_cast<double>(mem_available_bytes());
  const bool prefetch_all = opt.weights.empty() && available > 0 && all_bytes < 0.6 * available;
  if (prefetch_all) {
    log << "materialising all " << slots_total << " experts (" << human_bytes(all_bytes)
        << ") so timings exclude weight generation...\n";
    std::vector<int> all(slots_total);
    for (int e = 0; e < slots_total; ++e) all[e] = e;
    weights->prefetch(all);
  } else {
    log << "note: all experts of " << spec.name << " (" << human_bytes(all_bytes)
        << ") do not fit in 60% of the " << human_bytes(available)
        << " available; each batch uses one fixed input and materialises only its experts\n";
  }

  const std::string cpu = cpu_model_name();
  const std::string date = utc_now();
  nlohmann::json records = nlohmann::json::array();
  char line[256];
  if (!opt.json) {
    std::printf(
        "%s layer %d (%d MoE layers), experts %s, %s, %s, %d threads; read bandwidth at start "
        "%.1f GB/s\n",
        spec.name.c_str(), layer, moe_layers, expert_format_name(format), cpu.c_str(),
        cpu_fast::isa_name(isa), threads, bw_start / 1e9);
    std::printf("%-6s %-5s %-9s %7s %11s %10s %8s %8s %7s %7s\n", "batch", "fuse", "backend",
                "threads", "us/layer", "tokens/s", "GB/s", "read bw", "of bw", "x ref");
  }

  for (int tokens : opt.batches) {
    const int inputs = prefetch_all ? kRotatingInputs : 1;
    if (!prefetch_all) {
      const double need =
          static_cast<double>(host_bytes_needed(spec, tokens, spec.can_fuse_shared()));
      if (need > 0.8 * static_cast<double>(mem_available_bytes())) {
        log << "skipping batch " << tokens << ": its experts need " << human_bytes(need) << ", "
            << human_bytes(static_cast<double>(mem_available_bytes())) << " available\n";
        continue;
      }
    }
    std::vector<std::vector<Bf16>> xs;
    for (int i = 0; i < inputs; ++i) xs.push_back(random_input(spec, tokens, opt.seed + 1 + i));

    for (FuseShared fuse : fuses) {
      struct Row {
        std::string backend;
        int threads;
        Timing t;
        double bw;
      };
      std::vector<Row> rows;
      if (fast) {
        std::vector<int> thread_counts = {threads};
        if (scaling) thread_counts.push_back(1);
        for (int th : thread_counts) {
          cpu_fast::PhaseTimes phases;
          cpu_fast::FastOptions fo;
          fo.threads = th;
          fo.phases = &phases;
          const Timing t = time_forward(
              spec, bytes, inputs, opt.iterations, true, &probe, th, &phases,
              [&](int i) { return cpu_fast::forward(*weights, xs[i].data(), tokens, fuse, fo); });
          rows.push_back({"fast", th, t, t.read_bw});
        }
      }

      // Reference: timed when one call is affordable (it is the baseline of the speed-up).
      const double macs =
          static_cast<double>(tokens) *
          (spec.top_k +
           (spec.shared_kind != SharedKind::None ? std::max(1, spec.shared_slots()) : 0)) *
          3.0 * spec.expert_intermediate * spec.hidden;
      const bool run_ref = !fast || macs / kReferenceMacsPerSecond <= kReferenceBudgetSeconds;
      Timing ref;
      if (run_ref) {
        // After the fast rows the touched experts are materialised: no warm-up needed for the
        // baseline (a call can take seconds), except when the reference runs alone. Beside the
        // fast rows it is only the speed-up's baseline: at most kReferenceIterations calls,
        // whatever --iterations asks of the fast rows.
        int ref_iterations = macs / kReferenceMacsPerSecond > 1.0 ? 1 : kReferenceIterations;
        if (opt.iterations > 0) {
          ref_iterations = fast ? std::min(opt.iterations, ref_iterations) : opt.iterations;
        }
        ref = time_forward(spec, bytes, inputs, ref_iterations, !fast, nullptr, 0, nullptr,
                           [&](int i) {
                             return cpu_reference::forward(*weights, xs[i].data(), tokens, fuse,
                                                           Fp8Compute::WeightOnly);
                           });
      } else {
        log << "reference skipped at batch " << tokens << " (~"
            << static_cast<int>(macs / kReferenceMacsPerSecond) << " s per call)\n";
      }

      if (!fast) {
        // the reference is compute-bound; its fraction uses a probe measured right after it
        rows.push_back(
            {"reference", threads, ref, cpu_fast::measure_read_bandwidth(kProbeBytes, threads, 3)});
      }

      for (const Row& row : rows) {
        const double tps = tokens / (row.t.us * 1e-6 * moe_layers);
        const double frac = row.t.gb_per_s * 1e9 / row.bw;
        nlohmann::json rec = {{"model", spec.name},
                              {"layer", layer},
                              {"moe_layers", moe_layers},
                              {"device", "cpu"},
                              {"backend", row.backend},
                              {"isa", row.backend == "fast" ? cpu_fast::isa_name(isa) : "scalar"},
                              {"batch", tokens},
                              {"dtype", expert_format_name(format)},
                              {"fuse_shared", fuse_shared_name(fuse)},
                              {"us_per_layer", row.t.us},
                              {"tokens_per_s", tps},
                              {"gb_per_s", row.t.gb_per_s},
                              {"read_bw_gb_per_s", row.bw / 1e9},
                              {"bw_fraction", frac},
                              {"threads", row.threads},
                              {"iterations", row.t.iterations},
                              {"experts_touched", row.t.experts},
                              {"distinct_inputs", inputs},
                              {"cpu", cpu},
                              {"date", date},
                              {"command", command_line()}};
        if (row.backend == "fast") {
          const cpu_fast::PhaseTimes& ph = row.t.phases;
          rec["phase_us"] = {{"router", ph.router},
                             {"gate_up", ph.gate_up},
                             {"down", ph.down},
                             {"combine", ph.combine}};
        }
        double speedup = 0;
        if (run_ref) {
          speedup = ref.us / row.t.us;
          rec["speedup_vs_reference"] = speedup;
        } else {
          rec["speedup_vs_reference"] = nullptr;
        }
        records.push_back(rec);
        if (!opt.json) {
          std::snprintf(line, sizeof line, "%-6d %-5s %-9s %7d %11.1f %10.2f %8.2f %8.2f %6.0f%% ",
                        tokens, fuse_shared_name(fuse), row.backend.c_str(), row.threads, row.t.us,
                        tps, row.t.gb_per_s, row.bw / 1e9, 100.0 * frac);
          std::printf("%s", line);
          if (run_ref) {
            std::printf("%7.1f\n", speedup);
          } else {
            std::printf("%7s\n", "-");
          }
          std::fflush(stdout);
        }
      }
    }
  }
  if (opt.json) std::cout << records.dump(2) << "\n";
  return 0;
}

}  // namespace moekit::cli
