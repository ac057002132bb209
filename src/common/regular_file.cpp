#include "common/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/text_escape.h"
#include "moekit/error.h"

namespace moekit {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

RegularFile open_regular_file(const std::string& path, const std::string& what) {
  const std::string shown = escape_text(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  MK_CHECK(fd >= 0, "cannot open " << what << " " << shown << ": " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    MK_FAIL("cannot stat " << what << " " << shown << ": " << std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    MK_FAIL(what << " " << shown << " is " << kind_of(st.st_mode)
                 << ", expected a regular file");
  }
  return {fd, static_cast<size_t>(st.st_size)};
}

std::string read_regular_file(const std::string& path, const std::string& what, size_t max_bytes) {
  const RegularFile f = open_regular_file(path, what);
  if (f.size > max_bytes) {
    ::close(f.fd);
    MK_FAIL(what << " " << escape_text(path) << " is " << f.size << " bytes, more than the "
                 << max_bytes << " bytes moekit reads for a JSON file");
  }
  std::string text(f.size, '\0');
  size_t got = 0;
  // The file may change while it is read: stop at its end, and refuse one that grew past the cap.
  while (got < text.size()) {
    const ssize_t n = ::read(f.fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(f.fd);
      MK_FAIL("reading " << what << " " << escape_text(path) << " failed: " << std::strerror(err));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  ::close(f.fd);
  return text;
}

}  // namespace moekit
