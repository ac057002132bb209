// `moekit run --input x.safetensors --output out.safetensors` (tools/moekit/run_io.cpp): the
// built CLI binary runs on a file written here, and its output file, read back with moekit's
// safetensors reader, matches the same layer run in process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.h"
#include "io_test_util.h"
#include "moekit/layer.h"
#include "moekit/safetensors.h"
#include "moekit/spec.h"
#include "moekit/weights.h"
#include "shrunk_spec.h"

namespace moekit {
namespace {

using ::testing::HasSubstr;

struct Cli {
  int status = -1;
  std::string err;
};

Cli run_cli(const std::string& dir, const std::string& args) {
  const std::string err = dir + "/stderr.txt";
  const std::string cmd = std::string(MOEKIT_CLI_PATH) + " " + args + " >/dev/null 2>" + err;
  const int rc = std::system(cmd.c_str());
  Cli r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.err = test::read_file(err);
  return r;
}

// configs/<model>.json shrunk to H = 64, I = 32, E = 16, written to dir; returns its path.
std::string small_config(const std::string& dir, const std::string& model) {
  std::ifstream in(std::string(MOEKIT_TEST_DATA_DIR) + "/../configs/" + model + ".json");
  nlohmann::json top = nlohmann::json::parse(in);
  nlohmann::json& c = top.contains("text_config") ? top["text_config"] : top;
  c["hidden_size"] = 64;
  c[c.contains("moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size"] = 32;
  for (const char* k : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (c.contains(k)) c[k] = 16;
  if (c.contains("shared_expert_intermediate_size")) c["shared_expert_intermediate_size"] = 64;
  const std::string path = dir + "/" + model + "-small.json";
  std::ofstream(path) << top.dump();
  return path;
}

template <typename T>
std::vector<T> tensor(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensorInfo& info = f.info(name);
  std::vector<T> v(info.nbytes() / sizeof(T));
  std::memcpy(v.data(), f.raw_data(name), info.nbytes());
  return v;
}

std::vector<int64_t> dims(std::initializer_list<int64_t> d) { return d; }

class CliIo : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  }
};

// Input in bf16: the CLI's reference forward equals the in-process one bit for bit; the topk ids
// are int32, the weights the routed ones (the first k slots), the logits the reference router's.
TEST_P(CliIo, OutputFileMatchesTheLayerRunInProcess) {
  const std::string model = GetParam();
  const std::string dir = test::scratch_dir("_" + model);
  const std::string cfg = small_config(dir, model);
  const MoeSpec spec = load_spec(cfg);
  const int tokens = 5, seed = 11;
  const std::vector<Bf16> x = test::random_input(tokens, spec.hidden, 2, 1.0f);
  write_safetensors(
      dir + "/x.safetensors",
      {{"x", {DType::BF16, {tokens, spec.hidden}, as_bytes_span(x.data(), x.size())}}});
  const Cli r = run_cli(dir, "run --model " + cfg + " --input " + dir + "/x.safetensors --output " +
                                 dir + "/out.safetensors --device cpu --backend reference --seed " +
                                 std::to_string(seed));
  ASSERT_EQ(r.status, 0) << r.err;

  const auto w = make_random_weights(spec, spec.moe_layers.front(), seed);
  const ForwardResult want = cpu_reference::forward(*w, x.data(), tokens, FuseShared::Auto);
  const std::vector<float> logits = cpu_reference::router_logits(*w, x.data(), tokens);
  const SafetensorsFile out(dir + "/out.safetensors");
  EXPECT_EQ(out.names(),
            (std::vector<std::string>{"router_logits", "topk_ids", "topk_weights", "y"}));
  EXPECT_EQ(out.info("y").dtype_name, "F32");
  EXPECT_EQ(out.shape("y"), dims({tokens, spec.hidden}));
  EXPECT_EQ(out.info("topk_ids").dtype_name, "I32");
  EXPECT_EQ(out.shape("topk_ids"), dims({tokens, spec.top_k}));
  EXPECT_EQ(out.info("topk_weights").dtype_name, "F32");
  EXPECT_EQ(out.shape("topk_weights"), dims({tokens, spec.top_k}));
  EXPECT_EQ(out.shape("router_logits"), dims({tokens, spec.router_columns()}));
  EXPECT_EQ(out.metadata().at("model"), cfg);

  EXPECT_EQ(tensor<float>(out, "y"), want.y);
  EXPECT_EQ(tensor<float>(out, "router_logits"), logits);
  const auto ids = tensor<int32_t>(out, "topk_ids");
  const auto wts = tensor<float>(out, "topk_weights");
  const int slots = want.routing.slots, k = spec.top_k;
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(ids[t * k + j], want.routing.ids[t * slots + j]) << "token " << t << " slot " << j;
      EXPECT_EQ(wts[t * k + j], want.routing.weights[t * slots + j]) << "token " << t;
      EXPECT_LT(ids[t * k + j], spec.num_experts);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CliIo,
                         ::testing::Values("deepseek-v3", "qwen2-57b-a14b", "gpt-oss-120b",
                                           "mixtral-8x7b"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-' || c == '.') c = '_';
                           return n;
                         });

// An f32 input of bf16-representable values gives the bf16 run's outputs; the fast backend's
// output is within its tolerance of the reference.
TEST(CliIoInput, F32InputAndFastBackend) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const std::string dir = test::scratch_dir();
  const std::string cfg = small_config(dir, "qwen3-30b-a3b");
  const MoeSpec spec = load_spec(cfg);
  const int tokens = 7;
  const std::vector<Bf16> xb = test::random_input(tokens, spec.hidden, 4, 1.0f);
  std::vector<float> xf(xb.size());
  for (size_t i = 0; i < xb.size(); ++i) xf[i] = bf16_to_float(xb[i]);
  // Any single tensor name is taken as x.
  write_safetensors(
      dir + "/xb.safetensors",
      {{"x", {DType::BF16, {tokens, spec.hidden}, as_bytes_span(xb.data(), xb.size())}}});
  write_safetensors(dir + "/xf.safetensors",
                    {{"hidden_states",
                      {DType::F32, {tokens, spec.hidden}, as_bytes_span(xf.data(), xf.size())}}});
  const std::string common = "run --model " + cfg + " --device cpu --seed 3 --tokens 2 ";
  ASSERT_EQ(run_cli(dir, common + "--backend reference --input " + dir +
                             "/xb.safetensors --output " + dir + "/ob.safetensors")
                .status,
            0);
  ASSERT_EQ(run_cli(dir, common + "--backend reference --input " + dir +
                             "/xf.safetensors --output " + dir + "/of.safetensors")
                .status,
            0);
  ASSERT_EQ(run_cli(dir, common + "--backend fast --input " + dir + "/xb.safetensors --output " +
                             dir + "/fast.safetensors")
                .status,
            0);
  const SafetensorsFile ob(dir + "/ob.safetensors"), of(dir + "/of.safetensors"),
      fast(dir + "/fast.safetensors");
  EXPECT_EQ(ob.shape("y"), dims({tokens, spec.hidden}));  // the file's T, not --tokens 2
  EXPECT_EQ(tensor<float>(of, "y"), tensor<float>(ob, "y"));
  EXPECT_EQ(tensor<int32_t>(of, "topk_ids"), tensor<int32_t>(ob, "topk_ids"));
  EXPECT_EQ(tensor<int32_t>(fast, "topk_ids"), tensor<int32_t>(ob, "topk_ids"));
  const auto yr = tensor<float>(ob, "y"), yf = tensor<float>(fast, "y");
  double scale = 0, diff = 0;
  for (size_t i = 0; i < yr.size(); ++i) {
    scale = std::fmax(scale, std::fabs(yr[i]));
    diff = std::fmax(diff, std::fabs(yr[i] - yf[i]));
  }
  EXPECT_LT(diff, 2e-2 * scale);
}

// The writer's integer tensors (the CLI's topk_ids): dtype, alignment order and errors.
TEST(CliIoInput, IntegerTensorsWriteAndReadBack) {
  const std::string dir = test::scratch_dir();
  const std::vector<int32_t> ids = {3, -1, 7, 2147483647};
  const std::vector<int64_t> wide = {1LL << 40, -5};
  const std::vector<uint16_t> half = {1, 2, 3};
  write_safetensors(dir + "/i.safetensors",
                    {{"ids", {DType::F32, {2, 2}, as_bytes_span(ids.data(), ids.size())}},
                     {"wide", {DType::F32, {2}, as_bytes_span(wide.data(), wide.size())}},
                     {"h", {DType::BF16, {3}, as_bytes_span(half.data(), half.size())}}},
                    {}, {{"ids", "I32"}, {"wide", "I64"}});
  const SafetensorsFile f(dir + "/i.safetensors");
  EXPECT_EQ(f.info("ids").dtype_name, "I32");
  EXPECT_EQ(f.info("wide").dtype_name, "I64");
  EXPECT_EQ(f.info("h").dtype_name, "BF16");
  EXPECT_EQ(tensor<int32_t>(f, "ids"), ids);
  EXPECT_EQ(tensor<int64_t>(f, "wide"), wide);
  EXPECT_EQ(f.info("wide").begin, 0u);  // 8-byte elements first, so every tensor is aligned
  test::expect_error(
      [&] {
        write_safetensors(dir + "/bad.safetensors",
                          {{"ids", {DType::F32, {4}, as_bytes_span(ids.data(), ids.size())}}}, {},
                          {{"ids", "I33"}});
      },
      {"tensor 'ids'", "unknown integer dtype 'I33'"});
  test::expect_error(
      [&] {
        write_safetensors(dir + "/bad.safetensors",
                          {{"ids", {DType::F32, {4}, as_bytes_span(ids.data(), ids.size())}}}, {},
                          {{"idz", "I32"}});
      },
      {"integer dtype given for tensor 'idz', which is not written"});
  test::expect_error(
      [&] {
        write_safetensors(dir + "/bad.safetensors",
                          {{"wide", {DType::F32, {3}, as_bytes_span(wide.data(), wide.size())}}},
                          {}, {{"wide", "I64"}});
      },
      {"tensor 'wide'", "of I64 needs 24 bytes, got 16"});
}

TEST(CliIoInput, BadInputFilesNameTheProblem) {
  if (std::string(MOEKIT_CLI_PATH).empty()) GTEST_SKIP() << "the moekit CLI is not built";
  const std::string dir = test::scratch_dir();
  const std::string cfg = small_config(dir, "mixtral-8x7b");
  std::vector<float> v(3 * 65, 0.5f);
  std::vector<uint16_t> h(3 * 64, 0);
  write_safetensors(dir + "/wide.safetensors",
                    {{"x", {DType::F32, {3, 65}, as_bytes_span(v.data(), v.size())}}});
  write_safetensors(dir + "/f16.safetensors",
                    {{"x", {DType::F16, {3, 64}, as_bytes_span(h.data(), h.size())}}});
  write_safetensors(dir + "/two.safetensors",
                    {{"a", {DType::F32, {3, 65}, as_bytes_span(v.data(), v.size())}},
                     {"b", {DType::F32, {3, 65}, as_bytes_span(v.data(), v.size())}}});
  const std::string run = "run --model " + cfg + " --device cpu --input " + dir;
  Cli r = run_cli(dir, run + "/wide.safetensors");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("tensor 'x' must have shape [tokens, 64]"));
  EXPECT_THAT(r.err, HasSubstr("width 65"));
  r = run_cli(dir, run + "/f16.safetensors");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("tensor 'x' must be BF16 or F32, got F16"));
  r = run_cli(dir, run + "/two.safetensors");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("no tensor 'x' and several tensors: 'a', 'b'"));
  r = run_cli(dir, run + "/missing.safetensors");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("missing.safetensors"));
}

}  // namespace
}  // namespace moekit
