// `moekit bench --device cuda`: one MoE layer and a decode step on the GPU, fused and unfused
// side by side, with the read bandwidth measured in the same run (src/cuda/bench/bench.cu).
// Prints the table a serving engineer reads; --json prints the records instead; --plot FILE.png
// draws us per layer against batch (fused, unfused, floor).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "cli_context.h"
#include "commands.h"
#include "moekit/cuda_layer.h"
#include "moekit/error.h"

namespace moekit::cli {
namespace {

// ---- --plot: the batch sweep as a PNG, with no image library ----
// x: batch (log2 axis), y: us per layer (linear from 0). Blue = fused, red = unfused, gray =
// bytes floor. Tick labels use a 5x7 digit font; the legend is printed to stdout.

struct Raster {
  int w, h;
  std::vector<uint8_t> rgb;
  Raster(int w_, int h_) : w(w_), h(h_), rgb(static_cast<size_t>(w_) * h_ * 3, 255) {}
  void put(int x, int y, std::array<uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= w || y >= h) return;
    uint8_t* px = &rgb[(static_cast<size_t>(y) * w + x) * 3];
    px[0] = c[0];
    px[1] = c[1];
    px[2] = c[2];
  }
  void line(double x0, double y0, double x1, double y1, std::array<uint8_t, 3> c, int thick,
            bool dashed = false) {
    const int steps = static_cast<int>(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0))) + 1;
    for (int i = 0; i <= steps; ++i) {
      if (dashed && (i / 6) % 2) continue;
      const double f = static_cast<double>(i) / steps;
      const int x = static_cast<int>(std::lround(x0 + f * (x1 - x0)));
      const int y = static_cast<int>(std::lround(y0 + f * (y1 - y0)));
      for (int dx = -thick / 2; dx <= thick / 2; ++dx)
        for (int dy = -thick / 2; dy <= thick / 2; ++dy) put(x + dx, y + dy, c);
    }
  }
  // Digits and '.', 5x7, scaled by 2; (x, y) is the top-left corner.
  void text(int x, int y, const std::string& s, std::array<uint8_t, 3> c) {
    static const uint8_t digits[11][7] = {
        {14, 17, 19, 21, 25, 17, 14}, {4, 12, 4, 4, 4, 4, 14},    {14, 17, 1, 2, 4, 8, 31},
        {31, 2, 4, 2, 1, 17, 14},     {2, 6, 10, 18, 31, 2, 2},   {31, 16, 30, 1, 1, 17, 14},
        {6, 8, 16, 30, 17, 17, 14},   {31, 1, 2, 4, 8, 8, 8},     {14, 17, 17, 14, 17, 17, 14},
        {14, 17, 17, 15, 1, 2, 12},   {0, 0, 0, 0, 0, 12, 12}};
    for (char ch : s) {
      const int gi = ch == '.' ? 10 : (ch >= '0' && ch <= '9' ? ch - '0' : -1);
      if (gi >= 0) {
        for (int r = 0; r < 7; ++r)
          for (int b = 0; b < 5; ++b)
            if (digits[gi][r] & (16 >> b))
              for (int sy = 0; sy < 2; ++sy)
                for (int sx = 0; sx < 2; ++sx) put(x + 2 * b + sx, y + 2 * r + sy, c);
      }
      x += 12;
    }
  }
};

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

void write_chunk(std::ofstream& out, const char* type, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> buf;
  put_be32(buf, static_cast<uint32_t>(data.size()));
  const size_t type_at = buf.size();
  buf.insert(buf.end(), type, type + 4);
  buf.insert(buf.end(), data.begin(), data.end());
  put_be32(buf, crc32(buf.data() + type_at, buf.size() - type_at));
  out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
}

// PNG, 8-bit RGB, zlib stream of stored (uncompressed) deflate blocks.
void write_png(const Raster& img, const std::string& path) {
  std::vector<uint8_t> raw;
  for (int y = 0; y < img.h; ++y) {
    raw.push_back(0);  // filter: none
    const uint8_t* row = &img.rgb[static_cast<size_t>(y) * img.w * 3];
    raw.insert(raw.end(), row, row + static_cast<size_t>(img.w) * 3);
  }
  std::vector<uint8_t> z{0x78, 0x01};
  for (size_t pos = 0; pos < raw.size() || raw.empty();) {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    const bool last = pos + n == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<uint8_t>(n & 0xff));
    z.push_back(static_cast<uint8_t>(n >> 8));
    z.push_back(static_cast<uint8_t>(~n & 0xff));
    z.push_back(static_cast<uint8_t>((~n >> 8) & 0xff));
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(pos),
             raw.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
    if (last) break;
  }
  uint32_t a = 1, b = 0;
  for (uint8_t v : raw) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  put_be32(z, (b << 16) | a);
  std::ofstream out(path, std::ios::binary);
  MK_CHECK(out.good(), "--plot: cannot open '" << path << "' for writing");
  const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  out.write(reinterpret_cast<const char*>(sig), 8);
  std::vector<uint8_t> ihdr;
  put_be32(ihdr, static_cast<uint32_t>(img.w));
  put_be32(ihdr, static_cast<uint32_t>(img.h));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit, RGB, deflate, no filter, no interlace
  write_chunk(out, "IHDR", ihdr);
  write_chunk(out, "IDAT", z);
  write_chunk(out, "IEND", {});
  MK_CHECK(out.good(), "--plot: writing '" << path << "' failed");
}

void plot_sweep(const std::vector<cuda::GpuBenchRecord>& recs, const std::string& path) {
  MK_CHECK(!recs.empty(), "--plot: no records to draw");
  const int W = 900, H = 560, L = 90, R = 30, T = 30, B = 60;
  Raster img(W, H);
  double bmin = 1e30, bmax = 0, ymax = 0;
  for (const auto& r : recs) {
    bmin = std::min(bmin, static_cast<double>(r.batch));
    bmax = std::max(bmax, static_cast<double>(r.batch));
    ymax = std::max({ymax, r.us_per_layer, r.floor_us});
  }
  ymax *= 1.1;
  const double lx0 = std::log2(bmin), lx1 = std::max(std::log2(bmax), lx0 + 1);
  auto px = [&](double batch) { return L + (std::log2(batch) - lx0) / (lx1 - lx0) * (W - L - R); };
  auto py = [&](double us) { return H - B - us / ymax * (H - T - B); };
  const std::array<uint8_t, 3> black{0, 0, 0}, grid{225, 225, 225};
  for (int i = 0; i <= 5; ++i) {  // y grid and labels
    const double v = ymax * i / 5;
    img.line(L, py(v), W - R, py(v), grid, 1);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    img.text(4, static_cast<int>(py(v)) - 7, buf, black);
  }
  for (const auto& r : recs) {  // x ticks at the batches
    img.line(px(r.batch), H - B, px(r.batch), H - B + 6, black, 1);
    img.text(static_cast<int>(px(r.batch)) - 6, H - B + 12, std::to_string(r.batch), black);
  }
  img.line(L, T, L, H - B, black, 2);
  img.line(L, H - B, W - R, H - B, black, 2);
  struct Series {
    std::string fuse;
    bool floor;
    std::array<uint8_t, 3> color;
  };
  for (const Series& s : {Series{"on", false, {30, 90, 220}}, Series{"off", false, {220, 50, 40}},
                          Series{"", true, {140, 140, 140}}}) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& r : recs) {
      if (s.floor ? r.fuse_shared != recs[0].fuse_shared : r.fuse_shared != s.fuse) continue;
      pts.emplace_back(px(r.batch), py(s.floor ? r.floor_us : r.us_per_layer));
    }
    for (size_t i = 0; i + 1 < pts.size(); ++i) {
      img.line(pts[i].first, pts[i].second, pts[i + 1].first, pts[i + 1].second, s.color, 3,
               s.floor);
    }
    for (const auto& p : pts) img.line(p.first - 3, p.second, p.first + 3, p.second, s.color, 7);
  }
  write_png(img, path);
  std::fprintf(stderr, "plot: %s (x: batch, log2; y: us per layer; blue fused, red unfused, gray floor)\n",
              path.c_str());
}

}  // namespace

int run_bench_cuda(const BenchOptions& opt) {
  MK_CHECK(opt.weights.empty(), "bench --device cuda times random weights generated on the GPU; "
                                "--weights '" << opt.weights << "' is not supported there");
  cuda::GpuBenchOptions b;
  b.model = opt.model;
  b.batches = opt.batches;
  b.fuse = opt.fuse;
  b.seed = opt.seed;
  b.iterations = opt.iterations;
  b.max_layer_sets = opt.weight_sets;
  b.trace = opt.trace;
  b.overrides = env_overrides();
  const ExpertFormat format = bench_format(load_spec(opt.model), opt.dtype);
  b.expert_dtype = gpu_expert_dtype(format);
  b.mx_format = gpu_mx_format(format);
  const std::vector<cuda::GpuBenchRecord> recs = cuda::bench_layer(b, !opt.json);
  if (!opt.plot.empty()) plot_sweep(recs, opt.plot);

  if (opt.json) {
    nlohmann::json arr = nlohmann::json::array();
    const std::string date = utc_now();
    for (const auto& r : recs) {
      arr.push_back({{"model", r.model},
                     {"device", "cuda"},
                     {"gpu", r.device},
                     {"date", date},
                     {"batch", r.batch},
                     {"dtype", r.dtype},
                     {"fuse_shared", r.fuse_shared},
                     {"auto_choice", r.auto_choice},
                     {"us_per_layer", r.us_per_layer},
                     {"step_us", r.step_us},
                     {"tokens_per_s", r.tokens_per_s},
                     {"floor_us", r.floor_us},
                     {"bw_fraction", r.bw_fraction},
                     {"touched_bytes", r.touched_bytes},
                     {"read_bw_gbs", r.read_bw_gbs},
                     {"launches", r.launches},
                     {"fused_over_unfused", r.fused_over_unfused},
                     {"layer_sets", r.layer_sets},
                     {"max_tokens", r.max_tokens},
                     {"workspace_bytes", r.workspace_bytes},
                     {"moe_layers", r.moe_layers},
                     {"expert_tflops", r.expert_tflops},
                     {"peak_tflops", r.peak_tflops},
                     {"peak_fraction", r.peak_fraction},
                     {"plan", r.plan},
                     {"command", command_line()}});
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return 0;
  }

  if (!recs.empty()) {
    std::printf("%s on %s, read bandwidth %.0f GB/s, %d MoE layers (%d distinct weight sets)\n",
                recs[0].model.c_str(), recs[0].device.c_str(), recs[0].read_bw_gbs,
                recs[0].moe_layers, recs[0].layer_sets);
  }
  std::printf("%6s %5s %5s %12s %10s %8s %12s %12s %9s %9s\n", "batch", "fuse", "auto",
              "us/layer", "floor us", "bw frac", "step us", "tokens/s", "launches", "on/off");
  for (const auto& r : recs) {
    std::printf("%6d %5s %5s %12.1f %10.1f %8.3f %12.0f %12.0f %9d %9.3f\n", r.batch,
                r.fuse_shared.c_str(), r.auto_choice ? "*" : "", r.us_per_layer, r.floor_us,
                r.bw_fraction, r.step_us, r.tokens_per_s, r.launches, r.fused_over_unfused);
  }
  return 0;
}

}  // namespace moekit::cli
