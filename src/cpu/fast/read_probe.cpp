// The fast CPU backend's read-bandwidth probe (moekit/cpu_fast.h: ReadProbe,
// measure_read_bandwidth): a buffer summed in 4 MiB chunks taken dynamically by the threads, as
// the layer takes its units, with the SIMD path the layer would use.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "cpu/fast/fast_common.h"
#include "cpu/fast/kernels.h"
#include "moekit/cpu_fast.h"
#include "moekit/error.h"

namespace moekit::cpu_fast {

using detail::Kernels;
using detail::kernels_for;
using detail::run_units;

namespace {
// 4 MiB chunks taken dynamically, like the layer's units: a descheduled thread does not hold the
// others up, so the probe and the layer are measured the same way.
constexpr size_t kProbeChunk = (size_t{4} << 20) / sizeof(float);
}  // namespace

ReadProbe::ReadProbe(size_t bytes, Isa isa)
    : count_(bytes / sizeof(float)), isa_(resolve_isa(isa)) {
  MK_CHECK(bytes >= 1024, "expected a probe buffer of >= 1 KiB, got " << bytes << " bytes");
  // Not std::vector<float>(count): its zero-fill would first-touch every page on this thread.
  data_ = new float[count_];
  const size_t chunks = (count_ + kProbeChunk - 1) / kProbeChunk;
  run_units(resolve_threads(0), chunks, [&](size_t c) {
    const size_t b = c * kProbeChunk, e = std::min(count_, b + kProbeChunk);
    std::memset(data_ + b, 0, (e - b) * sizeof(float));
  });
}

ReadProbe::~ReadProbe() { delete[] data_; }

double ReadProbe::pass(int threads) {
  const Kernels& kern = kernels_for(isa_);
  const size_t chunks = (count_ + kProbeChunk - 1) / kProbeChunk;
  std::vector<float> sums(chunks);
  const auto t0 = std::chrono::steady_clock::now();
  run_units(resolve_threads(threads), chunks, [&](size_t c) {
    const size_t b = c * kProbeChunk, e = std::min(count_, b + kProbeChunk);
    sums[c] = kern.read_sum(data_ + b, e - b);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (float v : sums) sink_ += v;  // keeps the sums alive
  return static_cast<double>(bytes()) / s;
}

double measure_read_bandwidth(size_t bytes, int threads, int repeats, Isa isa) {
  MK_CHECK(repeats >= 1, "expected repeats >= 1, got " << repeats);
  ReadProbe probe(bytes, isa);
  probe.pass(threads);  // warm-up
  double best = 0.0;
  for (int rep = 0; rep < repeats; ++rep) best = std::max(best, probe.pass(threads));
  return best;
}

}  // namespace moekit::cpu_fast
