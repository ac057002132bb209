// Finding a model's config (moekit/spec.h): by short name in config_dir() (the environment, the
// configs installed beside the program, the source tree's), or by a path to a file or directory.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "common/regular_file.h"
#include "moekit/error.h"
#include "moekit/spec.h"

namespace moekit {

namespace fs = std::filesystem;

std::string config_dir() {
  if (const char* env = std::getenv("MOEKIT_CONFIG_DIR"); env && *env) return env;
  // An installed program (the CLI in <prefix>/bin) reads the configs installed beside it, wherever
  // the prefix was installed or moved to, before the source tree it was built from.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "moekit" / "configs";
    if (fs::is_directory(installed, ec)) return installed.string();
  }
#ifdef MOEKIT_SOURCE_CONFIG_DIR
  if (fs::is_directory(MOEKIT_SOURCE_CONFIG_DIR)) return MOEKIT_SOURCE_CONFIG_DIR;
#endif
#ifdef MOEKIT_INSTALL_CONFIG_DIR
  if (fs::is_directory(MOEKIT_INSTALL_CONFIG_DIR)) return MOEKIT_INSTALL_CONFIG_DIR;
#endif
  return "configs";
}

std::vector<std::string> list_model_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(config_dir(), ec)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

MoeSpec load_spec(const std::string& name_or_path, const SpecOptions& options) {
  MK_CHECK(!name_or_path.empty(), "empty model name: expected a short name (e.g. deepseek-v3) or "
                                  "a path to a config.json");
  fs::path path(name_or_path);
  std::string display = name_or_path;
  if (fs::is_directory(path)) {
    path /= "config.json";
    MK_CHECK(fs::is_regular_file(path), "directory '" << name_or_path << "' holds no config.json");
  } else if (!fs::exists(path)) {
    const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                                 (name_or_path.size() > 5 &&
                                  name_or_path.substr(name_or_path.size() - 5) == ".json");
    MK_CHECK(!looks_like_path, "config file '" << name_or_path << "' does not exist");
    path = fs::path(config_dir()) / (name_or_path + ".json");
    if (!fs::exists(path)) {
      std::ostringstream known;
      for (const auto& n : list_model_names()) known << " " << n;
      MK_FAIL("unknown model '" << name_or_path << "': no file " << path.string()
                                << "; known models:" << known.str());
    }
  }
  MoeSpec spec = parse_spec_json(
      read_regular_file(path.string(), "config file", kMaxConfigBytes), display, options);
  spec.source_path = path.string();
  return spec;
}

}  // namespace moekit
