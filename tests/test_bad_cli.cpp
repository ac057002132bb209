// The bad-input catalogue, CLI arguments: the built `moekit` binary run with one argument wrong
// must exit non-zero (not by a signal) with a stderr that names the argument and its value. Each
// catalogue entry is one ctest case (value-parameterised), named after what is wrong.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hostile_util.h"

namespace moekit {
namespace {

using test::CliRun;
using test::run_moekit;
using test::scratch_dir;
using test::write_tiny_config;

struct CliCase {
  const char* name;
  std::string args;  // "{tiny}" is replaced by the small config's path
  std::vector<std::string> fragments;
};

void PrintTo(const CliCase& c, std::ostream* os) { *os << c.name; }

class BadCli : public ::testing::TestWithParam<CliCase> {};

TEST_P(BadCli, ExitsNonZeroNamingTheArgument) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const CliCase& c = GetParam();
  const std::string dir = scratch_dir();
  std::string args = c.args;
  if (auto p = args.find("{tiny}"); p != std::string::npos)
    args.replace(p, 6, write_tiny_config(dir));
  const CliRun r = run_moekit(dir, args);
  EXPECT_NE(r.status, 0) << "moekit " << args;
  EXPECT_LT(r.status, 128) << "moekit " << args << " died of a signal:\n" << r.err;
  for (const std::string& f : c.fragments)
    EXPECT_NE(r.err.find(f), std::string::npos)
        << "'" << f << "' not in stderr of moekit " << args << ":\n"
        << r.err;
}

const CliCase kCliCases[] = {
    {"UnknownModel", "run --model no-such-model", {"unknown model 'no-such-model'"}},
    {"ModelMissing", "run --tokens 2", {"--model", "required"}},
    {"ZeroTokens", "run --model {tiny} --tokens 0", {"--tokens must be >= 1, got 0"}},
    {"NegativeTokens", "run --model {tiny} --tokens -3", {"--tokens must be >= 1, got -3"}},
    {"TokensNotANumber", "run --model {tiny} --tokens lots", {"--tokens", "lots"}},
    {"FuseSharedBadValue",
     "run --model {tiny} --fuse-shared maybe",
     {"unknown fuse_shared mode 'maybe' (expected auto, on or off)"}},
    {"FuseOnWithoutSharedExpert",
     "run --model mixtral-8x7b --fuse-shared on",
     {"--fuse-shared on: 'mixtral-8x7b' has no shared expert"}},
    {"DenseLayer",
     "run --model {tiny} --layer 0",
     {"--layer 0 is a dense layer of", "first MoE layer is 3"}},
    {"LayerOutOfRange",
     "run --model {tiny} --layer 500",
     {"--layer 500 is out of range", "61 layers"}},
    {"BogusDevice",
     "run --model {tiny} --device bogus",
     {"--device 'bogus' is not one of auto, cpu, cuda"}},
    {"BogusBackend",
     "run --model {tiny} --device cpu --backend bogus",
     {"--backend 'bogus' is not one of fast, reference"}},
    {"WeightsDirMissing",
     "run --model {tiny} --device cpu --weights /nonexistent/ckpt",
     {"checkpoint path /nonexistent/ckpt does not exist"}},
    {"BatchEmptyEntry",
     "bench --model {tiny} --device cpu --batch 1,,2",
     {"--batch '1,,2' has an empty entry"}},
    {"BatchZero",
     "bench --model {tiny} --device cpu --batch 0",
     {"--batch '0': '0' must be a whole number in [1, 1048576]"}},
    {"BatchNotANumber",
     "bench --model {tiny} --device cpu --batch 4,x",
     {"--batch '4,x': 'x' is not a number"}},
    {"InspectBrokenConfig",
     "inspect --model /nonexistent/config.json",
     {"config file '/nonexistent/config.json' does not exist"}},
};

INSTANTIATE_TEST_SUITE_P(Catalogue, BadCli, ::testing::ValuesIn(kCliCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moekit
