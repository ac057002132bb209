#include "io/finite_check.h"

#include <cstdint>
#include <cstring>

#include "moekit/error.h"

namespace moekit::io {
namespace {

constexpr size_t kBlock = 4096;

// All exponent bits set: infinity or NaN, in either format. (memcpy: the bits without breaking
// aliasing rules; it compiles to a plain load.)
template <typename Bits, Bits kExp, typename T>
size_t first_bad(const T* p, size_t count) {
  static_assert(sizeof(T) == sizeof(Bits));
  auto bad_at = [p](size_t i) {
    Bits bits;
    std::memcpy(&bits, p + i, sizeof bits);
    return (bits & kExp) == kExp;
  };
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t end = b + kBlock < count ? b + kBlock : count;
    unsigned bad = 0;
    for (size_t i = b; i < end; ++i) bad |= bad_at(i);
    if (bad == 0) continue;
    for (size_t i = b; i < end; ++i)
      if (bad_at(i)) return i;
  }
  return count;
}

template <typename T>
void check(const T* p, size_t rows, size_t cols, const std::string& what) {
  if (p == nullptr) return;
  const size_t n = rows * cols;
  const size_t i = first_non_finite(p, n);
  if (i == n) return;
  float v = 0;
  if constexpr (sizeof(T) == 2)
    v = bf16_to_float(p[i]);
  else
    v = p[i];
  MK_FAIL(what << " holds a non-finite value (" << v << ") at row " << i / cols << ", column "
               << i % cols << ": expected finite weights");
}

}  // namespace

size_t first_non_finite(const Bf16* p, size_t count) {
  return first_bad<uint16_t, 0x7F80>(p, count);
}

size_t first_non_finite(const float* p, size_t count) {
  return first_bad<uint32_t, 0x7F800000u>(p, count);
}

void check_finite(const Bf16* p, size_t rows, size_t cols, const std::string& what) {
  check(p, rows, cols, what);
}
void check_finite(const float* p, size_t rows, size_t cols, const std::string& what) {
  check(p, rows, cols, what);
}

}  // namespace moekit::io
