// NCCL detection for expert parallelism (moekit/ep_nccl.h) and what the CLI says about it: a
// build without NCCL names why expert parallelism is off; a build with it names the library and
// its version; `moekit bench --ep N` never silently runs on fewer GPUs than ranks; a build without
// CUDA or NCCL says so for the GPU layers, the communicator and the unique id.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "expect_error.h"
#include "moekit/ep_layer.h"
#include "moekit/ep_nccl.h"

namespace moekit::ep {
namespace {

TEST(EpNccl, SupportIsConsistentAndSaysWhy) {
  const NcclSupport& s = nccl_support();
  std::printf("%s\n", s.describe().c_str());
  if (!s.built) {
    EXPECT_FALSE(s.on());
    EXPECT_NE(s.reason.find("built without NCCL"), std::string::npos) << s.reason;
    EXPECT_EQ(s.describe().rfind("expert parallelism: off (", 0), 0u) << s.describe();
    return;
  }
  EXPECT_FALSE(s.header_version.empty());
  EXPECT_NE(s.library.find("nccl"), std::string::npos) << s.library;
  if (s.on()) {
    EXPECT_TRUE(s.reason.empty()) << s.reason;
    EXPECT_EQ(s.runtime_version.rfind("2.", 0), 0u) << s.runtime_version;
    EXPECT_NE(s.describe().find("NCCL " + s.runtime_version), std::string::npos);
  } else {
    EXPECT_NE(s.reason.find("does not load"), std::string::npos) << s.reason;
  }
  EXPECT_EQ(&s, &nccl_support()) << "looked up once";
}

std::string run_cli(const std::string& args, int* status) {
  const std::string cmd = std::string(MOEKIT_CLI_PATH) + " " + args + " 2>&1";
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int rc = pclose(pipe);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  return out;
}

TEST(EpNccl, BenchEpSaysWhatIsMissing) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  int status = 0;
  std::string out = run_cli("bench --model deepseek-v3 --batch 1 --ep 2", &status);
  // without NCCL: why it is off; with NCCL on a machine of fewer than 2 GPUs: how many it has (a
  // machine with 2 would run the bench: CI has none)
  EXPECT_NE(status, 0) << out;
  const std::string want = nccl_support().on() ? "GPU" : "bench --ep 2: expert parallelism: off (";
  EXPECT_NE(out.find(want), std::string::npos) << out;
  out = run_cli("bench --model deepseek-v3 --ep 0", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("expected --ep >= 1, got 0"), std::string::npos) << out;
  out = run_cli("bench --model deepseek-v3 --ep 2 --ep-transport local --plot x.png", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("--plot belongs to the one-GPU bench"), std::string::npos) << out;
  out = run_cli("bench --model deepseek-v3 --ep 2 --ep-transport tcp", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("--ep-transport"), std::string::npos) << out;
}

TEST(EpNccl, WithoutNcclTheCallsSayWhy) {
  if (nccl_support().on()) GTEST_SKIP() << "NCCL is on: " << nccl_support().describe();
  test::expect_error([] { nccl_unique_id(); }, {"ncclGetUniqueId: expert parallelism: off ("});
}

#if !defined(MOEKIT_WITH_CUDA)
TEST(EpNccl, GpuLayersSayCudaIsMissing) {
  const MoeSpec spec = [] {
    MoeSpec s;
    s.name = "tiny";
    return s;
  }();
  test::expect_error(
      [&] { GroupLayer(spec, Placement::contiguous(4, 2), Transport::Local, {}, {}); },
      {"built without CUDA"});
  test::expect_error([&] { MoeLayer(spec, Placement::contiguous(4, 2), nullptr, {}); },
                     {"built without CUDA"});
  test::expect_error([&] { Communicator(NcclUniqueId{}, 2, 0, 0); }, {"built without CUDA"});
}
#endif

}  // namespace
}  // namespace moekit::ep
