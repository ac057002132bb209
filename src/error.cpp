#include "moekit/error.h"

namespace moekit {

std::string Error::where() const {
  std::ostringstream os;
  os << what() << " (in " << function_ << " at " << file_ << ":" << line_ << ")";
  return os.str();
}

namespace detail {
void throw_error(const std::string& message, const char* function, const char* file, int line) {
  throw Error(message, function, file, line);
}
}  // namespace detail

}  // namespace moekit
