// Token-count lists (bench, plan, tune, bench router-gemm): "1-128", "1,2,4,8",
// "1-16,32,64"; and the UTC time stamp their JSON records carry.
#pragma once

#include <algorithm>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/error.h"

namespace moekit::cli {

// Ascending, distinct, each in [1, 1048576]; throws naming the option and the bad entry.
inline std::vector<int> parse_token_list(const std::string& text, const char* option) {
  std::vector<int> out;
  auto number = [&](const std::string& s) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(s, &used);
    } catch (const std::exception&) {
      MK_FAIL(option << " '" << text << "': '" << s << "' is not a number");
    }
    // decimal digits only (stoi also takes leading blanks, '+' and '-')
    const bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
    MK_CHECK(digits && used == s.size() && v >= 1 && v <= (1 << 20),
             option << " '" << text << "': '" << s << "' must be a whole number in [1, 1048576]");
    return v;
  };
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    MK_CHECK(!item.empty(), option << " '" << text << "' has an empty entry");
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(number(item));
      continue;
    }
    const int lo = number(item.substr(0, dash));
    const int hi = number(item.substr(dash + 1));
    MK_CHECK(lo <= hi, option << " '" << text << "': range '" << item << "' is empty");
    for (int m = lo; m <= hi; ++m) out.push_back(m);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  MK_CHECK(!out.empty(), option << " is empty");
  return out;
}

inline std::string now_utc_iso() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace moekit::cli
