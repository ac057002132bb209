// safetensors reader (mmap, validate everything at open) and writer.
//
// Validation order at open, each failure naming the file (and the tensor or key):
//   file >= 8 bytes -> header length N <= file size - 8 and <= kMaxHeaderBytes -> header is a JSON
//   object -> per tensor: dtype is a string, shape an array of non-negative integers,
//   data_offsets two integers with begin <= end <= data section size, and end - begin equal to
//   element size x product(shape), computed with overflow checks -> __metadata__ string values.
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
  const std::string where = "tensor '" + name + "' in " + path;
  MK_CHECK(v.is_object(),
           where << ": expected an object {dtype, shape, data_offsets}, got " << v.type_name());
  SafetensorsTensorInfo t;
  t.name = name;

  auto dtype_it = v.find("dtype");
  MK_CHECK(dtype_it != v.end() && dtype_it->is_string(),
           where << ": expected a string 'dtype', got "
                 << (dtype_it == v.end() ? "none" : dtype_it->dump()));
  t.dtype_name = dtype_it->get<std::string>();
  t.dtype_supported = to_moekit_dtype(t.dtype_name, &t.dtype);

  auto shape_it = v.find("shape");
  MK_CHECK(shape_it != v.end() && shape_it->is_array(),
           where << ": expected an array 'shape', got "
                 << (shape_it == v.end() ? "none" : shape_it->dump()));
  for (const json& d : *shape_it) {
    MK_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
             where << ": expected non-negative integer dimensions, got shape " << shape_it->dump());
    const uint64_t dim = d.get<uint64_t>();
    MK_CHECK(dim <= static_cast<uint64_t>(INT64_MAX),
             where << ": dimension " << dim << " does not fit in int64");
    t.shape.push_back(static_cast<int64_t>(dim));
  }

  auto off_it = v.find("data_offsets");
  MK_CHECK(off_it != v.end() && off_it->is_array() && off_it->size() == 2 &&
               (*off_it)[0].is_number_unsigned() && (*off_it)[1].is_number_unsigned(),
           where << ": expected 'data_offsets' [begin, end] of non-negative integers, got "
                 << (off_it == v.end() ? "none" : off_it->dump()));
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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MK_CHECK(fd >= 0, "cannot open safetensors file " << path << ": " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    MK_FAIL("cannot stat safetensors file " << path << ": " << std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    MK_FAIL("safetensors path " << path << " is not a regular file");
  }
  file_size_ = static_cast<size_t>(st.st_size);
  if (file_size_ < 8) {
    ::close(fd);
    MK_FAIL("safetensors file " << path << " is truncated: " << file_size_
                                << " bytes, expected at least the 8-byte header length");
  }
  void* m = ::mmap(nullptr, file_size_, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  MK_CHECK(m != MAP_FAILED, "cannot mmap safetensors file "
                                << path << " (" << file_size_
                                << " bytes): " << std::strerror(map_err));
  map_ = static_cast<const uint8_t*>(m);

  // From here on a throw must unmap: parse into locals inside a try.
  try {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | map_[i];  // little-endian
    MK_CHECK(header_len <= file_size_ - 8, "safetensors file "
                                               << path << ": header length " << header_len
                                               << " exceeds the file size " << file_size_
                                               << " (truncated or not a safetensors file)");
    MK_CHECK(header_len <= kMaxHeaderBytes,
             "safetensors file " << path << ": header length " << header_len
                                 << " exceeds the sane maximum of " << kMaxHeaderBytes << " bytes");
    const char* hb = reinterpret_cast<const char*>(map_ + 8);
    json header;
    try {
      header = json::parse(hb, hb + header_len);
    } catch (const json::exception& e) {
      MK_FAIL("safetensors file " << path << ": invalid JSON header (" << e.what() << ")");
    }
    MK_CHECK(header.is_object(), "safetensors file " << path
                                                     << ": expected the header to be a JSON "
                                                        "object, got "
                                                     << header.type_name());
    data_section_ = map_ + 8 + header_len;
    const uint64_t data_size = file_size_ - 8 - header_len;
    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        MK_CHECK(value.is_object() || value.is_null(),
                 "safetensors file " << path << ": expected '__metadata__' to be an object, got "
                                     << value.type_name());
        if (value.is_null()) continue;
        for (const auto& [mk, mv] : value.items()) {
          MK_CHECK(mv.is_string(), "safetensors file " << path << ": __metadata__ key '" << mk
                                                       << "' must map to a string, got "
                                                       << mv.dump());
          metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      tensors_.emplace(key, parse_tensor_entry(path, key, value, data_size));
    }
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), file_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), file_size_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      file_size_(std::exchange(o.file_size_, 0)),
      data_section_(std::exchange(o.data_section_, nullptr)),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), file_size_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
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
  MK_CHECK(it != tensors_.end(), "tensor '" << name << "' not found in " << path_);
  return it->second;
}

DType SafetensorsFile::dtype(const std::string& name) const {
  const SafetensorsTensorInfo& t = info(name);
  MK_CHECK(t.dtype_supported, "tensor '" << name << "' in " << path_ << " has dtype "
                                         << t.dtype_name
                                         << ", which moekit does not read (expected BF16, F16, "
                                            "F32 or F8_E4M3)");
  return t.dtype;
}

const void* SafetensorsFile::data(const std::string& name) const {
  dtype(name);
  return raw_data(name);
}

const void* SafetensorsFile::raw_data(const std::string& name) const {
  return data_section_ + info(name).begin;
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
