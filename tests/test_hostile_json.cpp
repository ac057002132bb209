// Hostile JSON (issue 35): nesting deep enough to overflow a recursive formatter, duplicate keys,
// integers beyond their target type, floats beyond float, control characters in quoted values;
// for every parser: config, safetensors header, sharded index, tuning file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/json_safe.h"
#include "common/text_escape.h"
#include "expect_error.h"
#include "hostile_util.h"
#include "io/checkpoint_dir.h"
#include "moekit/safetensors.h"
#include "moekit/spec.h"
#include "moekit/tuning.h"

namespace moekit {
namespace {

using nlohmann::json;
using test::expect_error;
using test::nested_array;
using test::scratch_dir;

// The probe that crashed: 60 000 levels, about 120 kB.
constexpr int kDeep = 60000;

TEST(HostileJson, EscapeTextEscapesControlsAndCuts) {
  EXPECT_EQ(escape_text("plain name.weight"), "plain name.weight");
  EXPECT_EQ(escape_text("a\x1b[31mb\n\t\x7f"), "a\\x1b[31mb\\n\\t\\x7f");
  EXPECT_EQ(escape_text("caf\xc3\xa9"), "caf\xc3\xa9");       // valid UTF-8 passes
  EXPECT_EQ(escape_text("\xc2\x9b" "2J"), "\\xc2\\x9b2J");    // C1 CSI is escaped
  EXPECT_EQ(escape_text("\xff\xfe"), "\\xff\\xfe");            // not UTF-8
  EXPECT_EQ(escape_text(std::string(300, 'x'), 10), "xxxxxxxxxx...(300 bytes)");
  EXPECT_EQ(escape_text("a\nb", 100, true), "a\nb");
}

TEST(HostileJson, DescribeIsBoundedAndOneLevelDeep) {
  EXPECT_EQ(describe_json(json(7168)), "7168");
  EXPECT_EQ(describe_json(json("7168")), "\"7168\"");
  EXPECT_EQ(describe_json(json::parse(R"([1, [2, [3]], {"a": 1}, "x", 5])")),
            "array of 5 [1, [...], {...}, \"x\", ...]");
  EXPECT_EQ(describe_json(json::parse(R"({"a": 1, "b": {"c": 2}})")),
            "object of 2 {\"a\": 1, \"b\": {...}}");
  const std::string long_string(100000, 'y');
  EXPECT_LT(describe_json(json(long_string)).size(), 100u);
  EXPECT_EQ(describe_json(json("\x1b]0;pwned\x07")), "\"\\x1b]0;pwned\\x07\"");
  // 60 levels (within the parse limit): still one level shown.
  EXPECT_EQ(describe_json(json::parse(nested_array(60))), "array of 1 [[...]]");
}

TEST(HostileJson, NestingLimitNamesTheByte) {
  expect_error([] { parse_json_bounded(nested_array(kDeep), "input x"); },
               {"input x: JSON nested deeper than 64 levels (at byte 64)"});
  // Brackets inside strings do not count; 64 levels are fine.
  EXPECT_NO_THROW(parse_json_bounded("{\"k\": \"" + std::string(1000, '[') + "\"}", "s"));
  EXPECT_NO_THROW(parse_json_bounded(nested_array(64), "s"));
  expect_error([] { parse_json_bounded(R"({"a": 1, "b": 2, "a": 3})", "in", {64, true}); },
               {"in: duplicate key \"a\" in one JSON object"});
  EXPECT_NO_THROW(parse_json_bounded(R"({"a": {"a": 1}, "b": {"a": 2}})", "in", {64, true}));
}

TEST(HostileJson, ConfigKeyNestedDeep) {
  json c = test::model_config("deepseek-v3");
  std::string text = c.dump();
  text.insert(1, "\"hidden_size\": " + nested_array(kDeep) + ", ");
  expect_error([&] { parse_spec_json(text, "deep"); },
               {"config 'deep': JSON nested deeper than 64 levels"});
  // Within the limit the value is quoted, not dumped.
  c["hidden_size"] = json::parse(nested_array(40));
  expect_error([&] { parse_spec_json(c.dump(), "d"); },
               {"key 'hidden_size' must be an integer, got array of 1 [[...]]"});
}

TEST(HostileJson, ConfigIntegersBeyondInt) {
  for (const char* key : {"n_group", "topk_group", "num_hash_layers"}) {
    json c = test::model_config("deepseek-v3");
    c[key] = 4294967297ull;  // 2^32 + 1: a static_cast<int> made it 1
    expect_error([&] { parse_spec_json(c.dump(), "big"); },
                 {std::string("key '") + key + "' = 4294967297 does not fit in a 32-bit int"});
  }
  json c = test::model_config("deepseek-v3");
  c["hidden_size"] = 18446744073709551615ull;
  expect_error([&] { parse_spec_json(c.dump(), "big"); },
               {"'hidden_size' = 18446744073709551615 does not fit in a 64-bit integer"});
}

TEST(HostileJson, ConfigFloatsBeyondFloat) {
  json c = test::model_config("minimax-m2");
  c["swiglu_beta"] = 1e300;
  expect_error([&] { parse_spec_json(c.dump(), "f"); },
               {"key 'swiglu_beta' = 1e+300 is outside the range of a 32-bit float"});
  c = test::model_config("deepseek-v3");
  c["routed_scaling_factor"] = -1e39;
  expect_error([&] { parse_spec_json(c.dump(), "f"); }, {"'routed_scaling_factor'", "float"});
  MoeSpec s = parse_spec_json(test::model_config("gpt-oss-120b").dump(), "g");
  s.swiglu_alpha = NAN;  // API users set fields directly
  expect_error([&] { validate_spec(s); }, {"swiglu_alpha and swiglu_beta must be finite"});
}

TEST(HostileJson, SafetensorsHeaderNestedDeep) {
  const std::string dir = scratch_dir();
  for (const std::string& where :
       {std::string("shape"), std::string("data_offsets"), std::string("__metadata__")}) {
    const std::string path = dir + "/" + where + ".safetensors";
    const std::string header =
        where == "__metadata__"
            ? "{\"__metadata__\": {\"k\": " + nested_array(kDeep) + "}}"
            : "{\"w\": {\"dtype\": \"F32\", \"" + where + "\": " + nested_array(kDeep) + "}}";
    test::write_raw_safetensors(path, header, "");
    expect_error([&] { SafetensorsFile f(path); },
                 {"invalid JSON header", "nested deeper than 64 levels"});
  }
  // Within the limit: quoted one level deep.
  const std::string path = dir + "/shallow.safetensors";
  test::write_raw_safetensors(
      path, R"({"w": {"dtype": "F32", "shape": [[[[1]]]], "data_offsets": [0, 4]}})", "abcd");
  expect_error([&] { SafetensorsFile f(path); },
               {"expected non-negative integer dimensions, got shape array of 1 [[...]]"});
}

TEST(HostileJson, SafetensorsDuplicateTensorName) {
  const std::string path = scratch_dir() + "/dup.safetensors";
  test::write_raw_safetensors(path,
                              R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                              R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                              std::string(8, '\0'));
  expect_error([&] { SafetensorsFile f(path); }, {"duplicate key \"w\""});
}

TEST(HostileJson, IndexNestedDeepAndDuplicated) {
  const std::string dir = scratch_dir();
  test::write_file(dir + "/model.safetensors.index.json",
                   "{\"weight_map\": {\"a\": " + nested_array(kDeep) + "}}");
  expect_error([&] { io::CheckpointDir d(dir); },
               {"model.safetensors.index.json: JSON nested deeper than 64 levels"});
  test::write_file(dir + "/model.safetensors.index.json",
                   R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})");
  expect_error([&] { io::CheckpointDir d(dir); }, {"duplicate key \"a\""});
  test::write_file(dir + "/model.safetensors.index.json",
                   R"({"weight_map": {"a": [1, 2, 3]}})");
  expect_error([&] { io::CheckpointDir d(dir); },
               {"weight_map['a'] must be a file name, got array of 3 [1, 2, 3]"});
}

TEST(HostileJson, TuningFileNestedDeepAndIntegersBeyondInt) {
  expect_error([] { tuning::parse_tuning_json("{\"rows\": " + nested_array(kDeep) + "}", "t.json"); },
               {"tuning file t.json: JSON nested deeper than 64 levels"});
  for (const char* key : {"k", "n"}) {
    json row = {{"dtype", "BF16"}, {"backend", "cublas"}, {"k", 7168}, {"n", 256},
                {"m_min", 1},      {"m_max", 8}};
    row[key] = 4294967301ull;  // 2^32 + 5: get<int>() made it 5
    const std::string text = json{{"rows", {row}}}.dump();
    expect_error([&] { tuning::parse_tuning_json(text, "t.json"); },
                 {"row 0", std::string("\"") + key + "\" as an integer in the range of int",
                  "4294967301"});
  }
}

}  // namespace
}  // namespace moekit
