// An environment variable set (or unset) for one scope, then restored as it was, also when an
// assertion leaves the test early. Tests of the one reader of the environment
// (plan::plan_overrides_from_env) use it; the library itself reads no environment.
#pragma once

#include <stdlib.h>

#include <optional>
#include <string>

namespace moekit::test {

class ScopedEnv {
 public:
  // value nullptr: unset for the scope
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) before_ = before;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (before_) {
      setenv(name_.c_str(), before_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> before_;
};

}  // namespace moekit::test
