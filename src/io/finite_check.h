// Finiteness checks of weights as they are loaded: a NaN, an infinity (or a value that overflows
// bf16 once dequantised with its scale) in a weight, bias or scale would otherwise surface only as
// a NaN output. The scans are branch-free over blocks (the compiler vectorises them), and locate
// the first bad element only when a block holds one.
#pragma once

#include <cstddef>
#include <string>

#include "moekit/dtype.h"

namespace moekit::io {

// Index of the first NaN or infinity, or `count` when there is none.
size_t first_non_finite(const Bf16* p, size_t count);
size_t first_non_finite(const float* p, size_t count);

// Throw "<what> holds a non-finite value (nan) at row r, column c: expected finite weights" (for a
// [rows, cols] matrix; a vector is one row).
void check_finite(const Bf16* p, size_t rows, size_t cols, const std::string& what);
void check_finite(const float* p, size_t rows, size_t cols, const std::string& what);

}  // namespace moekit::io
