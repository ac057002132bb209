// The fast CPU layer (UA_MODEL, default gpt-oss-120b, in UA_FORMAT mxfp4 | mxfp8 | fp8; one token, all threads) under configurations set by
// environment variables, alternated forward by forward in one process over the same materialised
// experts (64 rotating inputs): per configuration the median µs per forward and per phase.
// argv: forwards per configuration, then configurations as NAME=VALUE[,NAME=VALUE...] or "base".
// UA_THREADS: threads (default all); UA_INPUTS: rotating inputs (default 64, every expert
// materialised first; fewer: the warm-up forwards materialise what they touch).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <set>
#include <vector>

#include "moekit/expert_format.h"

#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"

using namespace moekit;

static void apply_config(const std::string& cfg, const std::vector<std::string>& all) {
  for (const auto& c : all)  // unset every variable any configuration sets
    for (size_t a = 0; a < c.size();) {
      size_t e = c.find('=', a), n = c.find(',', a);
      if (e == std::string::npos) break;
      unsetenv(c.substr(a, e - a).c_str());
      a = n == std::string::npos ? c.size() : n + 1;
    }
  for (size_t a = 0; a < cfg.size();) {
    size_t e = cfg.find('=', a), n = cfg.find(',', a);
    if (e == std::string::npos) break;
    const size_t end = n == std::string::npos ? cfg.size() : n;
    setenv(cfg.substr(a, e - a).c_str(), cfg.substr(e + 1, end - e - 1).c_str(), 1);
    a = end + 1;
  }
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int main(int argc, char** argv) {
  const int per = argc > 1 ? std::atoi(argv[1]) : 40;
  std::vector<std::string> cfgs;
  for (int i = 2; i < argc; ++i) cfgs.push_back(argv[i]);
  if (cfgs.empty()) cfgs = {"base"};
  const char* model = std::getenv("UA_MODEL") ? std::getenv("UA_MODEL") : "gpt-oss-120b";
  const MoeSpec spec = load_spec(model);
  const int layer = spec.moe_layers.front();
  const std::string f = std::getenv("UA_FORMAT") ? std::getenv("UA_FORMAT") : "mxfp4";
  const ExpertFormat fmt = f == "fp8"     ? ExpertFormat::Fp8Block
                           : f == "mxfp8" ? ExpertFormat::Mxfp8
                                          : ExpertFormat::Mxfp4;
  auto w = make_random_weights(spec, layer, 7, fmt);
  std::vector<int> all(spec.num_experts + spec.shared_slots());
  for (size_t e = 0; e < all.size(); ++e) all[e] = static_cast<int>(e);
  const int inputs = std::getenv("UA_INPUTS") ? std::atoi(std::getenv("UA_INPUTS")) : 64;
  if (inputs >= 64) w->prefetch(all);  // else the warm-up forwards materialise what they touch
  std::vector<std::vector<Bf16>> xs(inputs, std::vector<Bf16>(spec.hidden));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : xs)
    for (auto& v : x) v = float_to_bf16(nd(rng));
  const double expert_bytes =
      fmt == ExpertFormat::Fp8Block
          ? static_cast<double>(spec.fp8_expert_bytes())
          : static_cast<double>(mx_mlp_bytes(fmt, spec.expert_intermediate, spec.hidden));
  const int probe_threads = cpu_fast::resolve_threads(
      std::getenv("UA_THREADS") ? std::atoi(std::getenv("UA_THREADS")) : 0);
  cpu_fast::ReadProbe probe(size_t{1} << 30);
  probe.pass(probe_threads);
  std::vector<double> probe_bw, bytes_seen;
  std::vector<std::vector<double>> t(cfgs.size()), ph[4];
  for (auto& p : ph) p.resize(cfgs.size());
  int xi = 0;
  const int warm = inputs >= 64 ? 2 : (inputs + static_cast<int>(cfgs.size()) - 1) / static_cast<int>(cfgs.size()) + 1;
  for (int rep = -warm; rep < per; ++rep) {
    if (rep >= 0 && rep % 10 == 0) probe_bw.push_back(probe.pass(probe_threads));
    for (size_t c = 0; c < cfgs.size(); ++c) {
      apply_config(cfgs[c], cfgs);
      cpu_fast::PhaseTimes pt;
      cpu_fast::FastOptions opt;
      opt.phases = &pt;
      opt.threads = std::getenv("UA_T")         ? std::atoi(std::getenv("UA_T"))
                    : std::getenv("UA_THREADS") ? std::atoi(std::getenv("UA_THREADS"))
                                                : 0;
      const auto t0 = std::chrono::steady_clock::now();
      const ForwardResult r =
          cpu_fast::forward(*w, xs[xi++ % xs.size()].data(), 1, FuseShared::Auto, opt);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (rep < 0) continue;
      const std::set<int32_t> touched(r.routing.ids.begin(), r.routing.ids.end());
      bytes_seen.push_back(static_cast<double>(touched.size()) * expert_bytes +
                           static_cast<double>(spec.router_bytes()));
      t[c].push_back(us);
      ph[0][c].push_back(pt.router);
      ph[1][c].push_back(pt.gate_up);
      ph[2][c].push_back(pt.down);
      ph[3][c].push_back(pt.combine);
    }
  }
  std::printf("%s %s, %d threads, %d forwards each, alternating\n", model, f.c_str(),
              cpu_fast::resolve_threads(std::getenv("UA_THREADS") ? std::atoi(std::getenv("UA_THREADS")) : 0), per);
  const double pbw = median(probe_bw), mb = median(bytes_seen);
  std::printf("read probe %.1f GB/s (median of %zu passes), median bytes per forward %.2f MB, floor %.1f us\n",
              pbw / 1e9, probe_bw.size(), mb / 1e6, mb / pbw * 1e6);
  for (size_t c = 0; c < cfgs.size(); ++c)
    std::printf("%-40s %8.1f us  %.3f of floor  router %6.1f  gate_up %7.1f  down %7.1f  combine %5.1f\n",
                cfgs[c].c_str(), median(t[c]), mb / pbw * 1e6 / median(t[c]), median(ph[0][c]),
                median(ph[1][c]), median(ph[2][c]), median(ph[3][c]));
}
