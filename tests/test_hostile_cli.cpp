// Careless CLI use and memory (issue 35): numbers in decimal only, negative layer / iteration
// counts refused, options that do nothing on the chosen device refused, control characters of
// user text escaped on stderr; one memory estimate (weights, inputs, activations, workspace)
// checked before anything is allocated, by `run`, `bench` and the CPU API, also under RLIMIT_AS.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "expect_error.h"
#include "hostile_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/memory_estimate.h"
#include "moekit/weights.h"

namespace moekit {
namespace {

using test::expect_error;
using test::scratch_dir;

struct CliCase {
  const char* name;
  std::string args;  // "{tiny}": a small config's path
  std::vector<std::string> fragments;
};

void PrintTo(const CliCase& c, std::ostream* os) { *os << c.name; }

class HostileCli : public ::testing::TestWithParam<CliCase> {};

TEST_P(HostileCli, RefusedNamingTheProblem) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const CliCase& c = GetParam();
  const std::string dir = scratch_dir();
  std::string args = c.args;
  if (auto p = args.find("{tiny}"); p != std::string::npos)
    args.replace(p, 6, test::write_tiny_config(dir));
  const test::CliRun r = test::run_moekit(dir, args);
  EXPECT_NE(r.status, 0) << "moekit " << args;
  EXPECT_LT(r.status, 128) << "moekit " << args << " died of a signal:\n" << r.err;
  for (const std::string& f : c.fragments)
    EXPECT_NE(r.err.find(f), std::string::npos) << "'" << f << "' not in stderr of moekit "
                                                << args << ":\n" << r.err;
}

const CliCase kCases[] = {
    {"HexTokens", "run --model {tiny} --device cpu --tokens 0x10",
     {"--tokens", "'0x10' is not a decimal integer"}},
    {"ExponentTokens", "run --model {tiny} --device cpu --tokens 1e3", {"'1e3' is not a decimal"}},
    {"NegativeLayer", "run --model {tiny} --device cpu --layer -7",
     {"--layer", "'-7' is not a non-negative decimal integer"}},
    {"NegativeIterations", "bench --model {tiny} --device cpu --batch 1 --iterations -5",
     {"--iterations", "'-5' is not a non-negative decimal integer"}},
    {"HexSeed", "run --model {tiny} --device cpu --seed 0x1", {"--seed", "'0x1'"}},
    {"BatchWithPlus", "bench --model {tiny} --device cpu --batch +4",
     {"--batch '+4': '+4' must be a whole number"}},
    {"PlotOnCpu", "bench --model {tiny} --device cpu --batch 1 --plot out.png",
     {"bench: --plot does nothing on --device cpu; it works on --device cuda"}},
    {"WeightSetsOnCpu", "bench --model {tiny} --device cpu --batch 1 --weight-sets 1",
     {"bench: --weight-sets does nothing on --device cpu; it works on --device cuda"}},
    {"NegativeWeightSets", "bench --model {tiny} --device cpu --batch 1 --weight-sets -1",
     {"--weight-sets", "'-1' is not a non-negative decimal integer"}},
    {"RunTooManyTokens", "run --model deepseek-v3 --device cpu --tokens 100000000",
     {"GB of host memory for deepseek-v3 (100000000 tokens)", "inputs", "activations",
      "available (MemAvailable"}},
    {"BenchTooLargeBatch", "bench --model qwen3-30b-a3b --device cpu --batch 1048576",
     {"GB of host memory for qwen3-30b-a3b (bench --batch 1048576)", "workspace"}},
    {"ControlCharactersInModelPath", "run --model '/nonexistent/x\x1b[31m.json'",
     {"config file '/nonexistent/x\\x1b[31m.json' does not exist"}},
};

INSTANTIATE_TEST_SUITE_P(Catalogue, HostileCli, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(HostileCliOutput, NoRawEscapeOnStderr) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const std::string dir = scratch_dir();
  const test::CliRun r = test::run_moekit(dir, "inspect --model '/nonexistent/\x1b]0;t\x07.json'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x07'), std::string::npos) << r.err;
}

TEST(HostileMemory, EstimateCountsEveryPart) {
  const MoeSpec s = test::small_spec("deepseek-v3");
  const HostMemoryEstimate e1 = host_memory_estimate(s, 1, false);
  const HostMemoryEstimate e1000 = host_memory_estimate(s, 1000, false);
  EXPECT_EQ(e1.weights, host_bytes_needed(s, 1, false));
  EXPECT_EQ(e1.inputs, size_t{1} * s.hidden * 2);
  EXPECT_EQ(e1000.inputs, size_t{1000} * s.hidden * 2);
  // At least the fp32 output and each slot's down row.
  EXPECT_GE(e1000.activations, size_t{1000} * s.hidden * 4 * (1 + s.top_k));
  EXPECT_EQ(e1.total(), e1.weights + e1.inputs + e1.activations + e1.workspace);
  // A wide model's activations overflow 64 bits long before its weights do: saturate, refuse.
  MoeSpec wide = s;
  wide.hidden = 1 << 30;
  wide.expert_intermediate = 1 << 30;
  expect_error([&] { check_host_memory(host_memory_estimate(wide, 1 << 30, true), "wide"); },
               {"GB of host memory for wide: weights", "activations", "GB available"});
}

TEST(HostileMemory, GpuEstimateHoldsEveryExpertAndGrowsWithTokens) {
  const MoeSpec s = test::small_spec("deepseek-v3");
  const size_t at1 = gpu_layer_device_bytes(s, 1), at64 = gpu_layer_device_bytes(s, 64);
  EXPECT_GE(at1, size_t(s.num_experts + s.shared_slots()) * s.expert_bytes() + s.router_bytes());
  EXPECT_GT(at64, at1 + size_t{63} * s.hidden * 4);  // at least the partial sums of 63 tokens
  expect_error([&] { gpu_layer_device_bytes(s, -1); }, {"expected max_tokens >= 0, got -1"});
}

// Under an address-space limit the CPU API refuses a forward whose activations do not fit,
// before allocating them, and says that the limit is what is short. In a child process, so the
// limit does not reach the rest of the suite.
TEST(HostileMemory, CpuApiRefusesUnderAddressSpaceLimit) {
  const MoeSpec s = test::small_spec("qwen3-30b-a3b", {4096, 16, 128, 2});
  const auto w = make_random_weights(s, s.moe_layers.front(), 1);
  const int tokens = 4096;
  std::vector<Bf16> x(static_cast<size_t>(tokens) * s.hidden, float_to_bf16(0.25f));
  const HostMemoryEstimate need = host_memory_estimate(s, tokens, false);
  ASSERT_GT(need.activations, size_t{512} << 20);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::ifstream statm("/proc/self/statm");
    size_t pages = 0;
    statm >> pages;
    const size_t used = pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const rlimit lim{used + (size_t{256} << 20), used + (size_t{256} << 20)};
    if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(3);
    try {
      cpu_fast::forward(*w, x.data(), tokens, FuseShared::Off);
    } catch (const Error& e) {
      const std::string msg = e.what();
      ::_exit(msg.find("available (RLIMIT_AS)") != std::string::npos &&
                      msg.find("activations") != std::string::npos
                  ? 0
                  : 1);
    } catch (...) {
      ::_exit(2);  // e.g. std::bad_alloc: the check did not run first
    }
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: message lacks RLIMIT_AS, 2: another exception, "
                                       "3: setrlimit failed, 4: no refusal";
}

}  // namespace
}  // namespace moekit
