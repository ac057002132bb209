// The one way moekit parses JSON it did not write (config.json, safetensors headers, sharded
// checkpoint indexes, tuning files) and quotes JSON values in error messages.
//
// Why: nlohmann's parser is iterative, but dump(), comparison and the DOM's recursive walks are
// not. A value nested 60 000 levels deep (about 120 kB of "[[[...") overflows the stack the
// moment an error message dumps it. So nesting is limited before the parser builds anything, and
// values are quoted through describe_json, which looks one level deep and is bounded in length.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moekit {

// Deeper than any published config or header (they nest 3 levels), far below a stack overflow.
inline constexpr int kMaxJsonDepth = 64;

struct JsonLimits {
  int max_depth = kMaxJsonDepth;
  // Refuse an object holding the same key twice (nlohmann keeps the last one silently).
  bool reject_duplicate_keys = false;
};

// Parses `text`; throws moekit::Error "<what> is not valid JSON: ...", "<what>: JSON nested
// deeper than 64 levels (at byte N)" or, when asked, "<what>: duplicate key "k" in one JSON
// object". `what` names the input ("config 'x'", "checkpoint index /a/b"), echoed as given.
nlohmann::json parse_json_bounded(std::string_view text, const std::string& what,
                                  const JsonLimits& limits = {});

// A JSON value for an error message, without recursion and at most a few hundred bytes: scalars
// as their JSON text (strings escaped and cut at 64 bytes, so 7168 and "7168" differ), arrays and
// objects as type, size and the first few elements one level deep ("array of 3 [1, [...], "x"]",
// "object of 2 {"a": 1, "b": {...}}").
std::string describe_json(const nlohmann::json& v);

// The value as an int when it is a JSON integer within int's range, else nullopt (a float, a
// string, or 2^32 + 1, which a plain get<int>() would silently truncate to 1).
std::optional<int> json_as_int(const nlohmann::json& v);
// The same for long long (JSON unsigned integers above 2^63 - 1 are out of range).
std::optional<long long> json_as_int64(const nlohmann::json& v);

}  // namespace moekit
