// The CLI on MX checkpoints: `moekit run --expert-dtype mxfp4 | mxfp8` gives the in-process
// layer's output on the MX-held weights (and the bf16 load's), refuses what it cannot run, and
// `moekit inspect` reports the MX quantisation and the packed bytes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io_test_util.h"
#include "moekit/layer.h"
#include "moekit/safetensors.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
#include "mx_test_util.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

struct Cli {
  int status = -1;
  std::string out, err;
};

Cli run_cli(const std::string& dir, const std::string& args) {
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  const std::string cmd = std::string(MOEKIT_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
  const int rc = std::system(cmd.c_str());
  Cli r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.out = test::read_file(out);
  r.err = test::read_file(err);
  return r;
}

struct Case {
  const char* name;
  ExpertFormat format;
  int layer;
};

class MxCli : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
    const Case c = GetParam();
    dir_ = test::scratch_dir();
    const std::string model = c.format == ExpertFormat::Mxfp4 ? "gpt-oss-120b" : "minimax-m3";
    std::ifstream in(std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/" + model + ".json");
    nlohmann::json top = nlohmann::json::parse(in);
    nlohmann::json& t = top.contains("text_config") ? top["text_config"] : top;
    t["hidden_size"] = 96;
    t["intermediate_size"] = 64;
    t["num_local_experts"] = 8;
    if (t.contains("shared_intermediate_size")) t["shared_intermediate_size"] = 64;
    if (c.format == ExpertFormat::Mxfp8) top["quantization_config"] = test::mxfp8_quant();
    cfg_ = dir_ + "/config.json";
    std::ofstream(cfg_) << top.dump();
    spec_ = load_spec(cfg_);
    test::write_mx_checkpoint(spec_, c.layer, 5, c.format, false, dir_ + "/ckpt");
    x_ = test::random_input(tokens_, spec_.hidden, 3, 1.0f);
    write_safetensors(
        dir_ + "/x.safetensors",
        {{"x", {DType::BF16, {tokens_, spec_.hidden}, as_bytes_span(x_.data(), x_.size())}}});
  }
  std::string run_args(const std::string& extra) const {
    return "run --model " + cfg_ + " --weights " + dir_ + "/ckpt --layer " +
           std::to_string(GetParam().layer) + " --device cpu --input " + dir_ +
           "/x.safetensors --output " + dir_ + "/out.safetensors " + extra;
  }
  std::vector<float> output_y() const {
    const SafetensorsFile f(dir_ + "/out.safetensors");
    const float* p = static_cast<const float*>(f.data("y"));
    return std::vector<float>(p, p + f.info("y").numel());
  }
  std::string dir_, cfg_;
  MoeSpec spec_;
  const int tokens_ = 3;
  std::vector<Bf16> x_;
};

TEST_P(MxCli, RunMatchesTheLayerInProcess) {
  const Case c = GetParam();
  const std::string name = expert_format_name(c.format);
  LoadOptions keep;
  keep.expert_format = c.format;
  const auto w = load_checkpoint_weights(spec_, c.layer, dir_ + "/ckpt", keep);
  const Cli ref = run_cli(dir_, run_args("--expert-dtype " + name + " --backend reference"));
  ASSERT_EQ(ref.status, 0) << ref.err;
  EXPECT_NE(ref.out.find("experts: " + name + ", computed W"), std::string::npos) << ref.out;
  EXPECT_EQ(output_y(), cpu_reference::forward(*w, x_.data(), tokens_, FuseShared::Auto).y);
  // the fast backend on the packed weights equals it on the bf16 load (the default)
  const Cli fast = run_cli(dir_, run_args("--expert-dtype " + name));
  ASSERT_EQ(fast.status, 0) << fast.err;
  const std::vector<float> fast_y = output_y();
  const Cli bf16 = run_cli(dir_, run_args(""));
  ASSERT_EQ(bf16.status, 0) << bf16.err;
  EXPECT_EQ(fast_y, output_y());
  const Cli j = run_cli(dir_, run_args("--expert-dtype " + name + " --json"));
  ASSERT_EQ(j.status, 0) << j.err;
  const nlohmann::json out = nlohmann::json::parse(j.out);
  EXPECT_EQ(out["expert_dtype"], name);
  EXPECT_EQ(out["mx_compute"], c.format == ExpertFormat::Mxfp4 ? "w4a16" : "w8a16");
}

// Without --weights: the random weights quantised to the format (make_random_weights).
TEST_P(MxCli, RunsRandomMxExperts) {
  const Case c = GetParam();
  const std::string name = expert_format_name(c.format);
  const auto w = make_random_weights(spec_, c.layer, 9, c.format);
  const Cli r = run_cli(dir_, "run --model " + cfg_ + " --layer " + std::to_string(c.layer) +
                                  " --device cpu --backend reference --seed 9 --input " + dir_ +
                                  "/x.safetensors --output " + dir_ +
                                  "/out.safetensors --expert-dtype " + name);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(output_y(), cpu_reference::forward(*w, x_.data(), tokens_, FuseShared::Auto).y);
}

TEST_P(MxCli, RefusesWhatItCannotRun) {
  const Cli r = run_cli(dir_, run_args("--expert-dtype nvfp4"));
  EXPECT_NE(r.err.find("--expert-dtype 'nvfp4' is not one of bf16, fp8, mxfp4, mxfp8"),
            std::string::npos)
      << r.err;
}

INSTANTIATE_TEST_SUITE_P(Formats, MxCli,
                         ::testing::Values(Case{"GptOssMxfp4", ExpertFormat::Mxfp4, 0},
                                           Case{"MiniMaxMxfp8", ExpertFormat::Mxfp8, 3}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(MxCliInspect, ReportsTheQuantisationAndPackedBytes) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const std::string dir = test::scratch_dir();
  const Cli r = run_cli(dir, "inspect --model gpt-oss-120b --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const MoeSpec s = load_spec("gpt-oss-120b");
  EXPECT_EQ(j["quantization"]["kind"], "mxfp4");
  EXPECT_EQ(j["quantization"]["weight_block_size"], nlohmann::json({1, 32}));
  EXPECT_EQ(j["quantization"]["element"], "e2m1");
  EXPECT_EQ(j["quantization"]["scale"], "e8m0");
  EXPECT_EQ(j["stored_expert_dtype"], "mxfp4");
  EXPECT_EQ(j["stored_bytes_per_expert"].get<double>(), double(s.mx_expert_bytes()));
  EXPECT_EQ(j["stored_bytes_touched_per_token_per_layer"].get<double>(),
            double(s.mx_expert_bytes() * s.top_k + s.router_bytes()));
  const Cli text = run_cli(dir, "inspect --model gpt-oss-120b");
  EXPECT_NE(text.out.find("mxfp4 (e2m1 experts, one e8m0 byte per 1x32), kept packed"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("bytes packed"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace moekit
