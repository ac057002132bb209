// fuzz_make_seeds OUT_DIR: writes the checkpoint seeds of fuzz_checkpoint (and fuzz_safetensors)
// into OUT_DIR: each family's tiny layer (fuzz_common.h) from random weights, saved by
// save_checkpoint per-expert, stacked, and with F32 / fp8-e4m3 experts, each file followed by the
// byte that selects its family in fuzz_checkpoint. Generated rather than committed: they are a
// few kB each, and regenerating keeps them in step with the writer.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "moekit/checkpoint.h"
#include "moekit/error.h"
#include "moekit/weights.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  const fs::path out = argv[1];
  fs::create_directories(out);
  // A directory of this run's own (mkdtemp): parallel runs, or another user's leftover directory of
  // a fixed name, cannot collide with it or redirect its writes.
  std::string work_template = (fs::temp_directory_path() / "moekit_fuzz_make_seeds_XXXXXX").string();
  if (::mkdtemp(work_template.data()) == nullptr) {
    std::perror("fuzz_make_seeds: mkdtemp");
    return 1;
  }
  const fs::path work_root = work_template;
  const fs::path work = work_root / "checkpoint";
  const auto& models = moekit::fuzz::checkpoint_models();
  int written = 0;
  for (size_t m = 0; m < models.size(); ++m) {
    const moekit::MoeSpec spec = moekit::fuzz::tiny_spec(models[m]);
    const auto w = moekit::make_random_weights(spec, spec.moe_layers.front(), 1);
    struct Variant {
      const char* name;
      bool stacked;
      moekit::DType dtype;
    };
    for (const Variant& v :
         {Variant{"bf16", false, moekit::DType::BF16},
          Variant{"stacked", true, moekit::DType::BF16}, Variant{"f32", false, moekit::DType::F32},
          Variant{"fp8", false, moekit::DType::F8_E4M3}}) {
      fs::remove_all(work);
      moekit::SaveCheckpointOptions opt;
      opt.stacked = v.stacked;
      opt.expert_dtype = v.dtype;
      std::string file;
      try {
        file = moekit::save_checkpoint(*w, work.string(), opt);
      } catch (const moekit::Error& e) {
        std::fprintf(stderr, "fuzz_make_seeds: %s %s skipped: %s\n", models[m].c_str(), v.name,
                     e.what());
        continue;
      }
      std::ifstream in(file, std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
      bytes.push_back(static_cast<char>(m));  // fuzz_checkpoint's family selector
      std::ofstream(out / (models[m] + "_" + v.name), std::ios::binary)
          .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      ++written;
    }
  }
  fs::remove_all(work_root);
  std::printf("fuzz_make_seeds: %d seeds in %s\n", written, out.string().c_str());
  return written > 0 ? 0 : 1;
}
