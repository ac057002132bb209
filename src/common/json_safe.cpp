#include "common/json_safe.h"

#include <climits>
#include <set>
#include <vector>

#include "common/text_escape.h"
#include "moekit/error.h"

namespace moekit {
namespace {

using nlohmann::json;

constexpr size_t kQuotedStringBytes = 64;
constexpr size_t kQuotedElements = 4;

// Nesting depth checked on the raw text (brackets outside strings), so the parser never sees an
// input that could build a DOM too deep for the recursive walks.
void check_depth(std::string_view text, const std::string& what, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      MK_CHECK(++depth <= max_depth, what << ": JSON nested deeper than " << max_depth
                                          << " levels (at byte " << i << ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

std::string scalar(const json& v) {
  if (v.is_string()) return "\"" + escape_text(v.get_ref<const std::string&>(), kQuotedStringBytes) + "\"";
  if (v.is_array()) return "[...]";
  if (v.is_object()) return "{...}";
  if (v.is_binary()) return "<binary>";
  if (v.is_discarded()) return "<discarded>";
  return v.dump();  // null, boolean, number: flat
}

}  // namespace

json parse_json_bounded(std::string_view text, const std::string& what, const JsonLimits& limits) {
  check_depth(text, what, limits.max_depth);
  try {
    if (!limits.reject_duplicate_keys) return json::parse(text.begin(), text.end());
    // One key set per open object; parse events arrive in document order.
    std::vector<std::set<std::string>> open;
    json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) {
      switch (event) {
        case json::parse_event_t::object_start:
          open.emplace_back();
          break;
        case json::parse_event_t::object_end:
          if (!open.empty()) open.pop_back();
          break;
        case json::parse_event_t::key:
          if (!open.empty() && parsed.is_string()) {
            const std::string& key = parsed.get_ref<const std::string&>();
            MK_CHECK(open.back().insert(key).second,
                     what << ": duplicate key \"" << escape_text(key) << "\" in one JSON object");
          }
          break;
        default:
          break;
      }
      return true;
    };
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 9e999
    MK_FAIL(what << " is not valid JSON: " << escape_text(e.what()));
  }
}

std::string describe_json(const json& v) {
  // A scalar's JSON text names its type (quotes: a string); arrays and objects say so.
  if (!v.is_array() && !v.is_object()) return scalar(v);
  std::string out = std::string(v.is_array() ? "array of " : "object of ") + std::to_string(v.size()) +
                    (v.is_array() ? " [" : " {");
  size_t shown = 0;
  if (v.is_array()) {
    for (const json& e : v) {
      if (shown == kQuotedElements) break;
      out += (shown++ ? ", " : "") + scalar(e);
    }
  } else {
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (shown == kQuotedElements) break;
      out += (shown++ ? ", \"" : "\"") + escape_text(it.key(), kQuotedStringBytes) +
             "\": " + scalar(it.value());
    }
  }
  if (v.size() > shown) out += ", ...";
  return out + (v.is_array() ? "]" : "}");
}

std::optional<long long> json_as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(LLONG_MAX)) return std::nullopt;
    return static_cast<long long>(u);
  }
  if (v.is_number_integer()) return v.get<long long>();
  return std::nullopt;
}

std::optional<int> json_as_int(const json& v) {
  const std::optional<long long> x = json_as_int64(v);
  if (!x || *x < INT_MIN || *x > INT_MAX) return std::nullopt;
  return static_cast<int>(*x);
}

}  // namespace moekit
