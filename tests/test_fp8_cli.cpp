// The CLI on fp8 checkpoints: `moekit run --expert-dtype fp8` gives the in-process layer's output
// for each backend and mode, refuses what it cannot run with a message naming the option, and
// `moekit inspect --json` reports the quantisation and the fp8 bytes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fp8_test_util.h"
#include "io_test_util.h"
#include "moekit/cpu_fast.h"
#include "moekit/layer.h"
#include "moekit/safetensors.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
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

class Fp8Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
    dir_ = test::scratch_dir();
    std::ifstream in(std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/deepseek-v3.json");
    nlohmann::json c = nlohmann::json::parse(in);
    c["hidden_size"] = 200;
    c["moe_intermediate_size"] = 96;
    c["n_routed_experts"] = 16;
    cfg_ = dir_ + "/config.json";
    std::ofstream(cfg_) << c.dump();
    spec_ = load_spec(cfg_);
    test::write_fp8_checkpoint(spec_, 3, 5, false, dir_ + "/ckpt");
    x_ = test::random_input(tokens_, spec_.hidden, 3, 1.0f);
    write_safetensors(
        dir_ + "/x.safetensors",
        {{"x", {DType::BF16, {tokens_, spec_.hidden}, as_bytes_span(x_.data(), x_.size())}}});
  }
  std::string run_args(const std::string& extra) const {
    return "run --model " + cfg_ + " --weights " + dir_ + "/ckpt --layer 3 --device cpu --input " +
           dir_ + "/x.safetensors --output " + dir_ + "/out.safetensors " + extra;
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

TEST_F(Fp8Cli, RunMatchesTheLayerInProcess) {
  LoadOptions keep;
  keep.expert_format = ExpertFormat::Fp8Block;
  const auto w = load_checkpoint_weights(spec_, 3, dir_ + "/ckpt", keep);
  for (Fp8Compute mode : {Fp8Compute::W8A8, Fp8Compute::WeightOnly}) {
    const Cli r = run_cli(dir_, run_args("--expert-dtype fp8 --backend reference --fp8-compute " +
                                         std::string(fp8_compute_name(mode))));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("experts: fp8, computed ") + fp8_compute_name(mode)),
              std::string::npos)
        << r.out;
    EXPECT_EQ(output_y(), cpu_reference::forward(*w, x_.data(), tokens_, FuseShared::Auto, mode).y);
  }
  // The fast backend's default is weight-only; bf16 loading is the default expert dtype.
  const Cli fast = run_cli(dir_, run_args("--expert-dtype fp8"));
  ASSERT_EQ(fast.status, 0) << fast.err;
  const std::vector<float> fast_y = output_y();
  const Cli bf16 = run_cli(dir_, run_args(""));
  ASSERT_EQ(bf16.status, 0) << bf16.err;
  EXPECT_EQ(fast_y, output_y());
}

TEST_F(Fp8Cli, RefusesWhatItCannotRun) {
  Cli r = run_cli(dir_, run_args("--expert-dtype fp8 --fp8-compute w8a8"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("runs fp8 experts weight-only, not w8a8"), std::string::npos) << r.err;
  r = run_cli(dir_, run_args("--expert-dtype fp4"));
  EXPECT_NE(r.err.find("--expert-dtype 'fp4' is not one of bf16, fp8"), std::string::npos) << r.err;
  r = run_cli(dir_, run_args("--expert-dtype fp8 --backend reference --fp8-compute int8"));
  EXPECT_NE(r.err.find("unknown fp8 compute mode 'int8'"), std::string::npos) << r.err;
}

// Without --weights: the random weights quantised to fp8 (make_random_weights), both backends.
TEST_F(Fp8Cli, RunsRandomFp8Experts) {
  const auto w = make_random_weights(spec_, 3, 9, ExpertFormat::Fp8Block);
  for (const char* backend : {"reference", "fast"}) {
    SCOPED_TRACE(backend);
    const Cli r = run_cli(dir_, "run --model " + cfg_ + " --layer 3 --device cpu --seed 9 --input " +
                                    dir_ + "/x.safetensors --output " + dir_ +
                                    "/out.safetensors --expert-dtype fp8 --fp8-compute weight-only "
                                    "--backend " + backend);
    ASSERT_EQ(r.status, 0) << r.err;
    const ForwardResult want = std::string(backend) == "fast"
        ? cpu_fast::forward(*w, x_.data(), tokens_, FuseShared::Auto)
        : cpu_reference::forward(*w, x_.data(), tokens_, FuseShared::Auto,
                                 Fp8Compute::WeightOnly);
    EXPECT_EQ(output_y(), want.y);
  }
}

TEST_F(Fp8Cli, InspectReportsTheQuantisationAndFp8Bytes) {
  const Cli r = run_cli(dir_, "inspect --model deepseek-v3 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["quantization"]["kind"], "fp8-block");
  EXPECT_EQ(j["quantization"]["weight_block_size"], nlohmann::json({128, 128}));
  EXPECT_EQ(j["stored_expert_dtype"], "F8_E4M3");
  const MoeSpec s = load_spec("deepseek-v3");
  EXPECT_EQ(j["stored_bytes_per_expert"].get<double>(), double(s.fp8_expert_bytes()));
  EXPECT_EQ(j["stored_bytes_touched_per_token_per_layer"].get<double>(),
            double(s.fp8_expert_bytes() * 8 + s.fp8_shared_bytes() + s.router_bytes()));
  const Cli q = run_cli(dir_, "inspect --model qwen3-30b-a3b --json");
  const nlohmann::json k = nlohmann::json::parse(q.out);
  EXPECT_EQ(k["quantization"]["kind"], "none");
  EXPECT_EQ(k["stored_bytes_per_expert"].get<double>(), k["bytes_per_expert"].get<double>());
  const Cli text = run_cli(dir_, "inspect --model deepseek-v4-flash");
  EXPECT_NE(text.out.find("fp8 e4m3, 128x128 tiles, ue8m0 scales"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace moekit
