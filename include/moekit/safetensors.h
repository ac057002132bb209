// Reading and writing safetensors files (https://github.com/huggingface/safetensors format):
//   [8 bytes: header length N, little-endian u64][N bytes: JSON header][data section]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section) plus an optional "__metadata__" object of string -> string.
//
// SafetensorsFile maps the file read-only and validates the whole header up front (length within
// the file, valid JSON, offsets inside the data section, byte span == dtype size x shape with
// overflow-safe arithmetic), so a truncated or hostile file fails at open with a message naming
// the file and the tensor, never later with a wild read. Tensor data is not touched until used:
// the pages of an expert nobody routes to are never read from disk.
//
// Precondition: the file is not truncated while a SafetensorsFile maps it. Every data() and
// raw_data() call checks the file's current size and throws when it shrank, so the loaders'
// reads fail with an error; a pointer obtained before the truncation can still fault (SIGBUS).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moekit/dtype.h"

namespace moekit {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;        // as written in the file ("BF16", "I64", ...)
  bool dtype_supported = false;  // one of moekit::DType
  DType dtype = DType::BF16;     // meaningful only when dtype_supported
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets within the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
  uint64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws moekit::Error naming the file and the offending key.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const { return path_; }
  size_t file_size() const { return file_size_; }

  // Tensor names in the file, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws "tensor 'x' not found in <file>" when absent. Lists unsupported dtypes too.
  const SafetensorsTensorInfo& info(const std::string& name) const;
  // The tensor's dtype; throws naming the tensor, the file and the dtype when moekit cannot read
  // it (anything other than BF16, F16, F32, F8_E4M3).
  DType dtype(const std::string& name) const;
  const std::vector<int64_t>& shape(const std::string& name) const { return info(name).shape; }
  // Pointer into the mapping (alignment as the file gives it: at least 1 byte). Checks the
  // dtype as dtype() does; raw_data() does not.
  const void* data(const std::string& name) const;
  const void* raw_data(const std::string& name) const;
  // Throws when the file on disk is now shorter than when it was mapped.
  void check_intact() const;

  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  int fd_ = -1;  // open for check_intact()
  size_t file_size_ = 0;
  const uint8_t* data_section_ = nullptr;
  std::map<std::string, SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: the bytes are borrowed and must match dtype size x shape exactly.
struct SafetensorsWriteTensor {
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes a safetensors file the way the Python library does: header padded with spaces to a
// multiple of 8, tensors packed without holes in order of decreasing element size, then name, so
// every tensor starts aligned to its element size.
// Throws naming the file and tensor when a byte span does not match its shape or I/O fails.
// integer_dtypes names the tensors that hold integers (expert ids, counts), which DType does not
// name, with their safetensors dtype: "I8", "U8", "I16", "U16", "I32", "U32", "I64" or "U64"; the
// `dtype` of such a tensor is not used.
void write_safetensors(const std::string& path,
                       const std::map<std::string, SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::map<std::string, std::string>& integer_dtypes = {});

// Convenience for owners of typed buffers.
template <typename T>
std::span<const uint8_t> as_bytes_span(const T* data, size_t count) {
  return {reinterpret_cast<const uint8_t*>(data), count * sizeof(T)};
}

}  // namespace moekit
