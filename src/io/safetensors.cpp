// safetensors reader (mmap, validate everything at open) and writer.
//
// Validation order at open, each failure naming the file (and the tensor or key):
//   file >= 8 bytes -> header length N <= file size - 8 and <= kMaxHeaderBytes -> header is a JSON
//   object -> per tensor: dtype is a string, shape an array of non-negative integers,
//   data_offsets two integers with begin <= end <= data section size, and end - begin equal to
//   element size x product(shape), computed with overflow checks -> no duplicate names, no two
//   tensors' spans overlapping (the reference reader wants them contiguous; moekit allows gaps)
//   -> __metadata__ string values. The header parses with a nesting limit (common/json_safe.h),
// and names and values are escaped when an error quotes them.
// The file is opened without blocking and must be a regular file. It stays open while mapped, so
// every tensor access re-checks its size: a file truncated after open is an error, not a SIGBUS.
// Dtypes moekit does not compute with (I64, BOOL, U8, ...) are listed (so `moekit inspect` shows
// them, and a checkpoint holding e.g. MXFP4 blocks still opens) and rejected only on access.
#include "moekit/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/json_safe.h"
#include "common/regular_file.h"
#include "common/text_escape.h"
#include "moekit/error.h"

namespace moekit {
namespace {

using nlohmann::json;

// A header larger than this is not a tensor index but an attack or a corrupt length field; the
// largest published index headers are a few MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Element size of every dtype the safetensors format defines, 0 for unknown ones (their byte
// span cannot be checked). Sub-byte types (F4, F6_*) are listed as unknown for the same reason.
uint64_t safetensors_element_size(const std::string& d) {
  static const std::pair<const char*, uint64_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},     {"C64", 8}};
  for (const auto& [name, size] : kSizes) {
    if (d == name) return size;
  }
  return 0;
}

bool to_moekit_dtype(const std::string& d, DType* out) {
  for (DType t : {DType::BF16, DType::F16, DType::F32, DType::F8_E4M3}) {
    if (d == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsTensorInfo parse_tensor_entry(const std::string& path, const std::string& name,
                                         const json& v, uint64_t data_size) {
  const std::string where = "tensor '" + escape_text(name) + "' in " + escape_text(path);
  MK_CHECK(v.is_object(),
           where << ": expected an object {dtype, shape, data_offsets}, got " << v.type_name());
  SafetensorsTensorInfo t;
  t.name = name;

  auto dtype_it = v.find("dtype");
  MK_CHECK(dtype_it != v.end() && dtype_it->is_string(),
           where << ": expected a string 'dtype', got "
                 << (dtype_it == v.end() ? "none" : describe_json(*dtype_it)));
  t.dtype_name = dtype_it->get<std::string>();
  MK_CHECK(t.dtype_name.size() <= 16 && escape_text(t.dtype_name) == t.dtype_name,
           where << ": expected a dtype name such as BF16, got " << describe_json(*dtype_it));
  t.dtype_supported = to_moekit_dtype(t.dtype_name, &t.dtype);

  auto shape_it = v.find("shape");
  MK_CHECK(shape_it != v.end() && shape_it->is_array(),
           where << ": expected an array 'shape', got "
                 << (shape_it == v.end() ? "none" : describe_json(*shape_it)));
  for (const json& d : *shape_it) {
    MK_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
             where << ": expected non-negative integer dimensions, got shape " << describe_json(*shape_it));
    const uint64_t dim = d.get<uint64_t>();
    MK_CHECK(dim <= static_cast<uint64_t>(INT64_MAX),
             where << ": dimension " << dim << " does not fit in int64");
    t.shape.push_back(static_cast<int64_t>(dim));
  }

  auto off_it = v.find("data_offsets");
  MK_CHECK(off_it != v.end() && off_it->is_array() && off_it->size() == 2 &&
               (*off_it)[0].is_number_unsigned() && (*off_it)[1].is_number_unsigned(),
           where << ": expected 'data_offsets' [begin, end] of non-negative integers, got "
                 << (off_it == v.end() ? "none" : describe_json(*off_it)));
  t.begin = (*off_it)[0].get<uint64_t>();
  t.end = (*off_it)[1].get<uint64_t>();
  MK_CHECK(t.begin <= t.end, where << ": data_offsets begin " << t.begin << " > end " << t.end);
  MK_CHECK(t.end <= data_size, where << ": data_offsets [" << t.begin << ", " << t.end
                                     << "] out of range: the data section holds " << data_size
                                     << " bytes (file truncated?)");

  const uint64_t elem = safetensors_element_size(t.dtype_name);
  if (elem != 0) {
    uint64_t bytes = elem;
    for (int64_t d : t.shape) {
      MK_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
               where << ": shape " << shape_string(t.shape) << " x " << elem
                     << " bytes overflows 64 bits");
    }
    MK_CHECK(bytes == t.nbytes(), where << ": shape " << shape_string(t.shape) << " of "
                                        << t.dtype_name << " needs " << bytes
                                        << " bytes, data_offsets span " << t.nbytes());
  }
  return t;
}

// Two tensors whose byte spans share a byte would alias each other's data (a hostile file could
// make one expert's weights another's). Empty tensors occupy no bytes and never overlap.
void check_no_overlap(const std::string& shown,
                      const std::map<std::string, SafetensorsTensorInfo>& tensors) {
  std::vector<const SafetensorsTensorInfo*> spans;
  for (const auto& [name, t] : tensors)
    if (t.end > t.begin) spans.push_back(&t);
  std::stable_sort(spans.begin(), spans.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    const SafetensorsTensorInfo& a = *spans[i - 1];
    const SafetensorsTensorInfo& b = *spans[i];
    MK_CHECK(b.begin >= a.end, "safetensors file "
                                   << shown << ": tensors '" << escape_text(a.name) << "' ["
                                   << a.begin << ", " << a.end << ") and '" << escape_text(b.name)
                                   << "' [" << b.begin << ", " << b.end
                                   << ") overlap in the data section");
  }
}

// The safetensors dtype and element size of a tensor to write: an integer dtype when
// `integer_dtypes` names the tensor, else its DType.
struct WriteDtype {
  std::string name;
  size_t size = 0;
};

WriteDtype write_dtype(const std::string& name, const SafetensorsWriteTensor& t,
                       const std::map<std::string, std::string>& integer_dtypes,
                       const std::string& path) {
  const auto named = integer_dtypes.find(name);
  if (named == integer_dtypes.end()) return {dtype_name(t.dtype), dtype_size(t.dtype)};
  static const std::map<std::string, size_t> kIntegers = {{"I8", 1},  {"U8", 1},  {"I16", 2},
                                                          {"U16", 2}, {"I32", 4}, {"U32", 4},
                                                          {"I64", 8}, {"U64", 8}};
  const auto it = kIntegers.find(named->second);
  MK_CHECK(it != kIntegers.end(), "tensor '" << name << "' for " << path
                                             << ": unknown integer dtype '" << named->second
                                             << "' (expected I8, U8, I16, U16, I32, U32, I64 or "
                                                "U64)");
  return {it->first, it->second};
}

}  // namespace

uint64_t SafetensorsTensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // validated not to overflow at open
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const std::string shown = escape_text(path);
  const RegularFile rf = open_regular_file(path, "safetensors file");
  const int fd = rf.fd;
  file_size_ = rf.size;
  if (file_size_ < 8) {
    ::close(fd);
    MK_FAIL("safetensors file " << shown << " is truncated: " << file_size_
                                << " bytes, expected at least the 8-byte header length");
  }
  void* m = ::mmap(nullptr, file_size_, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  if (m == MAP_FAILED) {
    ::close(fd);
    MK_FAIL("cannot mmap safetensors file " << shown << " (" << file_size_
                                            << " bytes): " << std::strerror(map_err));
  }
  map_ = static_cast<const uint8_t*>(m);
  fd_ = fd;  // kept open: check_intact() asks it for the file's current size

  // From here on a throw must unmap: parse into locals inside a try.
  try {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | map_[i];  // little-endian
    MK_CHECK(header_len <= file_size_ - 8, "safetensors file "
                                               << shown << ": header length " << header_len
                                               << " exceeds the file size " << file_size_
                                               << " (truncated or not a safetensors file)");
    MK_CHECK(header_len <= kMaxHeaderBytes,
             "safetensors file " << shown << ": header length " << header_len
                                 << " exceeds the sane maximum of " << kMaxHeaderBytes << " bytes");
    const char* hb = reinterpret_cast<const char*>(map_ + 8);
    JsonLimits limits;
    limits.reject_duplicate_keys = true;  // a tensor named twice: the reference reader refuses it
    json header;
    try {
      header = parse_json_bounded(std::string_view(hb, header_len), "header", limits);
    } catch (const Error& e) {
      MK_FAIL("safetensors file " << shown << ": invalid JSON header (" << e.what() << ")");
    }
    MK_CHECK(header.is_object(), "safetensors file " << shown
                                                     << ": expected the header to be a JSON "
                                                        "object, got "
                                                     << header.type_name());
    data_section_ = map_ + 8 + header_len;
    const uint64_t data_size = file_size_ - 8 - header_len;
    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        MK_CHECK(value.is_object() || value.is_null(),
                 "safetensors file " << shown << ": expected '__metadata__' to be an object, got "
                                     << describe_json(value));
        if (value.is_null()) continue;
        for (const auto& [mk, mv] : value.items()) {
          MK_CHECK(mv.is_string(), "safetensors file " << shown << ": __metadata__ key '"
                                                       << escape_text(mk)
                                                       << "' must map to a string, got "
                                                       << describe_json(mv));
          metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      tensors_.emplace(key, parse_tensor_entry(path, key, value, data_size));
    }
    check_no_overlap(shown, tensors_);
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), file_size_);
    map_ = nullptr;
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), file_size_);
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::check_intact() const {
  struct stat st {};
  MK_CHECK(fd_ >= 0 && ::fstat(fd_, &st) == 0,
           "safetensors file " << escape_text(path_) << " can no longer be inspected: "
                               << std::strerror(errno));
  MK_CHECK(static_cast<size_t>(st.st_size) >= file_size_,
           "safetensors file " << escape_text(path_) << " was truncated after it was opened ("
                               << st.st_size << " bytes now, " << file_size_
                               << " at open): its tensors can no longer be read");
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      fd_(std::exchange(o.fd_, -1)),
      file_size_(std::exchange(o.file_size_, 0)),
      data_section_(std::exchange(o.data_section_, nullptr)),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), file_size_);
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    fd_ = std::exchange(o.fd_, -1);
    file_size_ = std::exchange(o.file_size_, 0);
    data_section_ = std::exchange(o.data_section_, nullptr);
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  MK_CHECK(it != tensors_.end(),
           "tensor '" << escape_text(name) << "' not found in " << escape_text(path_));
  return it->second;
}

DType SafetensorsFile::dtype(const std::string& name) const {
  const SafetensorsTensorInfo& t = info(name);
  MK_CHECK(t.dtype_supported, "tensor '" << escape_text(name) << "' in " << escape_text(path_)
                                         << " has dtype " << t.dtype_name
                                         << ", which moekit does not read (expected BF16, F16, "
                                            "F32 or F8_E4M3)");
  return t.dtype;
}

const void* SafetensorsFile::data(const std::string& name) const {
  dtype(name);
  return raw_data(name);
}

const void* SafetensorsFile::raw_data(const std::string& name) const {
  const SafetensorsTensorInfo& t = info(name);
  check_intact();
  return data_section_ + t.begin;
}

void write_safetensors(const std::string& path,
                       const std::map<std::string, SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::map<std::string, std::string>& integer_dtypes) {
  for (const auto& kv : integer_dtypes)
    MK_CHECK(tensors.count(kv.first), "integer dtype given for tensor '"
                                          << kv.first << "', which is not written to " << path);
  // Order: larger elements first, then name (what the Python writer does), so every tensor is
  // aligned to its element size given the 8-byte padded header.
  std::vector<const std::pair<const std::string, SafetensorsWriteTensor>*> order;
  for (const auto& kv : tensors) order.push_back(&kv);
  auto elem_size = [&](const auto* kv) {
    return write_dtype(kv->first, kv->second, integer_dtypes, path).size;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](auto* a, auto* b) { return elem_size(a) > elem_size(b); });

  json header = json::object();
  uint64_t offset = 0;
  for (const auto* kv : order) {
    const std::string& name = kv->first;
    const SafetensorsWriteTensor& t = kv->second;
    MK_CHECK(name != "__metadata__", "cannot write a tensor named '__metadata__' to " << path);
    const WriteDtype dt = write_dtype(name, t, integer_dtypes, path);
    uint64_t bytes = dt.size;
    for (int64_t d : t.shape) {
      MK_CHECK(d >= 0, "tensor '" << name << "' for " << path << ": negative dimension in shape "
                                  << shape_string(t.shape));
      MK_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
               "tensor '" << name << "' for " << path << ": shape " << shape_string(t.shape)
                          << " overflows");
    }
    MK_CHECK(bytes == t.bytes.size(), "tensor '" << name << "' for " << path << ": shape "
                                                 << shape_string(t.shape) << " of "
                                                 << dt.name << " needs " << bytes
                                                 << " bytes, got " << t.bytes.size());
    header[name] = {{"dtype", dt.name},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  MK_CHECK(out, "cannot create safetensors file " << path << ": " << std::strerror(errno));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto* kv : order) {
    const auto& bytes = kv->second.bytes;
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  out.flush();
  MK_CHECK(out, "writing safetensors file " << path << " failed: " << std::strerror(errno));
}

}  // namespace moekit
