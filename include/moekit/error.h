// moekit's one error type and its check macros.
//
// Library code never exits or returns integer codes: it throws moekit::Error carrying the
// function, file:line and a streamed message ("expected X, got Y"). Only main() turns an Error
// into an exit status. MK_CUDA_CHECK lives in src/cuda/common/cuda_check.h so this header stays
// CUDA-free.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moekit {

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* function, const char* file, int line)
      : std::runtime_error(std::move(message)), function_(function), file_(file), line_(line) {}

  const char* function() const { return function_; }
  const char* file() const { return file_; }
  int line() const { return line_; }
  // "message (in function at file:line)", for logs; what() is the message alone.
  std::string where() const;

 private:
  const char* function_;
  const char* file_;
  int line_;
};

namespace detail {
[[noreturn]] void throw_error(const std::string& message, const char* function, const char* file,
                              int line);
}  // namespace detail

}  // namespace moekit

// MK_CHECK(cond, "expected hidden_size > 0, got " << h): throws moekit::Error when cond is false.
#define MK_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::ostringstream mk_check_stream_;                                               \
      mk_check_stream_ << __VA_ARGS__;                                                   \
      ::moekit::detail::throw_error(mk_check_stream_.str(), __func__, __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)

// MK_FAIL("unknown scoring_func '" << s << "'"): throws unconditionally (the compiler knows it
// does not return, so no dummy return is needed after it).
#define MK_FAIL(...)                                                                  \
  do {                                                                                \
    std::ostringstream mk_check_stream_;                                              \
    mk_check_stream_ << __VA_ARGS__;                                                  \
    ::moekit::detail::throw_error(mk_check_stream_.str(), __func__, __FILE__, __LINE__); \
  } while (0)
