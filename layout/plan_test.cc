// Tests of the plan tool: spec parsing, flag handling with exact error messages, the JSON it
// prints, the exit-code mapping, and the binary itself (exit code 2 and stderr on bad input).
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "layout/plan.h"
#include "layout/spec.h"

namespace orthoshard::layout {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kGoodSpec[] = R"({"params": [
  {"name": "embedding", "shape": [1000, 64], "dtype": "bf16", "role": "adam",
   "shared_embedding": true},
  {"name": "layers.0.qkv", "shape": [192, 64], "dtype": "bf16", "role": "muon"},
  {"name": "layers.0.norm", "shape": [64], "role": "adam"},
  {"name": "layers.0.expert0", "shape": [128, 64], "role": "muon", "expert": true},
  {"name": "layers.0.fc2", "shape": ["64", 333], "dtype": "fp32", "role": "muon",
   "expert": false, "shared_embedding": false}]})";

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << text;
  return path;
}

google::protobuf::Struct ParseJson(const std::string& json) {
  google::protobuf::Struct doc;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &doc).ok()) << json;
  return doc;
}

TEST(SpecTest, ParsesEveryField) {
  ASSERT_OK_AND_ASSIGN(std::vector<ParamSpec> params, ParseModelSpecJson(kGoodSpec));
  ASSERT_EQ(params.size(), 5u);
  EXPECT_TRUE(params[0].shared_embedding);
  EXPECT_EQ(params[0].role, ParamRole::kAdam);
  EXPECT_EQ(params[1].role, ParamRole::kMuon);
  EXPECT_EQ(params[1].shape, (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(params[2].dtype, DType::kBFloat16);
  EXPECT_TRUE(params[3].expert);
  EXPECT_EQ(params[4].dtype, DType::kFloat32);
  EXPECT_EQ(params[4].shape, (std::vector<int64_t>{64, 333}));
}

TEST(SpecTest, RejectsBadEntriesNamingThem) {
  EXPECT_THAT(ParseModelSpecJson(R"({"params": [{"name": "a", "shape": [2], "role": "sgd"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "params[0] ('a'): role 'sgd' is unknown; expected muon or adam"));
  EXPECT_THAT(
      ParseModelSpecJson(
          R"({"params": [{"name": "a", "shape": [2]}, {"name": "b", "shape": [2], "dtype": "fp8"}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "params[1] ('b'): dtype 'fp8' is unknown; expected e.g. bf16, fp16, fp32"));
  EXPECT_THAT(ParseModelSpecJson(R"({"params": []})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "model spec: \"params\" is empty; expected at least one param"));
  EXPECT_THAT(ParseModelSpecJson(R"({"params": [{"name": "a", "shape": [2], "size": 3}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model spec is not valid JSON for {\"params\": [...]}")));
  EXPECT_THAT(ParseModelSpecJson("{\"params\": ["),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
  EXPECT_THAT(ParseModelSpecJson(R"({"params": [{"name": "a", "shape": ["x"]}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
}

TEST(PlanTest, PlansSpecFileAsJson) {
  PlanRequest request;
  request.model = WriteTemp("good.json", kGoodSpec);
  request.dp = 2;
  request.expert_dp = 1;
  request.bucket_size = "none";
  ASSERT_OK_AND_ASSIGN(std::string json, RunPlan(request));
  const google::protobuf::Struct doc = ParseJson(json);
  EXPECT_EQ(doc.fields().at("strategy").string_value(), "layerwise");
  EXPECT_EQ(doc.fields().at("dp").number_value(), 2);
  EXPECT_EQ(doc.fields().at("expert_dp").number_value(), 1);
  EXPECT_TRUE(doc.fields().at("bucket_size").has_null_value());
  const auto& buffers = doc.fields().at("buffers").list_value().values();
  // fp32 dense layerwise, bf16 dense distopt, bf16 dense layerwise, bf16 expert layerwise.
  ASSERT_EQ(buffers.size(), 4);
  int params = 0;
  for (const auto& buffer : buffers) {
    const auto& f = buffer.struct_value().fields();
    EXPECT_TRUE(f.at("key").struct_value().fields().count("param_dtype"));
    EXPECT_FALSE(f.at("buckets").list_value().values().empty());
    for (const auto& bucket : f.at("buckets").list_value().values()) {
      for (const char* field : {"start", "end", "shard_size"}) {
        EXPECT_TRUE(bucket.struct_value().fields().count(field)) << field;
      }
    }
    for (const auto& p : f.at("params").list_value().values()) {
      ++params;
      for (const char* field : {"name", "start", "end", "bucket", "owner"}) {
        EXPECT_TRUE(p.struct_value().fields().count(field)) << field;
      }
    }
    const auto& m = f.at("metrics").struct_value().fields();
    for (const char* field : {"padding_fraction", "buckets", "ns_cost_imbalance",
                              "bucket_ns_cost_imbalance", "numel_imbalance", "rank_numel"}) {
      EXPECT_TRUE(m.count(field)) << field;
    }
    EXPECT_EQ(m.at("rank_numel").list_value().values_size(),
              f.at("dp").number_value());
  }
  EXPECT_EQ(params, 5);
  EXPECT_THAT(json, HasSubstr("\"name\": \"bf16/fp32/expert/layerwise\""));
}

// The `small` GPT's Muon matrices at dp 2: 2 buckets at the default tolerance, one per layer with
// --min_buckets=4 (the tolerance doubled to 3.2%), --target_buckets below, and the options echoed
// in the JSON.
TEST(PlanTest, BucketCountFlagsReachTheLayout) {
  std::string spec = R"({"params": [)";
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&spec, i ? "," : "", R"({"name": "l)", i, R"(.qkv", "shape": [384, 256], "role": "muon"},)",
                    R"({"name": "l)", i, R"(.proj", "shape": [256, 256], "role": "muon"},)",
                    R"({"name": "l)", i, R"(.fc1", "shape": [1408, 256], "role": "muon"},)",
                    R"({"name": "l)", i, R"(.fc2", "shape": [256, 704], "role": "muon"})");
  }
  spec += "]}";
  PlanRequest request;
  request.model = WriteTemp("small.json", spec);
  request.dp = 2;
  request.bucket_size = "65536";
  auto buckets = [](const std::string& json) {
    const google::protobuf::Struct doc = ParseJson(json);
    return doc.fields().at("buffers").list_value().values(0).struct_value().fields().at(
        "buckets").list_value().values_size();
  };
  ASSERT_OK_AND_ASSIGN(std::string tight, RunPlan(request));
  EXPECT_EQ(buckets(tight), 2);
  request.min_buckets = 4;
  ASSERT_OK_AND_ASSIGN(std::string raised, RunPlan(request));
  EXPECT_EQ(buckets(raised), 4);
  const google::protobuf::Struct doc = ParseJson(raised);
  EXPECT_EQ(doc.fields().at("min_buckets").number_value(), 4);
  EXPECT_EQ(doc.fields().at("padding_tolerance").number_value(), 0.001);
  EXPECT_EQ(doc.fields().at("max_padding_tolerance").number_value(), 0.05);
  request.min_buckets = -2;
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("min_buckets is -2")));
  // --target_buckets on the byte-level layout: one bucket per matrix above 64 Ki, 4 with a
  // target of 4 (the soft minimum grown to a quarter of the buffer), echoed in the JSON.
  request.min_buckets = 0;
  request.strategy = "distopt";
  ASSERT_OK_AND_ASSIGN(std::string per_param, RunPlan(request));
  EXPECT_EQ(buckets(per_param), 16);
  request.target_buckets = 4;
  ASSERT_OK_AND_ASSIGN(std::string grown, RunPlan(request));
  EXPECT_EQ(buckets(grown), 4);
  EXPECT_EQ(ParseJson(grown).fields().at("target_buckets").number_value(), 4);
  EXPECT_EQ(ParseJson(grown).fields().at("max_bucket_size").number_value(), 6553600);
  request.max_bucket_size = 0;
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("max_bucket_size is 0")));
}

TEST(PlanTest, PresetGpt8bMegatronNumbers) {
  PlanRequest request;
  request.preset = "gpt8b";
  request.dp = 16;
  request.strategy = "megatron_lpt";
  request.bucket_size = "40000000";
  ASSERT_OK_AND_ASSIGN(std::string json, RunPlan(request));
  EXPECT_THAT(json, HasSubstr("\"padding_fraction\": 0.125, \"buckets\": 4,"));
}

TEST(PlanTest, BadFlagsAreNamed) {
  PlanRequest request;
  request.dp = 2;
  EXPECT_THAT(RunPlan(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--model and --preset: expected exactly one of them")));
  request.preset = "gpt8b";
  request.model = "x.json";
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("expected exactly one of them")));
  request.model.clear();
  request.dp = 0;
  EXPECT_THAT(RunPlan(request),
              StatusIs(absl::StatusCode::kInvalidArgument, "--dp is 0; expected >= 1"));
  request.dp = 2;
  request.expert_dp = -3;
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("--expert_dp is -3; expected >= 1")));
  request.expert_dp = 0;
  request.bucket_size = "lots";
  EXPECT_THAT(RunPlan(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--bucket_size 'lots': expected a positive number of elements or none"));
  request.bucket_size = "0";
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("--bucket_size '0'")));
  request.bucket_size.clear();
  request.strategy = "zero";
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("strategy 'zero' is unknown")));
  request.strategy = "layerwise";
  request.preset = "gpt9b";
  EXPECT_THAT(RunPlan(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "preset 'gpt9b' is unknown; expected one of gpt8b, llama3_8b_gqa, "
                       "moe_60x256, gpt2-124m, tinyllama-1.1b"));
}

TEST(PlanTest, BadSpecFilesAreNamed) {
  PlanRequest request;
  request.dp = 2;
  request.model = absl::StrCat(std::getenv("TEST_TMPDIR"), "/missing.json");
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot be read")));
  request.model = WriteTemp("role.json", R"({"params": [{"name": "w", "shape": [4, 4], "role": "x"}]})");
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         absl::StrCat(request.model, ": params[0] ('w'): role 'x' "
                                                      "is unknown; expected muon or adam")));
  request.model = WriteTemp("shape.json", R"({"params": [{"name": "w", "shape": [4], "role": "muon"}]})");
  EXPECT_THAT(RunPlan(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'w' (index 0): role muon needs a 2-D shape, got [4]"));
}

TEST(PlanTest, TpTableSweepsEveryTpAndDp) {
  PlanRequest request;
  request.preset = "llama3_8b_gqa";
  request.tp = {1, 8};
  request.dp_sweep = {8, 64};
  request.format = "json";
  ASSERT_OK_AND_ASSIGN(const std::string json, RunPlan(request));
  const google::protobuf::Struct doc = ParseJson(json);
  const auto& plans = doc.fields().at("plans").list_value().values();
  ASSERT_EQ(plans.size(), 4);
  const auto& tp8 = plans[2].struct_value().fields();
  EXPECT_EQ(tp8.at("tp").number_value(), 8);
  EXPECT_EQ(tp8.at("dp").number_value(), 8);
  EXPECT_EQ(tp8.at("ranks").number_value(), 64);
  // 32 layers x (qkv, proj, fc1, fc2), all split at tp 8.
  EXPECT_EQ(tp8.at("tp_split_matrices").number_value(), 128);
  const auto& modes = tp8.at("modes").struct_value().fields();
  const double owner = modes.at("owner").struct_value().fields().at("total_ns_flops").number_value();
  const double duplicated =
      modes.at("duplicated").struct_value().fields().at("total_ns_flops").number_value();
  EXPECT_EQ(duplicated, 8 * owner);
  EXPECT_EQ(owner, plans[0].struct_value().fields().at("modes").struct_value().fields().at(
                       "owner").struct_value().fields().at("total_ns_flops").number_value());

  request.format = "table";
  ASSERT_OK_AND_ASSIGN(const std::string table, RunPlan(request));
  EXPECT_THAT(table, HasSubstr("Tensor-parallel Muon plan for llama3_8b_gqa, 5 Newton-Schulz "
                               "steps\n"));
  EXPECT_THAT(table, HasSubstr("owner/dup"));
  EXPECT_THAT(table, HasSubstr("\n   8     64     512 |"));
}

TEST(PlanTest, TpTableRefusals) {
  PlanRequest request;
  request.preset = "gpt2-124m";
  request.dp = 8;
  request.tp = {2, 8};
  EXPECT_THAT(RunPlan(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("preset 'gpt2-124m' at --tp=8: the KV groups")));
  request.tp = {2};
  request.dp_sweep = {8, 0};
  EXPECT_THAT(RunPlan(request),
              StatusIs(absl::StatusCode::kInvalidArgument, "--dp is 0; expected >= 1"));
  request.dp_sweep.clear();
  request.format = "csv";
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "--format 'csv': expected table or json"));
  request.format = "table";
  request.strategy = "distopt";
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("--tp=2 --dp=8: --strategy=distopt")));
  request.preset.clear();
  request.model = "spec.json";
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("--tp needs --preset")));
  request.tp.clear();
  request.dp_sweep = {2, 4};
  EXPECT_THAT(RunPlan(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("--dp: a list of sizes needs --tp")));
  EXPECT_THAT(ParseSizeList("tp", "1,x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--tp '1,x': expected a comma-separated list of integers"));
  EXPECT_THAT(ParseSizeList("tp", ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--tp '': expected a comma-separated list of integers"));
  EXPECT_EQ(*ParseSizeList("dp", "8,64,1024"), (std::vector<int>{8, 64, 1024}));
}

TEST(PlanTest, ExitCodes) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("x")), 2);
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("x")), 2);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("x")), 1);
}

// Runs the real binary: `layout/plan ARGS`, returning its exit code and combined output.
std::pair<int, std::string> RunBinary(const std::string& args) {
  const std::string command = absl::StrCat("layout/plan ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(PlanBinaryTest, GoodAndBadInput) {
  auto [ok_code, ok_out] = RunBinary("--preset=gpt8b --dp=8 --bucket_size=40000000");
  EXPECT_EQ(ok_code, 0) << ok_out;
  ParseJson(ok_out);
  EXPECT_THAT(ok_out, HasSubstr("\"strategy\": \"layerwise\""));
  auto [bad_code, bad_out] = RunBinary("--preset=gpt8b --dp=0");
  EXPECT_EQ(bad_code, 2);
  EXPECT_EQ(bad_out, "plan: --dp is 0; expected >= 1\n");
  const std::string spec = WriteTemp("bad.json", R"({"params": [{"name": "w", "dtype": "int4"}]})");
  auto [spec_code, spec_out] = RunBinary(absl::StrCat("--model=", spec, " --dp=2"));
  EXPECT_EQ(spec_code, 2);
  EXPECT_THAT(spec_out, HasSubstr("params[0] ('w'): dtype 'int4' is unknown"));
}

TEST(PlanBinaryTest, TpTable) {
  auto [ok_code, ok_out] = RunBinary("--preset=tinyllama-1.1b --tp=1,2,4 --dp=8,64");
  EXPECT_EQ(ok_code, 0) << ok_out;
  EXPECT_THAT(ok_out, HasSubstr("Tensor-parallel Muon plan for tinyllama-1.1b"));
  EXPECT_THAT(ok_out, HasSubstr("\n   4     64     256 |"));
  auto [bad_code, bad_out] = RunBinary("--preset=tinyllama-1.1b --tp=8 --dp=8");
  EXPECT_EQ(bad_code, 2);
  EXPECT_EQ(bad_out,
            "plan: preset 'tinyllama-1.1b' at --tp=8: the KV groups (attention query groups) 4 "
            "does not split over 8 tp ranks; expected tp to divide 4\n");
  auto [list_code, list_out] = RunBinary("--preset=gpt8b --tp=2 --dp=8,x");
  EXPECT_EQ(list_code, 2);
  EXPECT_EQ(list_out, "plan: --dp '8,x': expected a comma-separated list of integers\n");
}

}  // namespace
}  // namespace orthoshard::layout
