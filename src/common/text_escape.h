// Escaping of user-supplied text (tensor names, JSON keys, paths, file contents) before it is
// echoed in a message, so a hostile name cannot write terminal control sequences into a log.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace moekit {

// `text` with every control character (C0, DEL, the C1 range U+0080..U+009F) and every byte that
// is not part of valid UTF-8 written as an escape (\n, \t, \r, \\ is left as is, \xNN otherwise);
// printable ASCII and valid UTF-8 pass unchanged. Longer than `max_bytes` input bytes: cut there
// and marked "...(N bytes)". keep_newlines leaves '\n' raw (for multi-line messages).
std::string escape_text(std::string_view text, size_t max_bytes = 256, bool keep_newlines = false);

}  // namespace moekit
