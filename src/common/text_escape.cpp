#include "common/text_escape.h"

#include <cstdint>
#include <cstdio>

namespace moekit {
namespace {

void append_hex(std::string& out, uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", b);
  out += buf;
}

// Length of the valid UTF-8 sequence at s[i] (2..4), or 0 when it is not one. Overlong forms,
// surrogates and code points above U+10FFFF are not valid.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (b(k) & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  if (cp >= 0x80 && cp <= 0x9F) return 0;  // C1 controls (CSI is U+009B)
  return n;
}

}  // namespace

std::string escape_text(std::string_view text, size_t max_bytes, bool keep_newlines) {
  const size_t limit = text.size() > max_bytes ? max_bytes : text.size();
  std::string out;
  out.reserve(limit + 16);
  size_t i = 0;
  while (i < limit) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (c == '\n' && keep_newlines) {
      out += '\n';
      ++i;
      continue;
    }
    if (c == '\n' || c == '\t' || c == '\r') {
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
      ++i;
      continue;
    }
    if (c >= 0x80) {
      const size_t n = utf8_length(text, i);
      if (n > 0 && i + n <= limit) {
        out.append(text.substr(i, n));
        i += n;
        continue;
      }
    }
    append_hex(out, c);
    ++i;
  }
  if (text.size() > limit) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace moekit
