// Times the fast CPU layer's router phase pieces for one token: router_logits (split over the
// threads), cpu_reference::route, the whole forward and its phases; medians over N calls.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
#include "cpu/fast/fast_common.h"
using namespace moekit;
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
int main(int argc, char** argv) {
  const char* model = argc > 1 ? argv[1] : "gpt-oss-120b";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  const int n = argc > 3 ? std::atoi(argv[3]) : 50;
  const MoeSpec spec = load_spec(model);
  const int layer = spec.moe_layers.front();
  const ExpertFormat fmt = spec.name.find("gpt-oss") != std::string::npos ? ExpertFormat::Mxfp4 : ExpertFormat::Fp8Block;
  auto w = make_random_weights(spec, layer, 7, fmt);
  std::vector<int> all(spec.num_experts + spec.shared_slots());
  for (size_t e = 0; e < all.size(); ++e) all[e] = static_cast<int>(e);
  w->prefetch(all);
  std::vector<std::vector<Bf16>> xs(16, std::vector<Bf16>(spec.hidden));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : xs) for (auto& v : x) v = float_to_bf16(nd(rng));
  cpu_fast::FastOptions opt;
  opt.threads = threads;
  const RoutingConfig cfg = RoutingConfig::from_spec(spec, spec.can_fuse_shared());
  std::vector<double> tl, tr, tf, pr, pg, pd, pc, tl_warm, tp, tp1;
  for (int i = 0; i < n; ++i) {
    const Bf16* x = xs[i % xs.size()].data();
    cpu_fast::PhaseTimes ph;
    opt.phases = &ph;
    auto a = clk::now();
    auto y = cpu_fast::forward(*w, x, 1, FuseShared::Auto, opt);
    auto b = clk::now();
    opt.phases = nullptr;
    auto logits = cpu_fast::router_logits(*w, x, 1, opt);  // right after a forward: workers polling
    auto c = clk::now();
    auto r = cpu_reference::route(cfg, logits.data(), 1, w->correction_bias());
    auto d = clk::now();
    auto logits2 = cpu_fast::router_logits(*w, x, 1, opt);  // again: router rows in cache
    auto e = clk::now();
    auto f = clk::now();
    cpu_fast::detail::parallel(cpu_fast::resolve_threads(threads), [](int, int) {});
    auto g = clk::now();
    cpu_fast::detail::parallel(cpu_fast::resolve_threads(threads), [](int, int) {});
    auto h = clk::now();
    tp.push_back(us(f, g)); tp1.push_back(us(g, h));
    tf.push_back(us(a, b)); tl.push_back(us(b, c)); tr.push_back(us(c, d)); tl_warm.push_back(us(d, e));
    pr.push_back(ph.router); pg.push_back(ph.gate_up); pd.push_back(ph.down); pc.push_back(ph.combine);
  }
  std::printf("%s threads=%d forward %.1f | phases router %.1f gate_up %.1f down %.1f combine %.1f | "
              "router_logits after forward %.1f, again %.1f | route %.1f | empty parallel %.1f, again %.1f\n",
              model, cpu_fast::resolve_threads(threads), med(tf), med(pr), med(pg), med(pd), med(pc), med(tl), med(tl_warm), med(tr), med(tp), med(tp1));
}
