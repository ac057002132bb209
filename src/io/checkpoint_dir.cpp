// CheckpointDir (see checkpoint_dir.h).
#include "io/checkpoint_dir.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moekit/error.h"

namespace moekit::io {

namespace fs = std::filesystem;

std::string TensorRef::where() const { return "'" + info->name + "' in " + file->path(); }

CheckpointDir::CheckpointDir(const std::string& path) : path_(path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  MK_CHECK(!ec && fs::exists(st), "checkpoint path " << path << " does not exist");
  if (fs::is_regular_file(st)) {
    auto f = open(path);
    for (const std::string& n : f->names()) file_of_[n] = path;
    return;
  }
  MK_CHECK(fs::is_directory(st),
           "checkpoint path " << path << " is neither a directory nor a file");

  const fs::path index = fs::path(path) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      MK_FAIL("checkpoint index " << index.string() << " is not valid JSON (" << e.what() << ")");
    }
    MK_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             "checkpoint index " << index.string() << ": expected an object with a 'weight_map' "
                                 << "object");
    for (const auto& [name, file] : j["weight_map"].items()) {
      MK_CHECK(file.is_string(), "checkpoint index " << index.string() << ": weight_map['" << name
                                                     << "'] must be a file name, got "
                                                     << file.dump());
      const std::string f = file.get<std::string>();
      MK_CHECK(f.find("..") == std::string::npos && !f.empty() && f[0] != '/',
               "checkpoint index " << index.string() << ": weight_map['" << name << "'] = '" << f
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
  MK_CHECK(!files.empty(), "checkpoint directory " << path
                                                   << " holds no *.safetensors files and no "
                                                      "model.safetensors.index.json");
  for (const std::string& file : files) {
    auto f = open(file);
    for (const std::string& n : f->names()) {
      auto [it, inserted] = file_of_.emplace(n, file);
      MK_CHECK(inserted, "checkpoint directory " << path << ": tensor '" << n << "' is in both "
                                                 << it->second << " and " << file);
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
  MK_CHECK(r.file->contains(name), "checkpoint " << path_ << ": the index puts tensor '" << name
                                                 << "' in " << it->second
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
