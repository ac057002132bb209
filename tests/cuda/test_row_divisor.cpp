// The expert kernels' pair-to-row division (experts.h RowDivisor), a multiply and a shift: equal
// to the integer division for every divisor a layer uses and every pair id, no GPU needed.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <random>

#include "../expect_error.h"
#include "cuda/experts/experts.h"

namespace moekit {
namespace {

TEST(RowDivisor, EqualsTheDivisionForSmallDivisors) {
  for (int d = 1; d <= 72; ++d) {
    const cuda::RowDivisor r(d);
    for (int q = 0; q < (1 << 16); ++q) ASSERT_EQ(r.of(q), q / d) << q << " / " << d;
    for (int q = INT_MAX - (1 << 12); q < INT_MAX; ++q)
      ASSERT_EQ(r.of(q), q / d) << q << " / " << d;
    ASSERT_EQ(r.of(INT_MAX), INT_MAX / d) << d;
  }
  EXPECT_EQ(cuda::RowDivisor().of(123456789), 123456789);  // the default: pair = row
}

TEST(RowDivisor, EqualsTheDivisionOnRandomPairs) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> qs(0, INT_MAX), ds(1, INT_MAX);
  for (int i = 0; i < 20000; ++i) {
    const int d = i % 2 == 0 ? ds(rng) : 1 + ds(rng) % 4096, q = qs(rng);
    ASSERT_EQ(cuda::RowDivisor(d).of(q), q / d) << q << " / " << d;
  }
}

TEST(RowDivisor, ANonPositiveDivisorIsNamed) {
  test::expect_error([] { cuda::RowDivisor(0); }, {"RowDivisor", "divisor is 0"});
  test::expect_error([] { cuda::RowDivisor(-3); }, {"divisor is -3"});
}

}  // namespace
}  // namespace moekit
