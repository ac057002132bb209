// CheckpointDir: the tensors of a checkpoint directory (model.safetensors.index.json's weight_map,
// or every *.safetensors file when there is no index), opened on demand. A TensorRef keeps its
// file mapped for as long as it lives, so lazily materialised experts can read it later.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moekit/safetensors.h"

namespace moekit::io {

struct TensorRef {
  std::shared_ptr<const SafetensorsFile> file;
  const SafetensorsTensorInfo* info = nullptr;

  explicit operator bool() const { return info != nullptr; }
  const std::string& name() const { return info->name; }
  const std::vector<int64_t>& shape() const { return info->shape; }
  // "'name' in file"
  std::string where() const;
};

class CheckpointDir {
 public:
  // A directory (with or without an index) or a single .safetensors file.
  explicit CheckpointDir(const std::string& path);

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return file_of_.count(name) != 0; }
  // Opens the file holding `name` (once); an empty ref when the checkpoint has no such tensor.
  // Throws when the index names a tensor its file does not hold.
  TensorRef find(const std::string& name);
  size_t tensor_count() const { return file_of_.size(); }
  // Up to n tensor names containing `fragment` (all names when empty), for error messages.
  std::vector<std::string> names_like(const std::string& fragment, size_t n) const;

 private:
  std::shared_ptr<const SafetensorsFile> open(const std::string& file);

  std::string path_;
  std::map<std::string, std::string> file_of_;  // tensor -> file path
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> files_;
};

}  // namespace moekit::io
