// The assertion the tests share for bad input: `fn` throws a moekit::Error whose message holds
// every one of `fragments` (so each error names what was wrong, not just that something was).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "moekit/error.h"

namespace moekit::test {

inline void expect_error(const std::function<void()>& fn,
                         const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a moekit::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected a moekit::Error holding '"
                << (fragments.empty() ? std::string() : fragments.front()) << "', got none";
}

}  // namespace moekit::test
