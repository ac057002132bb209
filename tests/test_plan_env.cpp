// plan::plan_overrides_from_env (moekit/plan.h): the one place that reads the plan's MOEKIT_*
// variables. Each variable: unset or empty keeps the base's value, each good value lands in its
// PlanOverrides field, each bad value throws naming the variable, the value and what was expected.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "expect_error.h"
#include "moekit/plan.h"
#include "scoped_env.h"

namespace moekit::plan {
namespace {

// Every variable plan_overrides_from_env reads.
const char* const kAllVariables[] = {
    "MOEKIT_EXPERTS_KERNEL",         "MOEKIT_EXPERTS_TAIL",         "MOEKIT_EXPERTS_SHARED_FIRST",
    "MOEKIT_EXPERTS_WHOLE_TILES",    "MOEKIT_EXPERTS_DOWN_SPLIT",   "MOEKIT_EXPERTS_DOWN_DEEP",
    "MOEKIT_EXPERTS_ONE_TOKEN_RING", "MOEKIT_EXPERTS_L2_ACTS",      "MOEKIT_EXPERTS_L2_KEEP_FROM",
    "MOEKIT_EXPERTS_DOWN_TAIL",      "MOEKIT_EXPERTS_HALF_ITEMS",   "MOEKIT_EXPERTS_SELF_ROUTE",
    "MOEKIT_EXPERTS_TASK16",         "MOEKIT_SHARED_DENSE",         "MOEKIT_PDL",
    "MOEKIT_PRINT_CONFIG",           "MOEKIT_EXPERTS_GROUPED_FROM", "MOEKIT_EXPERTS_GROUPED_GEMM",
    "MOEKIT_EXPERTS_MX_CHUNK",       "MOEKIT_EXPERTS_MX_GROUPS",    "MOEKIT_EXPERTS_MX_GEMM"};

// Each test starts with none of them set (the caller's environment restored afterwards).
class PlanEnv : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kAllVariables) {
      cleared_.push_back(std::make_unique<test::ScopedEnv>(v, nullptr));
    }
  }
  std::vector<std::unique_ptr<test::ScopedEnv>> cleared_;
};

TEST_F(PlanEnv, NothingSetGivesTheRulesDefaults) {
  EXPECT_EQ(plan_overrides_from_env(), PlanOverrides{});
  PlanOverrides base;
  base.down_split_tokens = 3;
  base.stream = Stream::Registers;
  base.pdl = false;
  EXPECT_EQ(plan_overrides_from_env(base), base) << "unset variables keep the base's values";
}

TEST_F(PlanEnv, KernelParsesTheStreamNamesAndNamesABadOne) {
  const std::pair<const char*, Stream> values[] = {{"regs", Stream::Registers},
                                                   {"regs-early", Stream::RegistersEarlyActs},
                                                   {"bulk", Stream::Bulk},
                                                   {"grouped", Stream::Grouped}};
  for (const auto& [name, stream] : values) {
    const test::ScopedEnv env("MOEKIT_EXPERTS_KERNEL", name);
    EXPECT_EQ(plan_overrides_from_env().stream, stream) << name;
  }
  for (const char* bad : {"persistent", "ring", "Bulk"}) {  // (deleted variants among them)
    const test::ScopedEnv env("MOEKIT_EXPERTS_KERNEL", bad);
    test::expect_error([] { plan_overrides_from_env(); },
                       {std::string("MOEKIT_EXPERTS_KERNEL='") + bad +
                        "' (expected bulk, regs, regs-early or grouped)"});
  }
  const test::ScopedEnv empty("MOEKIT_EXPERTS_KERNEL", "");
  EXPECT_FALSE(plan_overrides_from_env().stream.has_value()) << "empty: the rule";
}

TEST_F(PlanEnv, PdlAndPrintAreZeroOrOne) {
  {
    const test::ScopedEnv env("MOEKIT_PDL", "0");
    EXPECT_FALSE(plan_overrides_from_env().pdl);
  }
  {
    const test::ScopedEnv env("MOEKIT_PRINT_CONFIG", "1");
    EXPECT_TRUE(plan_overrides_from_env().print);
  }
  for (const char* var : {"MOEKIT_PDL", "MOEKIT_PRINT_CONFIG"}) {
    const test::ScopedEnv env(var, "yes");
    test::expect_error([] { plan_overrides_from_env(); },
                       {std::string(var) + "='yes' (expected 0 or 1)"});
  }
}

TEST_F(PlanEnv, GroupedGemmNamesOneInstanceForBothGemmsOrOneEach) {
  const auto kernels = grouped_gemm_kernels();
  ASSERT_GE(kernels.size(), 2u);
  {
    const test::ScopedEnv env("MOEKIT_EXPERTS_GROUPED_GEMM", kernels[1].name);
    const PlanOverrides o = plan_overrides_from_env();
    EXPECT_EQ(o.grouped_gate_up, 1);
    EXPECT_EQ(o.grouped_down, 1);
  }
  {
    const std::string both = std::string(kernels[1].name) + "," + kernels[0].name;
    const test::ScopedEnv env("MOEKIT_EXPERTS_GROUPED_GEMM", both.c_str());
    const PlanOverrides o = plan_overrides_from_env();
    EXPECT_EQ(o.grouped_gate_up, 1);
    EXPECT_EQ(o.grouped_down, 0);
  }
  for (const char* bad : {"grouped_bf16_96x256_coop", "64", ","}) {
    const test::ScopedEnv env("MOEKIT_EXPERTS_GROUPED_GEMM", bad);
    test::expect_error([] { plan_overrides_from_env(); },
                       {std::string("MOEKIT_EXPERTS_GROUPED_GEMM='") + bad + "'",
                        "no grouped GEMM instance", kernels[0].name});
  }
}

// One integer variable: its field, values it takes, values it refuses and the expected text.
struct IntKnob {
  const char* variable;
  int PlanOverrides::*field;
  std::vector<int> good;
  std::vector<std::string> bad;
  std::string expected;
};

constexpr const char* kTokens = "a token count, 0 (never) to 1048576";
constexpr const char* kPercent = "a percentage, 0 to 100";

const IntKnob kIntKnobs[] = {
    {"MOEKIT_EXPERTS_TAIL",
     &PlanOverrides::gate_up_tail_percent,
     {0, 15, 100},
     {"101", "-1", "15%", "x"},
     kPercent},
    {"MOEKIT_EXPERTS_SHARED_FIRST",
     &PlanOverrides::shared_first_tokens,
     {0, 8, 4096},
     {"-1", "yes", "8 tokens", "99999999999"},
     kTokens},
    {"MOEKIT_EXPERTS_WHOLE_TILES",
     &PlanOverrides::whole_tile_tokens,
     {0, 4, 64},
     {"-1", "all", "4 tokens"},
     kTokens},
    {"MOEKIT_EXPERTS_DOWN_SPLIT",
     &PlanOverrides::down_split_tokens,
     {0, 8, 256},
     {"-1", "on", "8 tokens"},
     kTokens},
    {"MOEKIT_EXPERTS_DOWN_DEEP",
     &PlanOverrides::down_deep_tokens,
     {0, 8, 256},
     {"-1", "on", "8 tokens"},
     kTokens},
    {"MOEKIT_EXPERTS_ONE_TOKEN_RING",
     &PlanOverrides::one_token_rings,
     {0, 1},
     {"2", "-1", "on"},
     "0 or 1"},
    {"MOEKIT_EXPERTS_L2_ACTS",
     &PlanOverrides::weights_only_tokens,
     {0, 2, 128},
     {"-1", "on", "32 tokens"},
     kTokens},
    {"MOEKIT_EXPERTS_L2_KEEP_FROM",
     &PlanOverrides::l2_keep_from_tokens,
     {0, 1, 64},
     {"-1", "on"},
     kTokens},
    {"MOEKIT_EXPERTS_DOWN_TAIL",
     &PlanOverrides::down_tail_percent,
     {0, 20, 100},
     {"101", "-1", "20%", "x"},
     kPercent},
    {"MOEKIT_EXPERTS_HALF_ITEMS",
     &PlanOverrides::half_items_per_cta,
     {0, 2, 16},
     {"17", "-1", "2 items", "x"},
     "items per CTA, 0 to 16"},
    {"MOEKIT_EXPERTS_SELF_ROUTE",
     &PlanOverrides::self_route_tokens,
     {0, 1},
     {"2", "-1", "on", "x"},
     "a token count, 0 or 1"},
    {"MOEKIT_EXPERTS_TASK16",
     &PlanOverrides::task16_from,
     {0, 1, 16},
     {"-1", "on", "6 tokens"},
     "routed tokens per expert, 0 (never) to 1048576"},
    {"MOEKIT_SHARED_DENSE",
     &PlanOverrides::shared_dense_tokens,
     {0, 1, 32, 4096},
     {"-1", "yes", "8 tokens", "99999999999"},
     kTokens},
    {"MOEKIT_EXPERTS_MX_CHUNK",
     &PlanOverrides::grouped_mx_chunk,
     {1, 3, 4096},
     {"0", "-1", "3 experts", "x", "99999999999"},
     "an expert count, >= 1"},
    {"MOEKIT_EXPERTS_MX_GEMM",
     &PlanOverrides::grouped_mx_tile,
     {0, 64, 128},
     {"-1", "32", "129", "packed"},
     "0 (widen), 64 or 128 (the packed GEMM's token tile)"},
    {"MOEKIT_EXPERTS_MX_GROUPS",
     &PlanOverrides::mx_groups_tokens,
     {0, 1, 8, 4096},
     {"-1", "on", "8 tokens", "99999999999"},
     kTokens},
};

void PrintTo(const IntKnob& k, std::ostream* os) { *os << k.variable; }

class PlanEnvInt : public PlanEnv, public testing::WithParamInterface<IntKnob> {};

TEST_P(PlanEnvInt, ParsesItsValuesIntoItsFieldAndNamesABadOne) {
  const IntKnob& k = GetParam();
  EXPECT_EQ(plan_overrides_from_env().*k.field, -1) << k.variable << " unset: the rule";
  for (int v : k.good) {
    const test::ScopedEnv env(k.variable, std::to_string(v).c_str());
    const PlanOverrides o = plan_overrides_from_env();
    EXPECT_EQ(o.*k.field, v) << k.variable;
    PlanOverrides only = PlanOverrides{};
    only.*k.field = v;
    EXPECT_EQ(o, only) << k.variable << "=" << v << " changed another field";
  }
  for (const std::string& v : k.bad) {
    const test::ScopedEnv env(k.variable, v.c_str());
    test::expect_error([] { plan_overrides_from_env(); },
                       {std::string(k.variable) + "='" + v + "' (expected " + k.expected + ")"});
  }
  PlanOverrides base;
  base.*k.field = 5;
  const test::ScopedEnv empty(k.variable, "");
  EXPECT_EQ(plan_overrides_from_env(base).*k.field, 5) << k.variable << " empty: the base's value";
}

INSTANTIATE_TEST_SUITE_P(EachVariable, PlanEnvInt, testing::ValuesIn(kIntKnobs),
                         [](const testing::TestParamInfo<IntKnob>& info) {
                           return std::string(info.param.variable).substr(7);  // (no MOEKIT_)
                         });

}  // namespace
}  // namespace moekit::plan
