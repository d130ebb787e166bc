// Runs the real `pretrain` binary: a short 2-rank training through its built-in launcher (loss
// falls, ranks' params agree, the JSON summary is the last stdout line, TensorBoard scalars read
// back), a config file with a flag override on 1 rank, and bad input (exit code 2, one message on
// stderr, nothing on stdout, nothing written), and checkpoints: save + --resume continue bitwise
// at the same rank count, finish at another, and a corrupt shard or missing checkpoint is exit 2.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/metrics/tensorboard.h"
#include "integration/testing/pretrain_runner.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::integration::testing::JsonField;
using ::orthoshard::integration::testing::JsonNumber;
using ::orthoshard::integration::testing::LastLine;
using ::orthoshard::integration::testing::ReadFile;
using ::orthoshard::integration::testing::RunPretrain;
using ::orthoshard::integration::testing::RunResult;
using ::orthoshard::integration::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(Pretrain, TwoRanksLearnAgreeAndLogScalars) {
  const std::string tb = TempDir() + "/tb";
  RunResult run = RunPretrain({"--steps=30", "--eval_every=15", "--check_every=10", "--global_batch=16",
                         "--warmup_steps=5", "--log_every=10", "--log_dir=" + tb});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string json = LastLine(run.out);
  ASSERT_THAT(json, StartsWith("{\"steps\":30,")) << run.out;
  EXPECT_EQ(json.back(), '}');
  EXPECT_EQ(JsonField(json, "world_size"), "2");
  EXPECT_EQ(JsonField(json, "dist"), "layerwise");  // the default
  // The cross-rank param checksum matched at steps 10, 20 and 30 (a mismatch fails the run).
  EXPECT_EQ(JsonField(json, "checksum_checks"), "3");
  const double initial = JsonNumber(json, "initial_loss");
  const double final_loss = JsonNumber(json, "final_loss");
  const double initial_eval = JsonNumber(json, "initial_eval_loss");
  const double eval = JsonNumber(json, "eval_loss");
  // Learning thresholds, not tolerances. An untrained model guesses bytes uniformly: measured
  // initial 5.5528 vs log 256 = 5.5452. After 30 steps the train and eval losses measured 3.092
  // and 3.086, 1.46 below the bounds; avx2, avx512 and SSE4.1/default kernels moved them by < 3e-4.
  EXPECT_NEAR(initial, std::log(256.0), 0.5);
  EXPECT_LT(final_loss, initial - 1.0);
  EXPECT_LT(eval, initial_eval - 1.0);
  EXPECT_GT(JsonNumber(json, "tokens_per_s"), 0);
  // Where a step's time went (all measured, so only positive), and what it sent: a reduce-scatter
  // of the fp32 grad buffers and an all-gather of the fp32 param buffers, each (N - 1) / N of the
  // buffer on the wire at N = 2 ranks, plus two all-reduces of a few doubles (step agreement,
  // gradient statistics): within 2% of 2 (N - 1) / N x the param buffer bytes (issue 19).
  for (const char* field : {"step_s", "forward_s", "backward_s", "optimizer_s", "cpu_s_per_step"}) {
    EXPECT_GT(JsonNumber(json, field), 0) << field;
  }
  const double buffer = JsonNumber(json, "param_buffer_bytes");
  EXPECT_NEAR(JsonNumber(json, "wire_bytes_per_step"), 2 * 0.5 * buffer, 0.02 * buffer);
  EXPECT_THAT(run.out, HasSubstr("optimizer routing: muon 8 params"));
  EXPECT_THAT(run.out, HasSubstr("layout: buffer fp32/fp32/dense/layerwise"));
  EXPECT_THAT(run.out, HasSubstr("step 30/30 | loss"));

  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(tb)) {
    files.push_back(entry.path().string());
  }
  ASSERT_EQ(files.size(), 1u);  // rank 0 only
  EXPECT_THAT(files[0], HasSubstr("events.out.tfevents."));
  ASSERT_OK_AND_ASSIGN(std::vector<TbEvent> events, ReadEventFile(files[0]));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  std::map<std::string, std::vector<std::pair<int64_t, float>>> scalars;
  for (const TbEvent& e : events) {
    for (const ScalarValue& v : e.scalars) scalars[v.tag].push_back({e.step, v.value});
  }
  for (const char* tag : {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s",
                          "train/step_time_s", "comm/bytes"}) {
    ASSERT_EQ(scalars[tag].size(), 30u) << tag;
    EXPECT_EQ(scalars[tag].front().first, 1) << tag;
    EXPECT_EQ(scalars[tag].back().first, 30) << tag;
  }
  // TensorBoard stores float(v) (within 2^-24 |v|), the JSON prints v with %.6f (within 5e-7):
  // the two readings of one double v differ by at most 5e-7 + 2^-24 |v|. Taking 2^-23 |json|
  // instead of 2^-24 |v| also covers strtod's rounding and |v| - |json| <= 5e-7.
  auto tb_vs_json = [](double json_value) { return 5e-7 + 0x1p-23 * std::abs(json_value); };
  EXPECT_NEAR(scalars["train/loss"].front().second, initial, tb_vs_json(initial));
  EXPECT_NEAR(scalars["train/loss"].back().second, final_loss, tb_vs_json(final_loss));
  EXPECT_GT(scalars["comm/bytes"].back().second, scalars["comm/bytes"].front().second);
  ASSERT_EQ(scalars["eval/loss"].size(), 3u);  // before training, step 15, step 30
  EXPECT_EQ(scalars["eval/loss"][0].first, 0);
  EXPECT_EQ(scalars["eval/loss"][2].first, 30);
  EXPECT_NEAR(scalars["eval/loss"][2].second, eval, tb_vs_json(eval));
  for (const char* tag : {"comm/param_gather_wait_s", "comm/grad_sync_wait_s", "time/forward_s",
                          "time/backward_s", "time/optimizer_s", "time/cpu_s", "comm/exposed_s",
                          "comm/rank_skew_s"}) {
    EXPECT_EQ(scalars[tag].size(), 30u) << tag;
  }
  // The cross-rank waits (least wait, most minus least) are durations, and the summary's figures
  // are their means over the steady steps 2..30: 29 floats of at most ~1 s summed in double, each
  // within 2^-24 of its double, so the mean is within 2^-24 x its largest term of the doubles'.
  for (const auto& [tag, field] : {std::pair<const char*, const char*>{"comm/exposed_s",
                                                                      "exposed_comm_s"},
                                   {"comm/rank_skew_s", "rank_skew_s"}}) {
    double sum = 0, largest = 0;
    for (size_t i = 0; i < scalars[tag].size(); ++i) {
      EXPECT_GE(scalars[tag][i].second, 0) << tag << " at step " << scalars[tag][i].first;
      if (i > 0) sum += scalars[tag][i].second;
      largest = std::max<double>(largest, scalars[tag][i].second);
    }
    EXPECT_NEAR(JsonNumber(json, field), sum / 29, 5e-7 + 0x1p-24 * largest) << field;
  }
  // Each rank's memory at the last step, as in the JSON (byte counts below 2^24 are exact floats).
  for (int rank = 0; rank < 2; ++rank) {
    for (const char* field :
         {"params_bytes", "grads_bytes", "optimizer_state_bytes", "peak_transient_bytes"}) {
      const std::string tag = absl::StrCat("memory/rank", rank, "/", field);
      ASSERT_EQ(scalars[tag].size(), 1u) << tag;
      EXPECT_EQ(scalars[tag][0].first, 30) << tag;
      const std::string entry = absl::StrCat("{\"rank\":", rank, ",");
      ASSERT_NE(json.find(entry), std::string::npos) << json;
      EXPECT_EQ(scalars[tag][0].second, JsonNumber(json.substr(json.find(entry)), field)) << tag;
    }
    // The allocator's count holds the buffers and the optimizer state (tensors all), at once at
    // the peak of a step, and activations on top.
    const std::string rank_json = json.substr(json.find(absl::StrCat("{\"rank\":", rank, ",")));
    EXPECT_GT(JsonNumber(rank_json, "allocator_peak_bytes"),
              JsonNumber(rank_json, "params_bytes") + JsonNumber(rank_json, "grads_bytes") +
                  JsonNumber(rank_json, "optimizer_state_bytes"))
        << rank_json;
  }
}

// The other modes (the default layerwise is above): loss falls and params agree on both ranks at
// every check, with 2 micro-batches of gradient accumulation.
TEST(Pretrain, ReplicatedAndDistOptLearnAndAgree) {
  for (const std::vector<std::string>& mode :
       {std::vector<std::string>{"--dist=replicated"},
        std::vector<std::string>{"--dist=distopt", "--optimizer=adamw"}}) {
    std::vector<std::string> args = {"--steps=20", "--eval_every=0", "--check_every=5",
                                     "--global_batch=16", "--micro_batches=2", "--warmup_steps=5"};
    args.insert(args.end(), mode.begin(), mode.end());
    RunResult run = RunPretrain(args);
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    const std::string json = LastLine(run.out);
    EXPECT_EQ(JsonField(json, "dist"), mode[0].substr(7));
    EXPECT_EQ(JsonField(json, "steps"), "20");
    EXPECT_EQ(JsonField(json, "checksum_checks"), "4");  // steps 5, 10, 15, 20
    // Learning thresholds: from 5.553, train and eval losses measured 3.41 (replicated) and 3.50
    // (distopt), over 1.0 below the bounds; avx2, avx512 and SSE4.1/default kernels moved them by
    // < 2e-4.
    EXPECT_LT(JsonNumber(json, "final_loss"), JsonNumber(json, "initial_loss") - 1.0) << json;
    EXPECT_LT(JsonNumber(json, "eval_loss"), JsonNumber(json, "initial_eval_loss") - 1.0) << json;
  }
}

// Layer-wise sharding must not change the maths: with the fused QKV and SwiGLU fc1 splits carried
// into the sharded Muon, the layerwise and replicated runs (2 ranks, 3 steps) end at the same
// params, bitwise (the param checksum is printed with 17 digits). Clipping is off: the global norm
// is summed in a different order over shards, and bf16 Newton-Schulz amplifies that last-bit
// difference (~1e-2 in this checksum after 3 steps). Orthogonalising the fused weights whole in the
// layerwise run, as before the splits were carried, moves it by ~0.9 (327.28 vs 328.18).
// Also the diagnostics: the params norm and the zero-gradient count, summed over what each rank
// updates (whole matrices and ZeRO-1 slices when layer-wise, everything on every rank when
// replicated) must describe the same bitwise-equal params and grads.
TEST(Pretrain, LayerwiseAndReplicatedMuonAgreeBitwise) {
  std::vector<std::string> checksums, zeros;
  std::vector<double> norms;
  for (const char* dist : {"--dist=layerwise", "--dist=replicated"}) {
    RunResult run = RunPretrain({"--steps=3", "--eval_every=0", "--check_every=0",
                                 "--global_batch=16", "--warmup_steps=1", "--max_grad_norm=0",
                                 "--log_params_norm", "--log_num_zeros_in_grad", "--log_every=1",
                                 dist});
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    const std::string json = LastLine(run.out);
    EXPECT_EQ(JsonField(json, "world_size"), "2");
    EXPECT_EQ(JsonField(json, "optimizer"), "muon");
    checksums.push_back(JsonField(json, "param_checksum"));
    ASSERT_FALSE(checksums.back().empty()) << json;
    norms.push_back(JsonNumber(json, "params_norm"));
    zeros.push_back(JsonField(json, "num_zeros_in_grad"));
    EXPECT_THAT(run.out, HasSubstr("| muon lr 2.00e-02 | grad norm ")) << dist;
    EXPECT_THAT(run.out, HasSubstr(" | params norm ")) << dist;
    EXPECT_THAT(run.out, HasSubstr(" | zeros ")) << dist;
  }
  EXPECT_EQ(checksums[0], checksums[1]);
  // Exact: the same grads. (0 here: the tiny preset ties its embedding to the head, whose
  // gradient reaches every row; counting itself is optimizers_test's ChainedDiagnostics.)
  EXPECT_EQ(zeros[0], zeros[1]);
  EXPECT_FALSE(zeros[0].empty());
  // The same params, summed in another order: each slot's norm is an fp32 cascade sum (relative
  // error about log2(n) 2^-24 <= 1.1e-6 for n <= 2^18 elements per slot), then squared and added
  // in double. 1e-5 leaves a 9x margin.
  EXPECT_GT(norms[0], 0.0);
  EXPECT_NEAR(norms[0], norms[1], 1e-5 * norms[1]);
}

// At 3 and 4 ranks too, clipping off, every mode trains bitwise alike over the same layout (an
// explicit --bucket_elems: fsdp's default sizes its buckets from the model): Muon in layerwise,
// replicated and fsdp; AdamW in distopt, replicated, layerwise and fsdp. Each grad element is
// summed in the order of the ring reduce-scatter, by the shard it falls in, in every mode
// (replicated's all-reduce is that reduce-scatter plus an all-gather: buffers/bucket_sync.h). At
// 4 ranks the engine's all-reduce, which replicated used before, adds the four terms in another
// order (final losses 4.974822 vs 4.974829 with Muon).
TEST(Pretrain, ModesAgreeBitwiseAtThreeAndFourRanks) {
  const std::vector<std::string> fields = {"steps", "initial_loss", "final_loss", "eval_loss",
                                           "param_checksum"};
  for (const char* ranks : {"--nproc_per_node=3", "--nproc_per_node=4"}) {
    for (const auto& [optimizer, modes] :
         std::vector<std::pair<std::string, std::vector<std::string>>>{
             {"--optimizer=muon", {"--dist=layerwise", "--dist=replicated", "--dist=fsdp"}},
             {"--optimizer=adamw",
              {"--dist=distopt", "--dist=replicated", "--dist=layerwise", "--dist=fsdp"}}}) {
      std::string first;
      for (const std::string& mode : modes) {
        const RunResult run =
            RunPretrain({ranks, optimizer, mode, "--steps=3", "--global_batch=12", "--eval_every=0",
                         "--eval_batches=1", "--check_every=0", "--warmup_steps=1",
                         "--max_grad_norm=0", "--bucket_elems=65536"});
        ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
        const std::string json = LastLine(run.out);
        if (first.empty()) {
          first = json;
          continue;
        }
        for (const std::string& field : fields) {
          EXPECT_EQ(JsonField(json, field), JsonField(first, field))
              << ranks << " " << optimizer << " " << mode << " vs " << modes[0] << ": " << field;
        }
      }
    }
  }
}

// QK-clip is the same computation at any rank count and in every mode: the step's max logits are
// a MAX over micro-batches and ranks (exact), and the factors scale the updated weights wherever
// the optimizer holds them. 1 rank with 2 micro-batches and 2 ranks in layerwise, fsdp and
// replicated mode (Muon), and distopt (ZeRO-1 AdamW, the qkv split over ranks by element ranges),
// end at the same params, bitwise, with the same largest logit and clipped groups; clipping is off
// (the global norm is summed in another order over shards, see above). tau = 0.1 is below tiny's
// first logits (~0.13), so every step clips, and the params differ from an unclipped run.
TEST(Pretrain, QkClipIsTheSameAtAnyRankCountAndMode) {
  const std::vector<std::string> base = {"--steps=4", "--eval_every=0", "--check_every=0",
                                         "--global_batch=16", "--warmup_steps=1",
                                         "--max_grad_norm=0", "--log_every=1"};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult result = RunPretrain(args);
    EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
    return LastLine(result.out);
  };
  const std::vector<std::string> fields = {"param_checksum", "final_loss", "qk_clip_max_logit",
                                           "qk_clip_clipped_groups"};
  for (const char* optimizer : {"--optimizer=muon", "--optimizer=adamw"}) {
    const bool muon = std::string(optimizer) == "--optimizer=muon";
    const char* dist = muon ? "--dist=layerwise" : "--dist=distopt";
    const std::string one = run({optimizer, dist, "--qk_clip_threshold=0.1", "--nproc_per_node=1",
                                 "--micro_batches=2"});
    EXPECT_EQ(JsonField(one, "world_size"), "1");
    EXPECT_GT(JsonNumber(one, "qk_clip_clipped_groups"), 0) << one;
    EXPECT_GT(JsonNumber(one, "qk_clip_max_logit"), 0.1) << one;
    const std::string off = run({optimizer, dist, "--nproc_per_node=1", "--micro_batches=2"});
    EXPECT_NE(JsonField(off, "param_checksum"), JsonField(one, "param_checksum"));
    EXPECT_EQ(JsonField(off, "qk_clip_clipped_groups"), "");  // off: not in the summary
    std::vector<const char*> modes = {dist};
    if (muon) modes = {"--dist=layerwise", "--dist=fsdp", "--dist=replicated"};
    for (const char* mode : modes) {
      const std::string two = run({optimizer, mode, "--qk_clip_threshold=0.1"});
      EXPECT_EQ(JsonField(two, "world_size"), "2");
      for (const std::string& field : fields) {
        EXPECT_EQ(JsonField(two, field), JsonField(one, field)) << optimizer << " " << mode << ": "
                                                                << field;
      }
    }
  }
}

TEST(Pretrain, FlagsOverrideTheConfigFile) {
  const std::string config = TempDir() + "/run.textproto";
  std::ofstream(config) << "steps: 50\nglobal_batch: 8\neval_every: 0\noptimizer: \"adamw\"\n";
  RunResult run = RunPretrain({"--config=" + config, "--steps=3", "--nproc_per_node=1"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string json = LastLine(run.out);
  EXPECT_EQ(JsonField(json, "steps"), "3");           // the flag wins
  EXPECT_EQ(JsonField(json, "optimizer"), "adamw");   // from the file
  EXPECT_EQ(JsonField(json, "world_size"), "1");
  EXPECT_THAT(run.out, HasSubstr("global batch 8 = 1 ranks"));  // from the file
}

TEST(Pretrain, BadInputExitsWithTwoAndOneMessage) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/bad.idx") << "NOTANIDX-and-some-more-bytes-to-read";
  std::ofstream(dir + "/bad.bin") << "xx";
  std::ofstream(dir + "/bad.textproto") << "stepz: 3\n";
  std::filesystem::create_directories(dir + "/held");
  std::ofstream(dir + "/held/latest") << "step_000002\n";
  const std::string log_dir = dir + "/must_not_exist";
  const std::string save_dir = dir + "/no_checkpoints";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--stepz=3", "unknown flag --stepz"},
      {"--steps=abc", "flag --steps: Illegal value 'abc'"},
      {"--steps=0", "--steps must be >= 1, got 0"},
      {"--global_batch=31", "--global_batch 31 is not divisible by world size 2"},
      {"--data=text:" + dir + "/missing.txt", "cannot open"},
      {"--data=megatron:" + dir + "/bad", "bad magic"},
      {"--data=csv:x", "expected synthetic[:TOKENS], text:PATH"},
      {"--config=" + dir + "/missing.textproto", "cannot open"},
      {"--config=" + dir + "/bad.textproto", "stepz"},
      {"--dist=distopt", "Muon needs whole matrices"},
      {"--dist=mesh", "expected replicated, layerwise, distopt or fsdp"},
      {"--device=cuda", "--device=cuda: "},  // built without CUDA here, or no GPU visible
      {"--device=tpu", "--device 'tpu': expected cpu or cuda"},
      {"--resume", "--resume needs --save_dir"},
      {"--resume --save_dir=" + dir + "/no_ckpt", "no_ckpt/latest' does not exist"},
      {"--save_dir=" + dir + "/bad.bin/ckpt", "bad.bin' is not a directory"},
      {"--save_dir=" + dir + "/held",
       "already holds checkpoints (a `latest` pointer): pass --resume"},
      {"--model=huge", "huge"},
      {"--muon_ns_form=gram", "--muon_ns_form=gram needs --muon_ns_dtype=fp32 (got bf16)"},
      {"--muon_ns_form=fast", "--muon_ns_form 'fast': expected auto, direct or gram"},
      {"--min_buckets=-1", "--min_buckets"},
      {"--target_buckets=-1", "--target_buckets"},
      {"--max_bucket_elems=0", "--max_bucket_elems"},
      {"--max_bucket_padding=2", "--max_bucket_padding must be in [0, 1], got 2"},
      {"--profile_step_end=3", "--profile_step_end 3 without --profile_step_start"},
      {"--muon_scale_rule=rms", "--muon_scale_rule 'rms': expected original"},
      {"--clip_mode=none", "--clip_mode 'none': expected all or exclude_muon"},
      {"--muon_ns_coefficients=1,2", "--muon_ns_coefficients: Newton-Schulz coefficients '1,2'"},
      {"--muon_ns_steps=0", "--muon_ns_steps must be in [1, 100), got 0"},
      {"--adam_beta2=1", "--adam_beta2 must be in [0, 1), got 1"},
      {"--muon_momentum=-0.1", "--muon_momentum must be in [0, 1), got -0.1"},
      {"--adam_eps=-1", "--adam_eps must be in [0, 2^64], got -1 (added to sqrt(v) in fp32)"},
      // Out of fp32's range: these crashed both ranks after launch (exit 134), with --save_dir
      // and --log_dir already made.
      {"--lr=1e39 --save_dir=" + save_dir, "--lr must be in (0, 2^64], got 1e+39"},
      {"--lr=1e3 --save_dir=" + save_dir, "accepted --lr with this --weight_decay: (0, 200]"},
      {"--lr=1e19 --weight_decay=0", "--lr 1e+19: AdamW's first step size"},
      {"--muon_lr=1e39 --muon_weight_decay=0 --save_dir=" + save_dir,
       "--muon_lr must be in (0, 2^39], got 1e+39"},
      {"--muon_ns_coefficients=1e39,-4.775,2.0315 --save_dir=" + save_dir,
       "coefficient 1e+39 is outside the accepted [-1024, 1024]"},
      {"--muon_ns_coefficients=1e300,-4.775,2.0315", "coefficient 1e+300 is outside"},
      {"--muon_ns_coefficients=1e30,-4.775,2.0315", "coefficient 1e+30 is outside"},
      {"--muon_ns_coefficients=3.4445,-4.775,4",
       "Newton-Schulz iteration 2 of 5 (3.4445, -4.775, 4) can raise a singular value"},
      {"--adam_eps=1e39", "--adam_eps must be in [0, 2^64]"},
      {"--max_grad_norm=inf", "--max_grad_norm must be finite, got inf"},
      {"--muon_extra_scale=0", "--muon_extra_scale must be in (0, 2^64], got 0"},
      {"--profile_step_start=3 --profile_step_end=2", "--profile_step_end 2 precedes"},
      {"--profile_step_start=-1", "--profile_step_start -1 / --profile_step_end 0: expected"},
      {"--profile_step_start=400", "--profile_step_start 400 is after the last step (--steps 300)"},
      {"--profile_step_start=2 --profile_dir=" + dir + "/bad.bin/prof",
       "--profile_dir '" + dir + "/bad.bin/prof': '"},
  };
  for (const auto& [arg, message] : cases) {
    RunResult run = RunPretrain({arg, "--log_dir=" + log_dir});
    EXPECT_EQ(run.exit_code, 2) << arg << ": " << run.err;
    EXPECT_EQ(run.out, "") << arg;
    EXPECT_THAT(run.err, StartsWith("pretrain: ")) << arg;
    EXPECT_THAT(run.err, HasSubstr(message)) << arg;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << arg << ": " << run.err;
  }
  EXPECT_FALSE(std::filesystem::exists(log_dir));
  EXPECT_FALSE(std::filesystem::exists(save_dir));
}

// --profile_step_start: one whole Chrome trace per rank of the chosen steps, with the step's phases
// and ATen ops in it, and the same training (profiling stops only after the in-flight param
// gathers, which changes no value). bench/trace_ops_test reads such traces.
TEST(Pretrain, ProfilesTheChosenStepsOnEveryRank) {
  const std::string dir = TempDir() + "/profile";
  const std::vector<std::string> args = {"--steps=4", "--global_batch=8", "--eval_every=0",
                                         "--check_every=0"};
  std::vector<std::string> profiled = args;
  for (const char* flag : {"--profile_step_start=2", "--profile_step_end=3"}) {
    profiled.push_back(flag);
  }
  profiled.push_back("--profile_dir=" + dir);
  const RunResult plain = RunPretrain(args);
  const RunResult run = RunPretrain(profiled);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(JsonField(LastLine(run.out), "param_checksum"),
            JsonField(LastLine(plain.out), "param_checksum"));
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_THAT(files, ::testing::ElementsAre("rank0.steps2-3.pt.trace.json",
                                            "rank1.steps2-3.pt.trace.json"));
  for (const std::string& file : files) {
    const std::string trace = ReadFile(dir + "/" + file);
    EXPECT_THAT(trace, HasSubstr("\"traceEvents\"")) << file;
    for (const char* name : {"step/forward", "step/backward", "step/optimizer", "aten::mm"}) {
      EXPECT_THAT(trace, HasSubstr(absl::StrCat("\"name\": \"", name, "\""))) << file;
    }
    EXPECT_EQ(absl::StripTrailingAsciiWhitespace(trace).back(), '}') << file;  // written whole
  }
}

// Every Muon/AdamW setting reaches the optimizer: each flag, changed from its default, changes the
// trained params (their numerics against torch.optim are optimizers:oracle_test's). Clipping is
// made to bite (--max_grad_norm=0.01) so that --clip_mode matters, and the decays are large (0.5)
// so that dropping the embedding's (--no_weight_decay) shows.
TEST(Pretrain, EveryOptimizerFlagReachesTheOptimizer) {
  const std::vector<std::string> base = {"--nproc_per_node=1", "--steps=3", "--global_batch=4",
                                         "--eval_every=0", "--check_every=0",
                                         "--max_grad_norm=0.01", "--weight_decay=0.5",
                                         "--muon_weight_decay=0.5"};
  const RunResult plain = RunPretrain(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::string want = JsonField(LastLine(plain.out), "param_checksum");
  ASSERT_FALSE(want.empty());
  for (const char* flag :
       {"--muon_momentum=0.5", "--muon_nesterov=false", "--muon_scale_rule=match_rms_adamw",
        "--muon_scale_rule=spectral", "--muon_ns_steps=3", "--muon_ns_coefficients=polar_express",
        "--muon_ns_coefficients=2,-1.5,0.5", "--adam_beta1=0.5", "--adam_beta2=0.5",
        "--adam_eps=1e-3", "--clip_mode=exclude_muon", "--no_weight_decay=embedding*",
        "--muon_ns_coefficients=quintic", "--qk_clip_threshold=0.05"}) {
    std::vector<std::string> args = base;
    args.push_back(flag);
    const RunResult run = RunPretrain(args);
    ASSERT_EQ(run.exit_code, 0) << flag << ": " << run.err;
    EXPECT_NE(JsonField(LastLine(run.out), "param_checksum"), want) << flag;
  }
  // The form of Newton-Schulz for the fp32 iteration: tiny's gate/up blocks [192, 64] and fc2
  // [64, 192] qualify for the Gram form, so it changes the params' last bits against the direct
  // form; auto (the default) is the Gram form there.
  std::vector<std::string> checksums;
  for (const char* form :
       {"--muon_ns_form=direct", "--muon_ns_form=gram", "--muon_ns_form=auto"}) {
    std::vector<std::string> args = base;
    args.push_back("--muon_ns_dtype=fp32");
    args.push_back(form);
    const RunResult run = RunPretrain(args);
    ASSERT_EQ(run.exit_code, 0) << form << ": " << run.err;
    checksums.push_back(JsonField(LastLine(run.out), "param_checksum"));
  }
  EXPECT_NE(checksums[1], checksums[0]);
  EXPECT_EQ(checksums[2], checksums[1]);
}

// --retain_freed_memory only changes where the C allocator gets memory from: the same params,
// bitwise, with it off.
TEST(Pretrain, RetainFreedMemoryChangesNoBits) {
  std::vector<std::string> checksums;
  for (const char* flag : {"--retain_freed_memory=true", "--retain_freed_memory=false"}) {
    const RunResult run = RunPretrain({"--nproc_per_node=1", "--steps=3", "--global_batch=4",
                                       "--eval_every=0", "--check_every=0", flag});
    ASSERT_EQ(run.exit_code, 0) << flag << ": " << run.err;
    checksums.push_back(JsonField(LastLine(run.out), "param_checksum"));
    ASSERT_FALSE(checksums.back().empty()) << run.out;
  }
  EXPECT_EQ(checksums[0], checksums[1]);
}

// TensorBoard after a crash and a resume: a run logs steps 1-6 but its `latest` is rolled back to
// step 4 (as a crash after step 6 whose last committed checkpoint was step 4 would leave it), then a
// resume logs steps 5-8 into the same --log_dir. Read as TensorBoard reads a directory (files in
// name order; a restart record at step S drops what earlier files logged at steps >= S: TensorBoard's
// purge rule, which //integration:tensorboard_interop_test checks with TensorBoard itself): every train step
// appears once, and eval/loss at 0 (fresh start) and 8 (the end; the first run's end eval at 6 is
// purged, the resume's initial eval not logged again). Two files: their names never collide.
TEST(Pretrain, TensorBoardHasOneCurveAfterACrashAndResume) {
  const std::string dir = TempDir() + "/tb_resume_ckpt", tb = TempDir() + "/tb_resume";
  const std::vector<std::string> common = {"--steps=8", "--eval_every=0", "--check_every=0",
                                           "--global_batch=8", "--save_every=4",
                                           "--keep_checkpoints=3", "--save_dir=" + dir,
                                           "--log_dir=" + tb};
  std::vector<std::string> first = common;
  first.push_back("--stop_after=6");
  RunResult run = RunPretrain(first);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::ofstream(dir + "/latest", std::ios::trunc) << "step_000004\n";
  std::vector<std::string> again = common;
  again.push_back("--resume");
  run = RunPretrain(again);
  ASSERT_EQ(run.exit_code, 0) << run.err;

  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(tb)) {
    files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 2u);
  std::map<std::string, std::map<int64_t, int>> seen;  // tag -> step -> times logged
  for (const std::string& file : files) {
    ASSERT_OK_AND_ASSIGN(std::vector<TbEvent> events, ReadEventFile(file));
    for (const TbEvent& e : events) {
      if (e.session_start) {
        EXPECT_EQ(e.step, 5) << file;
        for (auto& [tag, steps] : seen) steps.erase(steps.lower_bound(e.step), steps.end());
      }
      for (const ScalarValue& v : e.scalars) ++seen[v.tag][e.step];
    }
  }
  ASSERT_EQ(seen["train/loss"].size(), 8u);
  for (const auto& [step, count] : seen["train/loss"]) EXPECT_EQ(count, 1) << "step " << step;
  EXPECT_EQ(seen["eval/loss"], (std::map<int64_t, int>{{0, 1}, {8, 1}}));
}

// Under a launcher's environment (here SLURM's for a one-task allocation, as plain srun sets it)
// an explicit --nproc_per_node that disagrees with the launcher is bad input, not silently
// ignored; one that agrees (srun's SLURM_TASKS_PER_NODE, this node's entry) is accepted.
TEST(Pretrain, NprocPerNodeUnderALauncherMustAgreeWithIt) {
  const std::vector<std::string> vars = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID",
                                         "SLURM_NODEID", "SLURM_LOCALID",
                                         "SLURM_TASKS_PER_NODE"};
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "1", 1);
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_NODEID", "0", 1);
  setenv("SLURM_TASKS_PER_NODE", "1", 1);
  const RunResult run = RunPretrain({"--nproc_per_node=2", "--steps=1"});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr("--nproc_per_node=2 is ignored under slurm, which runs 1 rank(s) "
                                 "on this node (SLURM_TASKS_PER_NODE=1, SLURM_NODEID=0; 1 in all); "
                                 "ask the launcher for the ranks (srun --ntasks-per-node)"));
  EXPECT_EQ(run.out, "");
  // Rank 2 of 6 on node 1 of "2(x3)": --nproc_per_node=2 agrees, so the next check speaks (a
  // global batch that does not divide), before any rendezvous.
  setenv("SLURM_PROCID", "2", 1);
  setenv("SLURM_NTASKS", "6", 1);
  setenv("SLURM_NODEID", "1", 1);
  setenv("SLURM_LOCALID", "0", 1);
  setenv("SLURM_TASKS_PER_NODE", "2(x3)", 1);
  const RunResult agreed = RunPretrain({"--nproc_per_node=2", "--steps=1", "--global_batch=7"});
  for (const std::string& var : vars) unsetenv(var.c_str());
  EXPECT_EQ(agreed.exit_code, 2) << agreed.err;
  EXPECT_THAT(agreed.err, Not(HasSubstr("nproc_per_node")));
  EXPECT_THAT(agreed.err, HasSubstr("--global_batch 7 is not divisible by world size 6"));
}

// --resume=auto: one command for the first start and the restart. The first run finds no
// checkpoint and starts afresh (stopping after step 4 with one); the same command then resumes it
// and ends where an uninterrupted run ends, bitwise. A bad value exits 2.
TEST(Pretrain, ResumeAutoStartsFreshThenResumes) {
  const std::string dir = TempDir() + "/auto";
  const std::vector<std::string> common = {"--steps=6", "--eval_every=0", "--check_every=0",
                                           "--global_batch=8", "--max_grad_norm=0"};
  std::vector<std::string> args = common;
  args.push_back("--resume=auto");
  args.push_back("--save_dir=" + dir);
  std::vector<std::string> first = args;
  first.push_back("--stop_after=4");
  const RunResult a = RunPretrain(first);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(JsonField(LastLine(a.out), "steps"), "4");
  const RunResult b = RunPretrain(args);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const RunResult straight = RunPretrain(common);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  EXPECT_EQ(JsonField(LastLine(b.out), "steps"), "6");
  EXPECT_EQ(JsonField(LastLine(b.out), "param_checksum"),
            JsonField(LastLine(straight.out), "param_checksum"));
  const RunResult bad = RunPretrain({"--resume=maybe", "--save_dir=" + dir});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--resume 'maybe': expected true, false or auto"));
}

// Resume equivalence at the same dp: 8 steps straight vs 4 steps (--stop_after=4, the lr schedule
// still spans --steps=8) + checkpoint, then --resume for steps 5..8 in a fresh process. Both end
// at the same loss and params, bitwise (param_checksum is printed with 17 digits). Then the same
// step-4 checkpoint resumed on 1 rank with 2 micro-batches, bitwise too: micro-batch m is rank
// m's slice of the same global batch (8 samples each), its loss is scaled by 1/2 before backward
// as rank m's gradient is by DDP (exact, a power of two), and the two halves are added once in
// either order (a + b = b + a), so the mean gradient is the same bits; AdamW is elementwise and
// Muon sees the same matrices. Clipping is off in all runs: the global norm is summed over other
// slices at another dp, which may change the clip factor's last bit.
TEST(Pretrain, ResumeContinuesBitwiseAtTheSameDpAndAtAnother) {
  const std::string dir = TempDir() + "/resume";
  const std::vector<std::string> common = {"--steps=8", "--eval_every=0", "--check_every=0",
                                           "--global_batch=16", "--warmup_steps=2",
                                           "--max_grad_norm=0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return RunPretrain(args);
  };
  RunResult straight = with({});
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  RunResult first = with({"--stop_after=4", "--save_every=2", "--keep_checkpoints=1",
                          "--save_dir=" + dir});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_EQ(JsonField(LastLine(first.out), "steps"), "4");
  EXPECT_EQ(ReadFile(dir + "/latest").find("step_000004"), 0u) << ReadFile(dir + "/latest");
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_000002"));  // keep 1
  // A copy for the dp 2 -> 1 resume below (the resume at dp 2 moves `latest` to step 8).
  const std::string dir1 = TempDir() + "/resume_dp1";
  std::filesystem::copy(dir, dir1, std::filesystem::copy_options::recursive);
  RunResult resumed = with({"--resume", "--save_dir=" + dir});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  const std::string a = LastLine(straight.out), b = LastLine(resumed.out);
  EXPECT_EQ(JsonField(b, "steps"), "8");
  EXPECT_EQ(JsonField(a, "final_loss"), JsonField(b, "final_loss"));
  EXPECT_EQ(JsonField(a, "eval_loss"), JsonField(b, "eval_loss"));
  ASSERT_FALSE(JsonField(a, "param_checksum").empty()) << a;
  EXPECT_EQ(JsonField(a, "param_checksum"), JsonField(b, "param_checksum"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/step_000008"));  // saved at the end

  RunResult one =
      with({"--resume", "--save_dir=" + dir1, "--nproc_per_node=1", "--micro_batches=2"});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  const std::string c = LastLine(one.out);
  EXPECT_EQ(JsonField(c, "world_size"), "1");
  EXPECT_EQ(JsonField(c, "steps"), "8");
  EXPECT_EQ(JsonField(c, "param_checksum"), JsonField(a, "param_checksum"));
  EXPECT_EQ(JsonField(c, "final_loss"), JsonField(a, "final_loss"));
}

// Diverging training (absurd learning rates within their accepted ranges, no clipping, no decay):
// after the first update every step has non-finite gradients and is skipped; after
// --max_consecutive_skips the run stops with exit 1, a message on every rank, and a final
// checkpoint; no JSON summary.
TEST(Pretrain, ConsecutiveNonFiniteStepsStopWithAFinalCheckpoint) {
  const std::string dir = TempDir() + "/diverge";
  RunResult run = RunPretrain({"--steps=40", "--eval_every=0", "--global_batch=16", "--lr=1e19",
                               "--adam_beta1=0", "--muon_lr=1e11", "--weight_decay=0",
                               "--muon_weight_decay=0",
                               "--max_grad_norm=0", "--max_consecutive_skips=3",
                               "--save_dir=" + dir});
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  EXPECT_THAT(run.err, HasSubstr("3 consecutive steps had non-finite gradients "
                                 "(--max_consecutive_skips=3); final checkpoint of step"))
      << run.err;
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("{\"steps\"")));
  const std::string latest = ReadFile(dir + "/latest");
  EXPECT_THAT(latest, HasSubstr("step_")) << latest;
  EXPECT_TRUE(std::filesystem::exists(dir + "/" + std::string(absl::StripAsciiWhitespace(latest)) +
                                      "/manifest.binpb"))
      << latest;
}

// A corrupted shard of the latest checkpoint: exit 2, the message names the file, no JSON line.
TEST(Pretrain, ResumeFromACorruptShardExitsWithTwo) {
  const std::string dir = TempDir() + "/corrupt";
  RunResult save = RunPretrain({"--steps=2", "--eval_every=0", "--global_batch=16",
                                "--save_dir=" + dir});
  ASSERT_EQ(save.exit_code, 0) << save.out << save.err;
  const std::string shard = dir + "/step_000002/rank1.safetensors";
  ASSERT_TRUE(std::filesystem::exists(shard));
  std::string bytes = ReadFile(shard);
  bytes[bytes.size() - 5] ^= 0x40;  // a bit in the last tensor's data
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  const std::string log_dir = TempDir() + "/corrupt_tb";
  RunResult run = RunPretrain({"--steps=4", "--eval_every=0", "--global_batch=16",
                               "--save_dir=" + dir, "--resume", "--log_dir=" + log_dir});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr("rank1.safetensors")) << run.err;
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("{\"steps\"")));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_000004"));
  EXPECT_FALSE(std::filesystem::exists(log_dir));
}

// An intact checkpoint from another setup is incompatible: exit 2 naming what differs.
TEST(Pretrain, ResumeWithAnotherSetupExitsWithTwo) {
  const std::string dir = TempDir() + "/other";
  RunResult save = RunPretrain({"--steps=4", "--stop_after=1", "--eval_every=0",
                                "--global_batch=16", "--save_dir=" + dir});
  ASSERT_EQ(save.exit_code, 0) << save.out << save.err;
  const std::string latest = ReadFile(dir + "/latest");
  ASSERT_EQ(latest.find("step_000001"), 0u) << latest;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--seq_len=16", "saved by 'model=tiny seq_len="},
      {"--global_batch=8", "loader resume: global batch 16 in the saved state, 8 now"},
      {"--steps=1", "nothing left to run"},
  };
  for (const auto& [arg, message] : cases) {
    std::vector<std::string> args = {"--steps=4", "--eval_every=0", "--global_batch=16",
                                     "--save_dir=" + dir, "--resume"};
    args.push_back(arg);  // wins over the same flag above
    RunResult run = RunPretrain(args);
    EXPECT_EQ(run.exit_code, 2) << arg << ": " << run.err;
    EXPECT_THAT(run.err, HasSubstr(message)) << arg;
    EXPECT_THAT(run.out, ::testing::Not(HasSubstr("{\"steps\""))) << arg;
  }
  EXPECT_EQ(ReadFile(dir + "/latest"), latest);
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_000002"));

  // Documents (the synthetic text's newline as the EOD: a document per sentence): a resume that
  // would attend across them, or count the loss otherwise, is another setup too.
  const std::string docs = TempDir() + "/other_documents";
  save = RunPretrain({"--steps=4", "--stop_after=1", "--eval_every=0", "--global_batch=16",
                      "--eod_token=10", "--save_dir=" + docs});
  ASSERT_EQ(save.exit_code, 0) << save.out << save.err;
  EXPECT_THAT(save.out, HasSubstr("documents end with token 10: attention and positions restart"));
  for (const char* arg : {"--reset_attention_mask=false", "--eod_mask_loss"}) {
    const RunResult run = RunPretrain({"--steps=4", "--eval_every=0", "--global_batch=16",
                                       "--eod_token=10", "--save_dir=" + docs, "--resume", arg});
    EXPECT_EQ(run.exit_code, 2) << arg << ": " << run.err;
    EXPECT_THAT(run.err, HasSubstr("documents=eod10,reset'")) << arg;
  }
  const RunResult same = RunPretrain({"--steps=2", "--eval_every=0", "--global_batch=16",
                                      "--eod_token=10", "--save_dir=" + docs, "--resume"});
  EXPECT_EQ(same.exit_code, 0) << same.err;
}

// distopt (ZeRO-1 AdamW for everything) resumes bitwise too.
TEST(Pretrain, DistOptResumeIsBitwise) {
  const std::string dir = TempDir() + "/distopt";
  const std::vector<std::string> common = {"--steps=4", "--eval_every=0", "--check_every=0",
                                           "--global_batch=16", "--warmup_steps=1",
                                           "--dist=distopt", "--optimizer=adamw"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return RunPretrain(args);
  };
  RunResult straight = with({});
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  RunResult first = with({"--stop_after=2", "--save_dir=" + dir});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  RunResult resumed = with({"--resume", "--save_dir=" + dir});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  const std::string a = LastLine(straight.out), b = LastLine(resumed.out);
  EXPECT_EQ(JsonField(a, "final_loss"), JsonField(b, "final_loss"));
  ASSERT_FALSE(JsonField(a, "param_checksum").empty()) << a;
  EXPECT_EQ(JsonField(a, "param_checksum"), JsonField(b, "param_checksum"));
}

// The replicated baseline saves and resumes like the sharded modes (its DDP all-reduces the grads
// and every rank steps every param; each rank writes the state of the elements its shards cover):
// bitwise at the same rank count, and, with 2 micro-batches on 1 rank, at another (clipping off,
// as in the dp 2 -> 1 resume above); the checkpoint holds the state once, not once per rank.
TEST(Pretrain, ReplicatedSavesAndResumesAtTheSameAndAnotherDp) {
  const std::string dir = TempDir() + "/replicated";
  const std::vector<std::string> common = {"--steps=4", "--eval_every=0", "--check_every=0",
                                           "--global_batch=16", "--warmup_steps=1",
                                           "--dist=replicated", "--max_grad_norm=0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return RunPretrain(args);
  };
  RunResult straight = with({});
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  RunResult first = with({"--stop_after=2", "--save_dir=" + dir});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  std::filesystem::copy(dir, dir + "_dp1", std::filesystem::copy_options::recursive);
  RunResult resumed = with({"--resume", "--save_dir=" + dir});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  RunResult one =
      with({"--resume", "--save_dir=" + dir + "_dp1", "--nproc_per_node=1", "--micro_batches=2"});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  const std::string a = LastLine(straight.out);
  ASSERT_FALSE(JsonField(a, "param_checksum").empty()) << a;
  for (const RunResult* run : {&resumed, &one}) {
    const std::string b = LastLine(run->out);
    EXPECT_EQ(JsonField(a, "final_loss"), JsonField(b, "final_loss")) << b;
    EXPECT_EQ(JsonField(a, "param_checksum"), JsonField(b, "param_checksum")) << b;
  }
  // The state is written once: the two ranks' shards of step 2 are about the same size (each
  // holds half of every bucket's state), not each the whole.
  const auto size0 = std::filesystem::file_size(dir + "_dp1/step_000002/rank0.safetensors");
  const auto size1 = std::filesystem::file_size(dir + "_dp1/step_000002/rank1.safetensors");
  EXPECT_LT(std::max(size0, size1), 2 * std::min(size0, size1)) << size0 << " vs " << size1;
}

}  // namespace
}  // namespace orthoshard::integration
