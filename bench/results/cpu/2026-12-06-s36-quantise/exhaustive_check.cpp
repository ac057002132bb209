// Exhaustive: the new fp8 / e2m1 encoders against the old ones on every float; x * 2^-e against
// ldexp(x, -e) on every bf16 and e in [-127, 127].
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "io/tensor_convert.h"
#include "moekit/dtype.h"
using namespace moekit;
static const std::array<float, 256>& table() {
  static std::array<float, 256> t = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(uint8_t(i));
    return t;
  }();
  return t;
}
uint8_t old_fp8(float f) {
  if (std::isnan(f)) return 0x7f;
  const auto& lut = table();
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= lut[126]) return sign | 126;
  const float* begin = lut.data();
  const size_t hi = std::upper_bound(begin, begin + 127, a) - begin;
  const size_t lo = hi - 1;
  const float dlo = a - lut[lo], dhi = lut[hi] - a;
  const size_t code = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | static_cast<uint8_t>(code);
}
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
uint8_t old_e2m1(float x) {
  const float a = std::min(std::fabs(x), 6.0f);
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; ++c) {
    const float d = std::fabs(a - kE2m1[c]), db = std::fabs(a - kE2m1[best]);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) && best != 0 ? 8 : 0));
}
uint8_t new_e2m1(float x) {
  const float a = std::fabs(x);
  uint8_t best = 7;
  if (std::isnan(x) || a <= 0.25f)
    best = 0;
  else if (a < 0.75f)
    best = 1;
  else if (a <= 1.25f)
    best = 2;
  else if (a < 1.75f)
    best = 3;
  else if (a <= 2.5f)
    best = 4;
  else if (a < 3.5f)
    best = 5;
  else if (a <= 5.0f)
    best = 6;
  return static_cast<uint8_t>(best | (std::signbit(x) && best != 0 ? 8 : 0));
}
int main() {
  const int T = 2;
  std::vector<long long> bad_fp8(T), bad_e2m1(T);
  std::vector<std::thread> th;
  for (int t = 0; t < T; ++t)
    th.emplace_back([&, t] {
      for (uint64_t b = t; b < (1ull << 32); b += T) {
        float f;
        const uint32_t u = uint32_t(b);
        std::memcpy(&f, &u, 4);
        if (io::fp8_e4m3_encode(f) != old_fp8(f)) {
          if (bad_fp8[t]++ < 3) std::printf("fp8 differs at %08x\n", u);
        }
        if (new_e2m1(f) != old_e2m1(f)) {
          if (bad_e2m1[t]++ < 3) std::printf("e2m1 differs at %08x\n", u);
        }
      }
    });
  for (auto& x : th) x.join();
  long long bl = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = bf16_to_float(Bf16{uint16_t(h)});
    for (int e = -127; e <= 127; ++e) {
      const float a = std::ldexp(x, -e), b = x * std::ldexp(1.0f, -e);
      uint32_t ua, ub;
      std::memcpy(&ua, &a, 4);
      std::memcpy(&ub, &b, 4);
      if (ua != ub && !(std::isnan(a) && std::isnan(b))) {
        if (bl++ < 3) std::printf("ldexp differs: bf16 %04x e %d\n", h, e);
      }
    }
  }
  std::printf(
      "fp8 differences %lld, e2m1 differences %lld, ldexp differences %lld (every float; every "
      "bf16 x e)\n",
      bad_fp8[0] + bad_fp8[1], bad_e2m1[0] + bad_e2m1[1], bl);
}
