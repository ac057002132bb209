// libFuzzer target: bytes -> a .safetensors file -> SafetensorsFile (mmap + header validation) ->
// every tensor read end to end.
//
// Contract checked: opening either throws moekit::Error or yields a tensor table whose every
// entry lies inside the mapping with a byte span equal to dtype size x shape; reading every byte
// of every tensor (and converting the supported ones to float) must then never fault. A read
// outside the mapping is a SEGV that libFuzzer reports. The same file is also opened as a
// checkpoint directory (CheckpointDir), the name table the loader resolves names in.
// Seeds: fuzz/corpus/safetensors/ and the checkpoint seeds from fuzz_make_seeds.
#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz_common.h"
#include "io/checkpoint_dir.h"
#include "moekit/error.h"
#include "moekit/safetensors.h"

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", what.c_str());
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = moekit::fuzz::scratch_path("safetensors");
  const std::string path = dir + "/model.safetensors";
  moekit::fuzz::write_file(path, data, size);
  try {
    moekit::SafetensorsFile f(path);
    uint64_t checksum = 0;
    for (const std::string& name : f.names()) {
      const moekit::SafetensorsTensorInfo& t = f.info(name);
      if (t.begin > t.end || t.end > f.file_size()) fail("offsets outside the file: " + name);
      const uint8_t* p = static_cast<const uint8_t*>(f.raw_data(name));
      for (uint64_t i = 0; i < t.nbytes(); ++i) checksum += p[i];
      if (t.dtype_supported) {
        const moekit::DType d = f.dtype(name);
        if (t.numel() * moekit::dtype_size(d) != t.nbytes()) fail("span != numel x size: " + name);
        const void* values = f.data(name);
        for (uint64_t i = 0; i < t.numel(); ++i) {
          checksum += static_cast<uint64_t>(moekit::load_as_float(d, values, i) != 0.0f);
        }
      }
    }
    moekit::io::CheckpointDir ckpt(path);
    for (const std::string& name : f.names()) {
      const moekit::io::TensorRef r = ckpt.find(name);
      if (!r) fail("CheckpointDir lost tensor " + name);
    }
    if (checksum == 0xdeadbeefcafeull) std::fprintf(stderr, "unlikely\n");  // keep the reads
  } catch (const moekit::Error&) {
  }
  return 0;
}
