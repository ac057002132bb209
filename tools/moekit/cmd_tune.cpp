// `moekit tune --model M [--model M2 ...] [--batch 1-128] [--out FILE] [--format json|inc]
// [--inc tuning/sm90.inc]`: measures
// every legal router GEMM candidate (tuning::router_gemm_candidates, the generator the heuristic
// rows are drawn from) for the gate shapes of the given models' MoE layers on the present GPU, and
// writes the table: JSON for --tuning-file / MOEKIT_TUNING_FILE, or .inc lines for tuning/<arch>.inc.
// Timing: RouterGemmTimer (CUDA-graph replay, weights rotated out of L2). Each candidate's output
// is checked against the naive kernel before its time counts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "token_list.h"
#include "moekit/error.h"
#include "moekit/router_gemm.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"

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

struct Measured {
  RouterGemmConfig config;
  double us;
};

// Max |a - b| over max |b|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1e-30, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
  }
  return diff / scale;
}

struct TuneOptions {
  std::vector<std::string> models;
  std::string m_list = "1-128";
  std::string out;
  std::string format = "json";
  std::string inc_out;  // also write the rows as tuning/<arch>.inc lines here
  uint64_t seed = 0;
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
  long total = 0;
  for (const RouterGemmShape& s : shapes) {
    for (int m : ms) total += static_cast<long>(tuning::router_gemm_candidates(s.weight_dtype, s.k, s.n, m).size());
  }
  std::fprintf(stderr, "moekit tune: %s (%s), %zu gate shape(s), %zu values of M, %ld timings\n",
               dev.name.c_str(), tuning::arch_name(dev.arch), shapes.size(), ms.size(), total);
  ProgressBar bar(total);
  nlohmann::json rows_json = nlohmann::json::array();
  nlohmann::json rejected = nlohmann::json::array();
  std::vector<RouterGemmRow> rows;
  for (size_t si = 0; si < shapes.size(); ++si) {
    const RouterGemmShape& shape = shapes[si];
    cuda::RouterGemmTimer timer(shape, ms.back(), o.seed);
    std::vector<std::vector<Measured>> per_m;  // per M, every candidate
    for (int m : ms) {
      const std::vector<float> ref = timer.run(tuning::router_gemm_fallback(), m);
      std::vector<Measured> times;
      for (const RouterGemmConfig& c :
           tuning::router_gemm_candidates(shape.weight_dtype, shape.k, shape.n, m)) {
        std::ostringstream what;
        what << "[" << si + 1 << "/" << shapes.size() << "] " << tuning::describe(shape)
             << " M=" << m;
        // A candidate that fails or disagrees is reported and left out, so one bad kernel does
        // not cost the whole run; the exit status says so.
        std::ostringstream problem;
        try {
          const double diff = relative_difference(timer.run(c, m), ref);
          // why 1e-4: both accumulate in fp32, in different orders, over K <= ~8k terms
          if (diff <= 1e-4) {
            times.push_back({c, timer.time_config_us(c, m)});
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
      per_m.push_back(std::move(times));
    }
    // Rows: keep the running config while it stays within 2% of the best at this M (fewer rows,
    // no flapping between configs that timing noise cannot separate), else start a new row.
    auto time_of = [](const std::vector<Measured>& v, const RouterGemmConfig& c) -> double {
      for (const Measured& x : v)
        if (x.config == c) return x.us;
      return INFINITY;
    };
    int row_start = -1;
    RouterGemmConfig current;
    double cublas_us_sum = 0, best_us_sum = 0;
    auto close_row = [&](int end_index) {
      RouterGemmRow r;
      r.weight_dtype = shape.weight_dtype;
      r.k = shape.k;
      r.n = shape.n;
      r.m_min = row_start == 0 ? 1 : ms[row_start - 1] + 1;
      r.m_max = ms[end_index];
      r.config = current;
      tuning::validate_row(r, "tune");
      rows.push_back(r);
      nlohmann::json j = {{"dtype", dtype_name(r.weight_dtype)},
                          {"k", r.k},
                          {"n", r.n},
                          {"m_min", r.m_min},
                          {"m_max", r.m_max},
                          {"backend", tuning::backend_name(r.config.backend)},
                          {"block", r.config.block},
                          {"tile_n", r.config.tile_n},
                          {"tile_m", r.config.tile_m},
                          {"split_k", r.config.split_k},
                          {"us_mean", best_us_sum / (end_index - row_start + 1)},
                          {"cublas_us_mean", cublas_us_sum / (end_index - row_start + 1)},
                          {"models", users[si]}};
      rows_json.push_back(j);
      cublas_us_sum = best_us_sum = 0;
    };
    for (size_t i = 0; i < ms.size(); ++i) {
      const auto& v = per_m[i];
      const Measured best = *std::min_element(
          v.begin(), v.end(), [](const Measured& a, const Measured& b) { return a.us < b.us; });
      if (row_start < 0) {
        row_start = 0;
        current = best.config;
      } else if (!(time_of(v, current) <= best.us * 1.02)) {
        close_row(static_cast<int>(i) - 1);
        row_start = static_cast<int>(i);
        current = best.config;
      }
      best_us_sum += time_of(v, current);
      cublas_us_sum += time_of(v, RouterGemmConfig{tuning::RouterGemmBackend::Cublas, 0, 0, 0, 1});
    }
    close_row(static_cast<int>(ms.size()) - 1);
  }
  bar.finish();

  auto inc_text = [&] {
    std::ostringstream os;
    os << "// " << tuning::arch_name(dev.arch) << " router GEMM table, written by `moekit tune` on "
       << dev.name << ", " << now_utc_iso() << ", for the models:\n//";
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
    nlohmann::json doc = {{"arch", tuning::arch_name(dev.arch)},
                          {"device", dev.name},
                          {"date", now_utc_iso()},
                          {"command", cmd.str()},
                          {"rows", rows_json},
                          {"rejected", rejected}};
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
  cmd->callback([o] {
    const int status = run_tune(*o);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace moekit::cli
