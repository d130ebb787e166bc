// TrainerConfig: text-format config, validation messages and the summary's JSON.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/config/pretrain_config.pb.h"
#include "integration/config/trainer_config.h"

namespace orthoshard::integration {
namespace {

// protobuf's cpp_type_name() of the field type that holds a C++ `T`.
template <typename T>
std::string CppTypeName();
template <>
std::string CppTypeName<std::string>() { return "string"; }
template <>
std::string CppTypeName<int64_t>() { return "int64"; }
template <>
std::string CppTypeName<int>() { return "int32"; }
template <>
std::string CppTypeName<uint64_t>() { return "uint64"; }
template <>
std::string CppTypeName<double>() { return "double"; }
template <>
std::string CppTypeName<bool>() { return "bool"; }

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// A config text and the substring of the error ValidateTrainerConfig must give it at world 2.
struct RefusedText {
  const char* text;
  const char* message;
};

void ExpectRefused(std::initializer_list<RefusedText> cases) {
  for (const RefusedText& c : cases) {
    TrainerConfig config;
    ASSERT_OK(ApplyConfigText(c.text, "c", &config)) << c.text;
    EXPECT_THAT(ValidateTrainerConfig(config, 2),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.text;
  }
}

void ExpectAccepted(std::initializer_list<const char*> texts) {
  for (const char* text : texts) {
    TrainerConfig config;
    ASSERT_OK(ApplyConfigText(text, "c", &config)) << text;
    EXPECT_OK(ValidateTrainerConfig(config, 2)) << text;
  }
}

TEST(TrainerConfig, TextProtoSetsOnlyTheFieldsItNames) {
  TrainerConfig config;
  ASSERT_OK(ApplyConfigText("steps: 7\nmodel: \"small\"\nlr: 0.5\nresume: \"false\"\n", "c", &config));
  EXPECT_EQ(config.steps, 7);
  EXPECT_EQ(config.model, "small");
  EXPECT_EQ(config.lr, 0.5);
  EXPECT_EQ(config.data, TrainerConfig().data);
  EXPECT_EQ(config.global_batch, TrainerConfig().global_batch);
}

TEST(TrainerConfig, TextProtoErrorsNameTheFileAndPosition) {
  TrainerConfig config;
  EXPECT_THAT(ApplyConfigText("steps: 7\nstepz: 3\n", "run.textproto", &config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("config 'run.textproto': 2:")));
  EXPECT_THAT(ApplyConfigText("steps: \"x\"\n", "c", &config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("config 'c': 1:")));
}

TEST(TrainerConfig, ValidationNamesTheField) {
  TrainerConfig config;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  config.steps = 0;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--steps must be >= 1, got 0")));
  config = TrainerConfig();
  config.global_batch = 30;
  config.micro_batches = 4;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--global_batch 30 is not divisible by world size 2 x "
                                 "--micro_batches 4 = 8")));
  config = TrainerConfig();
  config.micro_batches = int64_t{1} << 62;  // x 2 ranks overflows int64
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--global_batch 32 is not divisible by world size 2 x "
                                 "--micro_batches 4611686018427387904 (the product exceeds "
                                 "--global_batch)")));
  config = TrainerConfig();
  config.seq_len = 65;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--seq_len 65 exceeds model 'tiny' max_seq_len 64")));
  EXPECT_THAT(ParseChoice<OptimizerChoice>("optimizer", "sgd"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected muon or adamw")));
  config = TrainerConfig();
  config.min_buckets = -1;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--min_buckets")));
  config = TrainerConfig();
  config.bucket_elems = -1;  // 0 is auto
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--bucket_elems must be >= 0")));
  config = TrainerConfig();
  config.fsdp_grad_accum = FsdpGradAccum::kSharded;  // only fsdp has grad shards to add into
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--fsdp_grad_accum=sharded adds each micro-batch's "
                                 "reduce-scatter into this rank's grad shards: it needs "
                                 "--dist=fsdp, got --dist=layerwise")));
  config.dist = DistMode::kFsdp;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  config = TrainerConfig();
  config.max_bucket_padding = 1.5;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_bucket_padding must be in [0, 1], got 1.5")));
  config = TrainerConfig();
  config.muon_ns_form = NsForm::kGram;  // with the default bf16 iteration
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--muon_ns_form=gram needs --muon_ns_dtype=fp32 (got bf16)")));
  config.muon_ns_dtype = optimizers::NsDType::kFloat32;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  EXPECT_THAT(ApplyConfigText("muon_ns_form: \"polar\"\n", "c", &config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("config 'c': --muon_ns_form 'polar': expected auto, direct or "
                                 "gram")));
  EXPECT_EQ(config.muon_ns_form, NsForm::kGram);  // nothing applied
}

// Tensor parallelism: --tp divides the world and the preset's heads, KV groups, FFN width and
// vocabulary; the batch is split over dp = world / tp; no experts yet.
TEST(TrainerConfigTest, TensorParallelFlags) {
  TrainerConfig config;  // tiny: 4 heads, 4 KV groups, FFN 192, vocabulary 256
  config.global_batch = 8;
  config.tp = 2;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  EXPECT_OK(ValidateTrainerConfig(config, 4));
  config.tp = 4;
  EXPECT_OK(ValidateTrainerConfig(config, 4));
  config.tp = 2;
  EXPECT_THAT(ValidateTrainerConfig(config, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tp 2 must be >= 1 and divide the world size 3")));
  config.tp = 0;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tp 0 must be >= 1")));
  config.tp = 3;
  EXPECT_THAT(ValidateTrainerConfig(config, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tp 3 for model 'tiny': tensor parallelism: tp 3 does not "
                                 "divide num_heads 4")));
  config.tp = 2;
  config.vocab_size = 255;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tp 2 does not divide vocab_size 255")));
  config.vocab_size = 0;
  // dp = 4 / 2 = 2 ranks read different data: 6 rows split over 2 x 1 micro-batches.
  config.global_batch = 6;
  EXPECT_OK(ValidateTrainerConfig(config, 4));
  config.global_batch = 5;
  EXPECT_THAT(ValidateTrainerConfig(config, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--global_batch 5 is not divisible by data-parallel size (world "
                                 "/ --tp) 2")));
  config = TrainerConfig();
  config.model = "moe-tiny";
  config.global_batch = 8;
  config.tp = 2;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not supported with mixture-of-experts model 'moe-tiny' yet")));
}

// Mixture-of-experts flags: only on an MoE preset; --ep divides the world and the experts;
// top-k within the experts; weights finite and >= 0 (or -1: the default).
TEST(TrainerConfigTest, ExpertFlags) {
  TrainerConfig config;
  config.ep = 2;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("need a mixture-of-experts model, but 'tiny' is dense")));
  config = TrainerConfig();
  config.moe_aux_loss_coeff = 0.1;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'tiny' is dense")));
  config = TrainerConfig();
  config.model = "moe-tiny";
  config.global_batch = 48;  // divisible by every world size below
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  config.ep = 2;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  EXPECT_OK(ValidateTrainerConfig(config, 4));
  EXPECT_THAT(ValidateTrainerConfig(config, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--ep 2 must be >= 1 and divide the world size 3")));
  config.ep = 3;
  EXPECT_THAT(ValidateTrainerConfig(config, 6),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--ep 3 does not divide model 'moe-tiny''s 8 experts per layer")));
  config.ep = 0;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--ep 0 must be >= 1")));
  config.ep = 1;
  config.moe_top_k = 9;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--moe_top_k 9 must be in [1, 8]")));
  config.moe_top_k = 8;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  config.moe_z_loss_coeff = -0.5;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--moe_z_loss_coeff must be in [0, 2^32] or -1, got -0.5")));
}

TEST(TrainerConfigTest, RouteOverrides) {
  TrainerConfig config;
  config.route = " *experts*=adamw , ,*router*=muon";
  ASSERT_OK_AND_ASSIGN(const std::vector<RouteOverrideSpec> routes, RouteOverrides(config));
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_EQ(routes[0].pattern, "*experts*");
  EXPECT_EQ(routes[0].optimizer, OptimizerChoice::kAdamW);
  EXPECT_EQ(routes[1].pattern, "*router*");
  EXPECT_EQ(routes[1].optimizer, OptimizerChoice::kMuon);
  for (const char* bad : {"*experts*", "=adamw", "*experts*=sgd"}) {
    config.route = bad;
    EXPECT_THAT(ValidateTrainerConfig(config, 2),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--route")))
        << bad;
  }
  // auto: the Gram form for the fp32 iteration only.
  config = TrainerConfig();
  EXPECT_FALSE(GramNewtonSchulz(config));  // bf16
  config.muon_ns_dtype = optimizers::NsDType::kFloat32;
  EXPECT_TRUE(GramNewtonSchulz(config));
  config.muon_ns_form = NsForm::kDirect;
  EXPECT_FALSE(GramNewtonSchulz(config));
  config = TrainerConfig();
  config.model = "huge";
  EXPECT_THAT(ValidateTrainerConfig(config, 2), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("huge")));
}

TEST(TrainerConfig, QkClipThresholdIsFiniteAndNotNegative) {
  for (const char* bad : {"qk_clip_threshold: -1", "qk_clip_threshold: nan",
                          "qk_clip_threshold: inf"}) {
    TrainerConfig config;
    ASSERT_OK(ApplyConfigText(bad, "c", &config));
    EXPECT_THAT(ValidateTrainerConfig(config, 2),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("--qk_clip_threshold must be in [0, 3.40282e+38], got ")))
        << bad;
  }
  for (const char* good : {"qk_clip_threshold: 0", "qk_clip_threshold: 100"}) {
    TrainerConfig config;
    ASSERT_OK(ApplyConfigText(good, "c", &config));
    EXPECT_OK(ValidateTrainerConfig(config, 2)) << good;
  }
}

TEST(TrainerConfig, NonFiniteMaxGradNormIsRejected) {
  TrainerConfig config;
  ASSERT_OK(ApplyConfigText("max_grad_norm: nan\n", "c", &config));
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_grad_norm must be finite, got nan (compared with the "
                                 "global norm in double, <= 0 disables")));
  ASSERT_OK(ApplyConfigText("max_grad_norm: inf\n", "c", &config));
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got inf")));
  config.max_grad_norm = 0;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
}

// Every double that reaches an fp32 computation is bounded before launch, with the flag, the value
// and the accepted range in the message; values at the bounds pass.
TEST(TrainerConfig, FloatFlagsOutOfRangeAreRejected) {
  ExpectRefused({
      {"lr: 1e39", "--lr must be in (0, 2^64], got 1e+39"},
      {"lr: 1e3", "--lr 1000 x --weight_decay 0.01 = 10 exceeds 2"},
      {"lr: 1e3", "accepted --lr with this --weight_decay: (0, 200]"},
      {"lr: 1e19 weight_decay: 0",
       "--lr 1e+19: AdamW's first step size --lr / (1 - --adam_beta1 0.9) = 1e+20 exceeds "
       "2^64"},
      {"lr: 1e19 weight_decay: 0 adam_beta1: 0.5",
       "accepted --lr with this --adam_beta1: (0, "
       "9.22337e+18]"},
      {"muon_lr: 1e3", "--muon_lr 1000 x --muon_weight_decay 0.01 = 10 exceeds 2"},
      {"muon_lr: 1e39 muon_weight_decay: 0", "--muon_lr must be in (0, 2^39], got 1e+39"},
      {"muon_scale_rule: \"spectral\" muon_extra_scale: 1e15",
       "--muon_lr 0.02 x the largest lr scale of --muon_scale_rule=spectral (1e+15 x 2^25, a "
       "param of 2^50 elements) = 6.71089e+20 exceeds 2^64"},
      {"muon_scale_rule: \"spectral\" muon_extra_scale: 1e15",
       "accepted --muon_lr x the rule's factor: (0, 2^39 = 5.49756e+11]"},
      {"weight_decay: 1e300", "--weight_decay must be in [0, 2^64], got 1e+300"},
      {"weight_decay: 1e3", "--lr 0.003 x --weight_decay 1000 = 3 exceeds 2"},
      {"adam_eps: 1e39",
       "--adam_eps must be in [0, 2^64], got 1e+39 (added to sqrt(v) in "
       "fp32)"},
      {"moe_aux_loss_coeff: 1e39",
       "--moe_aux_loss_coeff must be in [0, 2^32] or -1, got "
       "1e+39 (a loss weight"},
      {"moe_z_loss_coeff: 1e300", "--moe_z_loss_coeff must be in [0, 2^32] or -1, got 1e+300"},
      {"muon_ns_coefficients: \"1e39,-4.775,2.0315\"",
       "--muon_ns_coefficients: Newton-Schulz coefficients '1e39,-4.775,2.0315': "
       "coefficient 1e+39 is outside the accepted [-1024, 1024]"},
      {"muon_ns_coefficients: \"1e300,1,1\"", "coefficient 1e+300 is outside"},
      {"muon_ns_coefficients: \"1e30,-4.775,2.0315\"", "coefficient 1e+30 is outside"},
      {"muon_ns_coefficients: \"3.4445,-4.775,4\"",
       "--muon_ns_coefficients: '3.4445,-4.775,4' with --muon_ns_steps 5: Newton-Schulz "
       "iteration 2 of 5 (3.4445, -4.775, 4) can raise a singular value in [0, "},
      {"muon_ns_coefficients: \"1000,0,0\"",
       "iteration 1 of 5 (1000, 0, 0) can raise a "
       "singular value in [0, 1] to 1000; accepted: "
       "schedules that keep them within [0, 16]"},
      {"muon_ns_coefficients: \"aol\"",
       "--muon_ns_coefficients: 'aol' with --muon_ns_steps 5: a table of 4 Newton-Schulz "
       "iterations that restarts after its last (cycled) over 5 iterations"},
      {"muon_ns_coefficients: \"aol\" muon_ns_steps: 8", "iteration 5 of 8 (4.0098, "},
      {"muon_ns_coefficients: \"quintic\" muon_ns_steps: 6", "a multiple of 5 iterations"},
  });
  ExpectAccepted({"lr: 2 weight_decay: 1", "lr: 1.8e18 weight_decay: 0",
                  "muon_lr: 5.49e11 muon_weight_decay: 0", "adam_eps: 1e19",
                  "muon_ns_coefficients: \"polar_express\" muon_ns_steps: 99",
                  "muon_ns_coefficients: \"quintic\"",
                  "muon_ns_coefficients: \"quintic\" muon_ns_steps: 95",
                  "muon_ns_coefficients: \"aol\" muon_ns_steps: 4",
                  "muon_ns_coefficients: \"2,-1.5,0.5;3,-3.2,1.2\" muon_ns_steps: 99",
                  "max_grad_norm: 1e300"});
}

// Every double field of the table (trainer_config_fields.h) has a declared range that holds its
// default, and a value outside it (beyond either end, NaN, infinities) is refused naming the flag,
// the value and the range: a new double field without a range fails here.
TEST(TrainerConfig, EveryDoubleFieldHasARangeAndIsRefusedOutsideIt) {
  int doubles = 0;
  auto check_field = [&doubles](const char* field, auto member) {
    using T = std::decay_t<decltype(TrainerConfig().*member)>;
    if constexpr (std::is_same_v<T, double>) {
      ++doubles;
      const DoubleRange* range = DoubleRangeOf(field);
      ASSERT_NE(range, nullptr) << "double field --" << field
                                << " has no range: add it to field_checks.cc's kDoubleRanges";
      EXPECT_TRUE(range->Contains(TrainerConfig().*member)) << field << "'s default";
      if (range->sentinel.has_value()) EXPECT_TRUE(range->Contains(*range->sentinel)) << field;
      const double inf = std::numeric_limits<double>::infinity();
      std::vector<double> outside = {std::nan(""), inf, -inf};
      if (range->max < std::numeric_limits<double>::max()) {
        outside.push_back(range->max_open ? range->max : std::nextafter(range->max, inf));
        outside.push_back(std::max(1e39, 2 * range->max));
      }
      if (range->min > -std::numeric_limits<double>::max()) {
        outside.push_back(range->min_open ? range->min : std::nextafter(range->min, -inf));
        outside.push_back(-1e39);
      }
      for (double value : outside) {
        TrainerConfig config;
        config.*member = value;
        EXPECT_FALSE(range->Contains(value)) << field << " " << value;
        const bool finite_range = range->ToString() == "finite";
        EXPECT_THAT(ValidateTrainerConfig(config, 2),
                    StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr(absl::StrCat("--", field,
                                                    finite_range ? " must be finite"
                                                                 : " must be in " +
                                                                       range->ToString(),
                                                    ", got ", value, " ("))))
            << field << " " << value;
      }
    }
  };
#define ORTHOSHARD_CHECK_DOUBLE(type, name, default_value, help) \
  check_field(#name, &TrainerConfig::name);
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_CHECK_DOUBLE)
#undef ORTHOSHARD_CHECK_DOUBLE
  EXPECT_GE(doubles, 17);  // the table's double fields today; more only add to the count
  EXPECT_EQ(DoubleRangeOf("steps"), nullptr);  // not a double
}

// A flag that does nothing in the configured mode is refused when given (on the command line or in
// the config text), naming it and what it needs; the same flag in its mode, or left at its default
// elsewhere, is accepted.
TEST(TrainerConfig, GivenFlagsThatDoNothingAreRefused) {
  ExpectRefused({
      {"muon_tp_mode: \"owner\"", "--muon_tp_mode needs --tp > 1 and --optimizer=muon"},
      {"tp: 2 global_batch: 8 optimizer: \"adamw\" muon_tp_mode: \"duplicated\"",
       "--muon_tp_mode needs --tp > 1 and --optimizer=muon"},
      {"fsdp_grad_syncs_in_flight: 1",
       "--fsdp_grad_syncs_in_flight needs --dist=fsdp; it "
       "does nothing here: drop it"},
      {"fsdp_grad_accum: \"full\"", "--fsdp_grad_accum needs --dist=fsdp"},
      {"reshard_after_forward: false", "--reshard_after_forward needs --dist=fsdp"},
      {"prefetch_params: true", "--prefetch_params needs --dist=fsdp"},
      {"dist: \"replicated\" overlap_param_gather: false",
       "--overlap_param_gather needs --dist=layerwise, distopt or fsdp"},
      {"recompute_layers: -1",
       "--recompute_layers needs --recompute=full or "
       "--recompute=selective"},
      {"muon_extra_scale: 2", "--muon_extra_scale needs --muon_scale_rule=spectral"},
      {"optimizer: \"adamw\" route: \"*experts*=adamw\"", "--route needs --optimizer=muon"},
      {"decay_steps: 10", "--decay_steps needs --schedule=wsd"},
      {"grad_reduce_in_fp32: true", "--grad_reduce_in_fp32 needs --precision=bf16"},
      {"ep: 1", "need a mixture-of-experts model, but 'tiny' is dense"},
      {"moe_aux_loss_coeff: -1", "need a mixture-of-experts model, but 'tiny' is dense"},
  });
  ExpectAccepted({"tp: 2 global_batch: 8 muon_tp_mode: \"duplicated\"",
                  "dist: \"fsdp\" fsdp_grad_syncs_in_flight: 2 fsdp_grad_accum: \"full\" "
                  "reshard_after_forward: false prefetch_params: false",
                  "dist: \"layerwise\" overlap_param_gather: false",
                  "recompute: \"full\" recompute_layers: -1",
                  "muon_scale_rule: \"spectral\" muon_extra_scale: 2", "route: \"*norm*=adamw\"",
                  "schedule: \"wsd\" decay_steps: 10",
                  "precision: \"bf16\" grad_reduce_in_fp32: false",
                  "model: \"moe-tiny\" ep: 1 moe_aux_loss_coeff: -1"});
  TrainerConfig config;  // the same values, not given: the defaults of every mode
  config.muon_tp_mode = optimizers::MuonTpMode::kDuplicated;
  config.fsdp_grad_syncs_in_flight = 3;
  config.overlap_param_gather = false;
  config.dist = DistMode::kReplicated;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  ASSERT_OK(ApplyConfigText("steps: 5", "c", &config));
  EXPECT_EQ(config.given, std::set<std::string>{"steps"});
}

TEST(TrainerConfig, DistModes) {
  TrainerConfig config;
  config.dist = DistMode::kLayerwise;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  config.dist = DistMode::kDistOpt;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--dist=distopt shards every param at element level, but Muon "
                                 "needs whole matrices")));
  config.optimizer = OptimizerChoice::kAdamW;
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  EXPECT_THAT(ParseChoice<DistMode>("dist", "mesh"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--dist 'mesh': expected replicated, layerwise, distopt or "
                                 "fsdp")));
}

TEST(TrainerConfig, DeviceIsCpuOrCuda) {
  TrainerConfig config;
  config.device = Device::kCuda;  // whether this build and machine have one is pretrain's check
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  EXPECT_THAT(ApplyConfigText("device: \"tpu\"", "c", &config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--device 'tpu': expected cpu or cuda")));
}

TEST(TrainerConfig, CheckpointFlagsAreChecked) {
  TrainerConfig config;
  config.resume = ResumeMode::kTrue;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--resume needs --save_dir")));
  config.save_dir = "/tmp/x";
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  config.dist = DistMode::kReplicated;  // every mode saves and resumes
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  config = TrainerConfig();
  config.save_every = 5;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--save_every needs --save_dir")));
  config = TrainerConfig();
  config.stop_after = config.steps + 1;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--stop_after 301 exceeds --steps 300")));
}

TEST(TrainerConfig, SaveFailurePolicy) {
  TrainerConfig config;
  EXPECT_EQ(config.on_save_failure, SaveFailurePolicy::kStop);
  ASSERT_OK(ApplyConfigText("on_save_failure: \"continue\"\nmax_consecutive_failed_saves: 0\n", "c",
                            &config));
  EXPECT_EQ(config.on_save_failure, SaveFailurePolicy::kContinue);
  EXPECT_EQ(config.max_consecutive_failed_saves, 0);
  EXPECT_OK(ValidateTrainerConfig(config, 2));
  EXPECT_THAT(ParseChoice<SaveFailurePolicy>("on_save_failure", "retry"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--on_save_failure 'retry': expected stop or continue")));
  config = TrainerConfig();
  config.max_consecutive_failed_saves = -1;
  EXPECT_THAT(ValidateTrainerConfig(config, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_consecutive_failed_saves must be >= 0")));
}

TEST(TrainerConfig, SummaryJsonHasTheRequiredKeys) {
  TrainSummary s;
  s.steps = 3;
  s.initial_loss = 5.5;
  s.final_loss = 1.25;
  s.dist = "replicated";
  s.world_size = 2;
  const std::string json = s.ToJson();
  EXPECT_THAT(json, HasSubstr("\"steps\":3,"));
  EXPECT_THAT(json, HasSubstr("\"initial_loss\":5.500000,"));
  EXPECT_THAT(json, HasSubstr("\"final_loss\":1.250000,"));
  EXPECT_THAT(json, HasSubstr("\"world_size\":2,"));
  EXPECT_THAT(json, HasSubstr("\"dist\":\"replicated\""));
  EXPECT_THAT(json, HasSubstr("\"failed_saves\":0,"));
  s.failed_saves = 2;
  EXPECT_THAT(s.ToJson(), HasSubstr("\"failed_saves\":2,"));
  EXPECT_THAT(json, HasSubstr("\"stop_signal\":0,"));
  s.stop_signal = 15;
  EXPECT_THAT(s.ToJson(), HasSubstr("\"stop_signal\":15,"));
  for (const char* key : {"eval_loss", "tokens_per_s", "exposed_comm_s", "rank_skew_s"}) {
    EXPECT_THAT(json, HasSubstr(std::string("\"") + key + "\":"));
  }
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
}

// JSON has no NaN or infinity: every double that is not finite is written as null and named in
// "non_finite", in the line's order; finite values are as before and the member is absent.
// (//integration:summary_json_test reads real runs' lines back with a strict parser.)
TEST(TrainerConfig, SummaryJsonWritesNonFiniteDoublesAsNull) {
  TrainSummary s;
  s.final_loss = std::nan("");
  s.params_norm = 2.5;
  std::string json = s.ToJson();
  EXPECT_THAT(json, HasSubstr("\"final_loss\":null,"));
  EXPECT_THAT(json, HasSubstr("\"params_norm\":2.5,"));
  EXPECT_TRUE(absl::EndsWith(json, ",\"non_finite\":[\"final_loss\"]}")) << json;
  const double inf = std::numeric_limits<double>::infinity();
  double* doubles[] = {&s.initial_loss,   &s.final_loss,        &s.initial_eval_loss,
                       &s.eval_loss,      &s.unigram_entropy,   &s.tokens_per_s,
                       &s.elapsed_s,      &s.param_checksum,    &s.param_gather_wait_s,
                       &s.grad_sync_wait_s, &s.exposed_comm_s,  &s.rank_skew_s,
                       &s.step_s,         &s.forward_s,         &s.backward_s,
                       &s.optimizer_s,    &s.cpu_s_per_step,    &s.params_norm};
  for (size_t i = 0; i < std::size(doubles); ++i) *doubles[i] = i % 2 ? inf : std::nan("");
  s.initial_loss = -inf;  // (params_norm < 0 means "not asked for": left out, tested below)
  json = s.ToJson();
  EXPECT_TRUE(absl::EndsWith(
      json,
      "\"non_finite\":[\"initial_loss\",\"final_loss\",\"initial_eval_loss\",\"eval_loss\","
      "\"unigram_entropy\",\"tokens_per_s\",\"elapsed_s\",\"param_checksum\","
      "\"param_gather_wait_s\",\"grad_sync_wait_s\",\"exposed_comm_s\",\"rank_skew_s\","
      "\"step_s\",\"forward_s\",\"backward_s\",\"optimizer_s\",\"cpu_s_per_step\","
      "\"params_norm\"]}"))
      << json;
  for (const char* token : {"nan", "inf", "NaN", "Inf"}) EXPECT_THAT(json, Not(HasSubstr(token)));
  EXPECT_EQ(TrainSummary().ToJson().find("non_finite"), std::string::npos);
  EXPECT_EQ(TrainSummary().ToJson().find("params_norm"), std::string::npos);  // -1: not asked
}

// The field table (trainer_config_fields.h) and PretrainConfig name the same fields with matching
// types, so the text-format config can set every field and nothing else.
TEST(TrainerConfig, TheFieldTableMatchesTheProto) {
  const google::protobuf::Descriptor* d = PretrainConfig::descriptor();
  int fields = 0;
#define ORTHOSHARD_CHECK_FIELD(type, name, default_value, help)                                 \
  {                                                                                             \
    ++fields;                                                                                   \
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(#name);                     \
    ASSERT_NE(f, nullptr) << "PretrainConfig has no field " #name;                              \
    EXPECT_EQ(std::string(f->cpp_type_name()), CppTypeName<SpellingOf<type>>()) << #name;       \
  }
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_CHECK_FIELD)
#undef ORTHOSHARD_CHECK_FIELD
  EXPECT_EQ(d->field_count(), fields) << "PretrainConfig has fields the table does not list";
}

// Every value of every fixed-choice field: named by its table, applied from a text config, and each
// mode's row of the --dist table found by SpecOf.
TEST(Choices, EveryValueOfEveryFieldRoundTrips) {
  int values = 0;
  auto check_field = [&values](absl::string_view field, auto member) {
    using E = std::decay_t<decltype(TrainerConfig().*member)>;
    if constexpr (kIsChoice<E>) {
      for (const auto& choice : ChoiceTable<E>::kValues) {
        ++values;
        EXPECT_STREQ(ChoiceName(choice.value), choice.name);
        EXPECT_EQ(Spell(choice.value), choice.name);
        ASSERT_OK_AND_ASSIGN(const E parsed, ParseChoice<E>(field, choice.name));
        EXPECT_EQ(parsed, choice.value) << field << " " << choice.name;
        TrainerConfig config;
        ASSERT_OK(ApplyConfigText(absl::StrCat(field, ": \"", choice.name, "\"\n"), "c", &config));
        EXPECT_EQ(config.*member, choice.value) << field << " " << choice.name;
      }
      EXPECT_THAT(ParseChoice<E>(field, "no_such_value"),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr(absl::StrCat("--", field, " 'no_such_value': expected ",
                                                  ChoiceList<E>()))));
    }
  };

#define ORTHOSHARD_CHECK_CHOICE(type, name, default_value, help) \
  check_field(#name, &TrainerConfig::name);
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_CHECK_CHOICE)
#undef ORTHOSHARD_CHECK_CHOICE
  EXPECT_EQ(values, 39);  // a new choice: add it here and a seed to the fuzz corpus
  for (const DistModeSpec& spec : kDistModes) EXPECT_EQ(SpecOf(spec.value).name, spec.name);
}

// The config fuzzer's seed corpus names every accepted value of every fixed-choice field, so that
// every fuzz run (and the corpus replay `bazel test` does) starts from each of them.
TEST(Choices, TheFuzzCorpusNamesEveryValue) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  ASSERT_NE(srcdir, nullptr);
  const std::string dir =
      absl::StrCat(srcdir, "/orthoshard/integration/config/testdata/fuzz/config");
  std::string corpus;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    absl::StrAppend(&corpus, text.str(), "\n");
  }
  auto check_field = [&corpus, &dir](absl::string_view field, auto value_of_type) {
    using E = decltype(value_of_type);
    if constexpr (kIsChoice<E>) {
      for (const auto& choice : ChoiceTable<E>::kValues) {
        const std::string line = absl::StrCat(field, ": \"", choice.name, "\"");
        EXPECT_TRUE(absl::StrContains(corpus, line)) << "no seed in " << dir << " has " << line;
      }
    }
  };
#define ORTHOSHARD_CHECK_SEEDS(type, name, default_value, help) check_field(#name, type{});
  ORTHOSHARD_TRAINER_CONFIG_FIELDS(ORTHOSHARD_CHECK_SEEDS)
#undef ORTHOSHARD_CHECK_SEEDS
}

}  // namespace
}  // namespace orthoshard::integration
