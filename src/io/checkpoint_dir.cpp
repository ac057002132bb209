// CheckpointDir (see checkpoint_dir.h).
#include "io/checkpoint_dir.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/json_safe.h"
#include "common/regular_file.h"
#include "common/text_escape.h"
#include "moekit/error.h"

namespace moekit::io {

namespace fs = std::filesystem;

std::string TensorRef::where() const {
  return "'" + escape_text(info->name) + "' in " + escape_text(file->path());
}

CheckpointDir::CheckpointDir(const std::string& path) : path_(path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  const std::string shown = escape_text(path);
  MK_CHECK(!ec && fs::exists(st), "checkpoint path " << shown << " does not exist");
  if (fs::is_regular_file(st)) {
    auto f = open(path);
    for (const std::string& n : f->names()) file_of_[n] = path;
    return;
  }
  MK_CHECK(fs::is_directory(st), "checkpoint path "
                                     << shown << " is "
                                     << (fs::is_fifo(st)                ? "a FIFO (named pipe)"
                                         : fs::is_character_file(st) ? "a character device"
                                         : fs::is_block_file(st)     ? "a block device"
                                         : fs::is_socket(st)         ? "a socket"
                                                                     : "neither a directory nor a file")
                                     << ", expected a directory or a .safetensors file");

  const fs::path index = fs::path(path) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const std::string where = "checkpoint index " + escape_text(index.string());
    JsonLimits limits;
    limits.reject_duplicate_keys = true;  // a tensor mapped to two files: which one is meant?
    const nlohmann::json j = parse_json_bounded(
        read_regular_file(index.string(), "checkpoint index", kMaxIndexBytes), where, limits);
    MK_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             where << ": expected an object with a 'weight_map' object, got " << describe_json(j));
    for (const auto& [name, file] : j["weight_map"].items()) {
      MK_CHECK(file.is_string(), where << ": weight_map['" << escape_text(name)
                                       << "'] must be a file name, got " << describe_json(file));
      const std::string f = file.get<std::string>();
      MK_CHECK(f.find("..") == std::string::npos && !f.empty() && f[0] != '/',
               where << ": weight_map['" << escape_text(name) << "'] = '" << escape_text(f)
                     << "' must name a file inside the directory");
      file_of_[name] = (fs::path(path) / f).string();
    }
    return;
  }

  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(path)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  MK_CHECK(!files.empty(), "checkpoint directory " << shown
                                                   << " holds no *.safetensors files and no "
                                                      "model.safetensors.index.json");
  for (const std::string& file : files) {
    auto f = open(file);
    for (const std::string& n : f->names()) {
      auto [it, inserted] = file_of_.emplace(n, file);
      MK_CHECK(inserted, "checkpoint directory " << shown << ": tensor '" << escape_text(n)
                                                 << "' is in both " << escape_text(it->second)
                                                 << " and " << escape_text(file));
    }
  }
}

std::shared_ptr<const SafetensorsFile> CheckpointDir::open(const std::string& file) {
  auto it = files_.find(file);
  if (it != files_.end()) return it->second;
  auto f = std::make_shared<const SafetensorsFile>(file);
  files_.emplace(file, f);
  return f;
}

TensorRef CheckpointDir::find(const std::string& name) {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) return {};
  TensorRef r;
  r.file = open(it->second);
  MK_CHECK(r.file->contains(name), "checkpoint " << escape_text(path_) << ": the index puts tensor '"
                                                 << escape_text(name) << "' in "
                                                 << escape_text(it->second)
                                                 << ", which does not hold it");
  r.info = &r.file->info(name);
  return r;
}

std::vector<std::string> CheckpointDir::names_like(const std::string& fragment, size_t n) const {
  std::vector<std::string> out;
  for (const auto& [name, file] : file_of_) {
    if (out.size() >= n) break;
    if (fragment.empty() || name.find(fragment) != std::string::npos) out.push_back(name);
  }
  return out;
}

}  // namespace moekit::io
