// `moekit tune --model M [--model M2 ...] [--batch 1-128] [--out FILE] [--format json|inc]
// [--inc tuning/sm90.inc]`: measures
// every legal router GEMM candidate (tuning::router_gemm_candidates, the generator the heuristic
// rows are drawn from) for the gate shapes of the given models' MoE layers on the present GPU, and
// writes the table: JSON for --tuning-file / MOEKIT_TUNING_FILE, or .inc lines for tuning/<arch>.inc.
// Timing: RouterGemmTimer (CUDA-graph replay, weights rotated out of L2), without PDL (or, with
// --in-step, after a stand-in for the previous layer's expert kernel, with PDL). Each
// candidate's output is checked against the naive kernel before its time counts. The choice rule
// (ours only where it beats cuBLAS by 3% at both ends of every M segment) is
// tuning::select_router_gemm_rows (src/tuning/router_gemm_select.h). The JSON form also lists
// every candidate's time per shape and M, fastest first ("measured").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "token_list.h"
#include "moekit/error.h"
#include "moekit/router_gemm.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"
#include "tuning/router_gemm_select.h"

namespace moekit::cli {
namespace {

using tuning::RouterGemmConfig;
using tuning::RouterGemmRow;
using tuning::RouterGemmShape;

// One line on stderr, redrawn in place.
class ProgressBar {
 public:
  explicit ProgressBar(long total) : total_(std::max(total, 1L)), start_(Clock::now()) {}
  void step(const std::string& what) {
    ++done_;
    const double frac = static_cast<double>(done_) / total_;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::fprintf(stderr, "\r[%s%s] %3d%% %-44s eta %4.0fs", std::string(filled, '=').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), static_cast<int>(frac * 100),
                 what.c_str(), eta);
    std::fflush(stderr);
  }
  void finish() { std::fprintf(stderr, "\n"); }

 private:
  using Clock = std::chrono::steady_clock;
  long total_;
  long done_ = 0;
  Clock::time_point start_;
};

struct TuneOptions {
  std::vector<std::string> models;
  std::string m_list = "1-128";
  std::string out;
  std::string format = "json";
  std::string inc_out;  // also write the rows as tuning/<arch>.inc lines here
  uint64_t seed = 0;
  bool in_step = false;  // time each candidate in the step (RouterGemmTimer::time_in_step_us)
};

int run_tune(const TuneOptions& o) {
  MK_CHECK(!o.models.empty(), "tune: at least one --model is required");
  MK_CHECK(o.format == "json" || o.format == "inc",
           "tune: expected --format json or inc, got '" << o.format << "'");
  const std::vector<int> ms = parse_token_list(o.m_list, "--batch");
  // Gate shapes of every MoE layer of every model, deduplicated; remember who uses each.
  std::vector<RouterGemmShape> shapes;
  std::vector<std::vector<std::string>> users;
  for (const std::string& name : o.models) {
    const MoeSpec spec = load_spec(name);
    for (const RouterGemmShape& s : tuning::router_gemm_shapes(spec)) {
      // Tables key on (dtype, K, N); the bias only adds an epilogue, so shapes differing only
      // in it share a row (timed with the bias when any model has one).
      auto it = std::find_if(shapes.begin(), shapes.end(), [&](const RouterGemmShape& x) {
        return x.weight_dtype == s.weight_dtype && x.k == s.k && x.n == s.n;
      });
      if (it == shapes.end()) {
        shapes.push_back(s);
        users.push_back({spec.name});
      } else {
        it->has_bias |= s.has_bias;
        users[it - shapes.begin()].push_back(spec.name);
      }
    }
  }
  const cuda::RouterGemmDeviceInfo dev = cuda::router_gemm_device_info();
  // Table rows cover whole segments (prev+1 .. m) of the requested M list; each segment is timed
  // at both ends (tuning/router_gemm_select.h says why).
  const std::vector<std::pair<int, int>> segments = tuning::router_gemm_segments(ms);
  const std::vector<int> points = tuning::router_gemm_measure_points(segments);
  long total = 0;
  for (const RouterGemmShape& s : shapes) {
    for (int m : points) total += static_cast<long>(tuning::router_gemm_candidates(s.weight_dtype, s.k, s.n, m).size());
  }
  std::fprintf(stderr, "moekit tune: %s (%s), %zu gate shape(s), %zu values of M (%zu measured), "
               "%ld timings, %s\n", dev.name.c_str(), tuning::arch_name(dev.arch),
               shapes.size(), ms.size(), points.size(), total,
               o.in_step ? "in the step (after a stand-in expert kernel, with PDL)" : "without PDL");
  // why without PDL: in the back-to-back timing graph each of our launches follows another
  // router GEMM that triggers its dependents early, a best case the layer does not get (its
  // router GEMM follows kernels of other ops); cuBLAS gains nothing from it. Timed plainly, ours
  // and cuBLAS are compared on equal terms, and a kernel chosen here is no slower than cuBLAS in
  // the layer whatever precedes it. `moekit bench router-gemm` quotes the same measurement.
  // --in-step: each candidate (with PDL) and cuBLAS timed after the stand-in for the previous
  // layer's expert kernel, the time each adds to the step: the layer's own situation.
  const bool pdl_default = cuda::router_gemm_pdl();
  cuda::set_router_gemm_pdl(o.in_step);
  struct PdlRestore {
    bool on;
    ~PdlRestore() { cuda::set_router_gemm_pdl(on); }
  } pdl_restore{pdl_default};
  ProgressBar bar(total);
  nlohmann::json rows_json = nlohmann::json::array();
  nlohmann::json rejected = nlohmann::json::array();
  // every timed candidate per shape and M, fastest first: why the table chose what it chose
  nlohmann::json measured = nlohmann::json::array();
  std::vector<RouterGemmRow> rows;
  for (size_t si = 0; si < shapes.size(); ++si) {
    const RouterGemmShape& shape = shapes[si];
    cuda::RouterGemmTimer timer(shape, points.back(), o.seed);
    std::map<int, std::vector<tuning::RouterGemmTiming>> per_m;  // per measured M, every candidate
    for (int m : points) {
      const std::vector<float> ref = timer.run(tuning::router_gemm_fallback(), m);
      std::vector<tuning::RouterGemmTiming> times;
      for (const RouterGemmConfig& c :
           tuning::router_gemm_candidates(shape.weight_dtype, shape.k, shape.n, m)) {
        std::ostringstream what;
        what << "[" << si + 1 << "/" << shapes.size() << "] " << tuning::describe(shape)
             << " M=" << m;
        // A candidate that fails or disagrees is reported and left out, so one bad kernel does
        // not cost the whole run; the exit status says so.
        std::ostringstream problem;
        try {
          const double diff = max_relative_difference(timer.run(c, m), ref);
          // why 1e-4: both accumulate in fp32, in different orders, over K <= ~8k terms
          if (diff <= 1e-4) {
            times.push_back({c, o.in_step ? timer.time_in_step_us(&c, m)
                                          : timer.time_config_us(c, m)});
          } else {
            problem << "disagrees with the naive kernel (max relative difference " << diff << ")";
          }
        } catch (const Error& e) {
          problem << e.what();
        }
        if (!problem.str().empty()) {
          std::fprintf(stderr, "\nmoekit tune: rejected '%s' on %s M=%d: %s\n",
                       tuning::describe(c).c_str(), tuning::describe(shape).c_str(), m,
                       problem.str().c_str());
          rejected.push_back({{"shape", tuning::describe(shape)},
                              {"m", m},
                              {"config", tuning::describe(c)},
                              {"problem", problem.str()}});
        }
        bar.step(what.str());
      }
      MK_CHECK(!times.empty(), "tune: no candidate ran on " << tuning::describe(shape)
                                                             << " M=" << m);
      std::vector<tuning::RouterGemmTiming> by_time = times;
      std::sort(by_time.begin(), by_time.end(),
                [](const auto& a, const auto& b) { return a.us < b.us; });
      nlohmann::json list = nlohmann::json::array();
      for (const tuning::RouterGemmTiming& t : by_time)
        list.push_back({{"config", tuning::describe(t.config)}, {"us", t.us}});
      measured.push_back({{"shape", tuning::describe(shape)}, {"m", m}, {"candidates", list}});
      per_m[m] = std::move(times);
    }
    std::vector<tuning::RouterGemmSegment> segs;
    for (const auto& [lo, hi] : segments) {
      tuning::RouterGemmSegment seg;
      seg.m_min = lo;
      seg.m_max = hi;
      seg.points.push_back(per_m.at(lo));
      if (hi != lo) seg.points.push_back(per_m.at(hi));
      segs.push_back(std::move(seg));
    }
    for (const tuning::RouterGemmSelectedRow& sr :
         tuning::select_router_gemm_rows(shape.weight_dtype, shape.k, shape.n, segs)) {
      const RouterGemmRow& r = sr.row;
      rows.push_back(r);
      rows_json.push_back({{"dtype", dtype_name(r.weight_dtype)},
                           {"k", r.k},
                           {"n", r.n},
                           {"m_min", r.m_min},
                           {"m_max", r.m_max},
                           {"backend", tuning::backend_name(r.config.backend)},
                           {"block", r.config.block},
                           {"tile_n", r.config.tile_n},
                           {"tile_m", r.config.tile_m},
                           {"split_k", r.config.split_k},
                           {"us_mean", sr.us_mean},
                           {"cublas_us_mean", sr.cublas_us_mean},
                           {"models", users[si]}});
    }
  }
  bar.finish();

  auto inc_text = [&] {
    std::ostringstream os;
    os << "// " << tuning::arch_name(dev.arch) << " router GEMM table, written by `moekit tune"
       << (o.in_step ? " --in-step" : "") << "` on " << dev.name << ", " << now_utc_iso()
       << ", for the models:\n//";
    for (const std::string& m : o.models) os << " " << m;
    os << "\n// Shapes and M not listed fall through to tuning/generic.inc. Every row is checked at "
          "build\n// time (src/tuning/router_gemm_tables.cpp).\n//\n"
       << tuning::tuning_inc(rows);
    return os.str();
  };
  if (!o.inc_out.empty()) {
    std::ofstream f(o.inc_out);
    MK_CHECK(f.good(), "tune: cannot write '" << o.inc_out << "'");
    f << inc_text();
    MK_CHECK(f.good(), "tune: failed writing '" << o.inc_out << "'");
    std::fprintf(stderr, "moekit tune: wrote %zu rows to %s\n", rows.size(), o.inc_out.c_str());
  }
  std::string text;
  if (o.format == "json") {
    std::ostringstream cmd;
    cmd << "moekit tune";
    for (const std::string& m : o.models) cmd << " --model " << m;
    cmd << " --batch " << o.m_list;
    if (o.in_step) cmd << " --in-step";
    nlohmann::json doc = {{"arch", tuning::arch_name(dev.arch)},
                          {"device", dev.name},
                          {"date", now_utc_iso()},
                          {"command", cmd.str()},
                          {"rows", rows_json},
                          {"rejected", rejected},
                          {"measured", measured}};
    text = doc.dump(1) + "\n";
  } else {
    text = inc_text();
  }
  if (o.out.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream f(o.out);
    MK_CHECK(f.good(), "tune: cannot write '" << o.out << "'");
    f << text;
    MK_CHECK(f.good(), "tune: failed writing '" << o.out << "'");
    std::fprintf(stderr, "moekit tune: wrote %zu rows to %s\n", rows.size(), o.out.c_str());
  }
  if (!rejected.empty()) {
    std::fprintf(stderr, "moekit tune: %zu candidate run(s) rejected (listed above); the table "
                         "uses the others\n", rejected.size());
    return 2;
  }
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("tune", "Measure router GEMM configs on this GPU, write a table");
  auto o = std::make_shared<TuneOptions>();
  cmd->add_option("--model,-m", o->models, "Model short name or config path (repeatable)")
      ->required();
  cmd->add_option("--batch,-b", o->m_list, "Token counts M: '1-128', '1,2,4', '1-16,32'")
      ->capture_default_str();
  cmd->add_option("--out,-o", o->out, "Output file (default stdout)");
  cmd->add_option("--format", o->format, "json (tuning file) | inc (tuning/<arch>.inc lines)")
      ->capture_default_str();
  cmd->add_option("--inc", o->inc_out, "Also write the rows as .inc lines (tuning/<arch>.inc)");
  cmd->add_option("--seed", o->seed, "Seed of the random weights and inputs")->capture_default_str();
  cmd->add_flag("--in-step", o->in_step,
                "Time candidates in the decode step (after a stand-in expert kernel, with PDL) "
                "instead of alone without PDL");
  cmd->callback([o] {
    const int status = run_tune(*o);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace moekit::cli
