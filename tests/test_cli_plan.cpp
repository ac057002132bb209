// `moekit plan` and `moekit list-kernels` through the built CLI binary (MOEKIT_CLI_PATH): what a
// newcomer runs to learn which kernels a GPU forward launches, without a GPU.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "moekit/plan.h"
#include "moekit/spec.h"
#include "scoped_env.h"

namespace moekit {
namespace {

struct CliOutput {
  int status = -1;
  std::string out;
};

// Runs `moekit args` with the plan's MOEKIT_* variables unset (the defaults), capturing stdout.
CliOutput run_moekit(const std::string& args) {
  std::vector<std::unique_ptr<test::ScopedEnv>> cleared;
  for (const char* v : {"MOEKIT_EXPERTS_KERNEL",
                        "MOEKIT_EXPERTS_TAIL",
                        "MOEKIT_EXPERTS_SHARED_FIRST",
                        "MOEKIT_EXPERTS_WHOLE_TILES",
                        "MOEKIT_EXPERTS_DOWN_SPLIT",
                        "MOEKIT_EXPERTS_DOWN_DEEP",
                        "MOEKIT_EXPERTS_ONE_TOKEN_RING",
                        "MOEKIT_EXPERTS_L2_ACTS",
                        "MOEKIT_EXPERTS_L2_KEEP_FROM",
                        "MOEKIT_EXPERTS_DOWN_TAIL",
                        "MOEKIT_EXPERTS_HALF_ITEMS",
                        "MOEKIT_EXPERTS_SELF_ROUTE",
                        "MOEKIT_EXPERTS_TASK16",
                        "MOEKIT_SHARED_DENSE",
                        "MOEKIT_PDL",
                        "MOEKIT_PRINT_CONFIG",
                        "MOEKIT_FUSE_SHARED_EXPERTS",
                        "MOEKIT_EXPERTS_GROUPED_FROM",
                        "MOEKIT_EXPERTS_GROUPED_GEMM",
                        "MOEKIT_EXPERTS_MX_CHUNK",
                        "MOEKIT_EXPERTS_MX_GEMM"}) {
    cleared.push_back(std::make_unique<test::ScopedEnv>(v, nullptr));
  }
  CliOutput r;
  const std::string cmd = std::string(MOEKIT_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, n);
  const int rc = pclose(pipe);
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  return r;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

#define SKIP_WITHOUT_CLI() \
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built"

// DeepSeek-V3 at 32 tokens: the plan's text as plan::describe prints it, with the kernels the
// golden table holds for it (tests/plan/golden_sm90.txt).
TEST(CliPlan, DeepSeekV3At32TokensPrintsItsKernelLines) {
  SKIP_WITHOUT_CLI();
  const CliOutput r = run_moekit("plan --model deepseek-v3 --batch 32");
  ASSERT_EQ(r.status, 0) << r.out;
  const plan::LayerPlan p = plan::plan_layer(load_spec("deepseek-v3"), 32, FuseShared::Auto, {},
                                             plan::device_profile("sm90"));
  EXPECT_EQ(r.out, plan::describe(p));
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 4u) << r.out;
  EXPECT_EQ(lines[0].rfind("deepseek-v3 T=32 sm90: unfused", 0), 0u) << lines[0];
  const std::vector<std::string> kernels = {
      "  gate/up  bulk_gate_up_weights_only_l2_keep grid 132",
      "  down     bulk_down_weights_only_l2_keep_tail grid 132"};
  for (const std::string& k : kernels) {
    bool seen = false;
    for (const std::string& l : lines) seen |= l.rfind(k, 0) == 0;
    EXPECT_TRUE(seen) << "no line starting '" << k << "' in:\n" << r.out;
  }
  bool dense = false;
  for (const std::string& l : lines) dense |= l.rfind("  shared   dense cuBLAS", 0) == 0;
  EXPECT_TRUE(dense) << "the unfused shared MLP as dense GEMMs at 32 tokens:\n" << r.out;
}

TEST(CliPlan, JsonNamesTheSameKernelsPerBatch) {
  SKIP_WITHOUT_CLI();
  const CliOutput r = run_moekit("plan --model qwen3-30b-a3b --batch 1,300 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  const MoeSpec spec = load_spec("qwen3-30b-a3b");
  for (size_t i = 0; i < 2; ++i) {
    const int t = i == 0 ? 1 : 300;
    const plan::LayerPlan p =
        plan::plan_layer(spec, t, FuseShared::Auto, {}, plan::device_profile("sm90"));
    EXPECT_EQ(j[i]["tokens"], t);
    ASSERT_EQ(j[i]["experts"].size(), p.experts.size()) << "T=" << t;
    for (size_t e = 0; e < p.experts.size(); ++e) {
      EXPECT_EQ(j[i]["experts"][e]["kernel"], plan::expert_kernels()[p.experts[e].kernel].name)
          << "T=" << t << " launch " << e;
    }
  }
  EXPECT_EQ(j[0]["routing_kernel"], false) << "one token: the gate/up kernel routes it itself";
}

TEST(CliListKernels, ListsEveryInstanceOfBothTables) {
  SKIP_WITHOUT_CLI();
  const CliOutput r = run_moekit("list-kernels");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> lines = lines_of(r.out);
  const auto kernels = plan::expert_kernels();
  const auto grouped = plan::grouped_gemm_kernels();
  ASSERT_EQ(kernels.size(), 52u);
  ASSERT_EQ(lines.size(), kernels.size() + grouped.size()) << r.out;
  for (size_t i = 0; i < kernels.size(); ++i) EXPECT_EQ(lines[i], plan::describe(kernels[i]));
  for (size_t i = 0; i < grouped.size(); ++i) {
    EXPECT_EQ(lines[kernels.size() + i], plan::describe(grouped[i]));
  }
  const CliOutput js = run_moekit("list-kernels --json");
  ASSERT_EQ(js.status, 0) << js.out;
  const nlohmann::json j = nlohmann::json::parse(js.out);
  ASSERT_EQ(j.size(), kernels.size() + grouped.size());
  for (size_t i = 0; i < kernels.size(); ++i) EXPECT_EQ(j[i]["name"], kernels[i].name);
  for (size_t i = 0; i < grouped.size(); ++i) {
    const nlohmann::json& g = j[kernels.size() + i];
    EXPECT_EQ(g["name"], grouped[i].name);
    EXPECT_EQ(g["stream"], "grouped");
    EXPECT_EQ(g["tile_m"], grouped[i].tile_m);
  }
}

// `bench grouped-gemm` names what it cannot run before it looks for a GPU.
TEST(CliBenchGroupedGemm, BadInstancesAndDtypesAreNamed) {
  SKIP_WITHOUT_CLI();
  const CliOutput unknown =
      run_moekit("bench grouped-gemm --model deepseek-v3 --kernels grouped_bf16_96x256_coop");
  EXPECT_NE(unknown.status, 0);
  EXPECT_NE(unknown.out.find("--kernels names 'grouped_bf16_96x256_coop', not an instance"),
            std::string::npos)
      << unknown.out;
  const CliOutput wrong_dtype = run_moekit(
      "bench grouped-gemm --model deepseek-v3 --dtype fp8 --kernels grouped_bf16_128x256_coop");
  EXPECT_NE(wrong_dtype.status, 0);
  EXPECT_NE(wrong_dtype.out.find("grouped_bf16_128x256_coop, not a fp8 instance"),
            std::string::npos)
      << wrong_dtype.out;
  const CliOutput dtype = run_moekit("bench grouped-gemm --model deepseek-v3 --dtype fp4");
  EXPECT_NE(dtype.status, 0);
  EXPECT_NE(dtype.out.find("fp4 not in {bf16,fp8}"), std::string::npos) << dtype.out;
}

// --dtype mxfp4 / mxfp8: the MX plans, the MX instances (MiniMax-M3's shared expert fused) at
// decode batches, the MX prefill path at 1024 tokens.
TEST(CliPlan, MxPlansRunTheMxInstances) {
  SKIP_WITHOUT_CLI();
  for (const auto& [model, dtype, fmt] : {std::tuple{"gpt-oss-120b", "mxfp4", ExpertFormat::Mxfp4},
                                          std::tuple{"minimax-m3", "mxfp8", ExpertFormat::Mxfp8}}) {
    const CliOutput r =
        run_moekit(std::string("plan --model ") + model + " --batch 32 --dtype " + dtype);
    ASSERT_EQ(r.status, 0) << r.out;
    const plan::LayerPlan p = plan::plan_layer(load_spec(model), 32, FuseShared::Auto, {},
                                               plan::device_profile("sm90"), DType::BF16, fmt);
    EXPECT_EQ(r.out, plan::describe(p));
    EXPECT_NE(r.out.find(std::string("bulk_gate_up_") + dtype), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string("bulk_down_") + dtype), std::string::npos) << r.out;
  }
  // at 1024 tokens (32 routed per expert) the MX prefill path on the packed GEMM; at 8192 (256)
  // in runs of widened experts
  const CliOutput r = run_moekit("plan --model gpt-oss-120b --batch 1024 --dtype mxfp4");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("grouped, mxfp4 w4a16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("packed   mxfp4 GEMMs on the packed bytes, tiles of 64"), std::string::npos)
      << r.out;
  const CliOutput wide = run_moekit("plan --model gpt-oss-120b --batch 8192 --dtype mxfp4");
  ASSERT_EQ(wide.status, 0) << wide.out;
  EXPECT_NE(wide.out.find("widen    mxfp4 experts to bf16, 16 at a time (8 runs"),
            std::string::npos)
      << wide.out;
}

// --dtype fp8: DeepSeek-V3's fp8 plan, the fp8 instances, the shared expert fused.
TEST(CliPlan, Fp8PlanRunsTheFp8Instances) {
  SKIP_WITHOUT_CLI();
  const CliOutput r = run_moekit("plan --model deepseek-v3 --batch 32 --dtype fp8");
  ASSERT_EQ(r.status, 0) << r.out;
  const plan::LayerPlan p = plan::plan_layer(load_spec("deepseek-v3"), 32, FuseShared::Auto, {},
                                             plan::device_profile("sm90"), DType::F8_E4M3);
  EXPECT_EQ(r.out, plan::describe(p));
  EXPECT_NE(r.out.find("deepseek-v3 T=32 sm90: fused"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp8 w8a8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bulk_gate_up_weights_only_fp8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bulk_down_weights_only_tail_fp8"), std::string::npos) << r.out;
  const CliOutput bad = run_moekit("plan --model deepseek-v3 --dtype fp4");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("plan: --dtype 'fp4' is not one of bf16, fp8, mxfp4, mxfp8, config"),
            std::string::npos)
      << bad.out;
}

TEST(CliPlan, UnknownDeviceProfileIsNamed) {
  SKIP_WITHOUT_CLI();
  const CliOutput r = run_moekit("plan --model deepseek-v3 --device-info sm80");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("unknown device profile 'sm80' (expected sm90, h100 or sm100)"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace moekit
