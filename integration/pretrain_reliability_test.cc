// `pretrain` as a hostile operator finds it: bad input that must exit 2 before any rank starts,
// checkpoints rolled back or left half-committed by a crash, a corrupted manifest, another dataset of
// the same size, and two runs aimed at one --save_dir. Each case reproduces a defect found by
// attacking the binary (see the issue tracker's "reliability, round two").
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/commit.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/testing/pretrain_runner.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::integration::testing::JsonField;
using ::orthoshard::integration::testing::LastLine;
using ::orthoshard::integration::testing::ReadFile;
using ::orthoshard::integration::testing::RunPretrain;
using ::orthoshard::integration::testing::RunResult;
using ::orthoshard::integration::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Exit 2, one line on stderr starting "pretrain: " and containing `message`, nothing on stdout.
void ExpectBadInput(const RunResult& run, const std::string& what, const std::string& message) {
  EXPECT_EQ(run.exit_code, 2) << what << ": " << run.err;
  EXPECT_EQ(run.out, "") << what;
  EXPECT_THAT(run.err, StartsWith("pretrain: ")) << what;
  EXPECT_THAT(run.err, HasSubstr(message)) << what;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << what << ": " << run.err;
}

// Each of these aborted (exit 134: std::__ios_failure, std::bad_alloc), trained on defaults, spawned
// threads it could not use, or failed late on one rank; now each exits 2 before any rank starts.
TEST(PretrainReliability, BadInputExitsTwoBeforeLaunch) {
  const std::string dir = TempDir() + "/bad";
  std::filesystem::create_directories(dir + "/a_dir.idx");
  std::filesystem::create_directories(dir + "/a_dir.bin");
  std::ofstream(dir + "/file") << "x";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--data=text:" + dir, "is a directory, expected a file"},
      {"--data=nanogpt:" + dir, "is a directory, expected a file"},
      {"--data=megatron:" + dir + "/a_dir", "is a directory, expected a file"},
      {"--data=text:/dev/zero", "'/dev/zero': is not a regular file"},
      {"--config=" + dir, "--config '" + dir + "': not a regular file"},
      {"--num_threads=100000", "--num_threads 100000 exceeds the"},
      {"--global_batch=67108864", "the logits of a micro-batch of 33554432 samples"},
      {"--eval_batches=1073741824", "the eval batches (lower --eval_batches"},
      {"--data=synthetic:100000000000", "the data (--data=synthetic:100000000000)"},
      {"--log_dir=" + dir + "/file/tb", "--log_dir '" + dir + "/file/tb': '" + dir +
                                            "/file' is not a directory"},
      {"--steps=-1", "--steps must be >= 1, got -1"},
      {"--distributed_timeout_s=0", "--distributed_timeout_s must be >= 1, got 0"},
  };
  for (const auto& [arg, message] : cases) {
    ExpectBadInput(RunPretrain({arg, "--save_dir=" + dir + "/must_not_exist"}), arg, message);
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/must_not_exist"));
  // `latest` that is a directory: a corrupt root (exit 2), not an I/O failure (exit 1).
  std::filesystem::create_directories(dir + "/root/latest");
  ExpectBadInput(RunPretrain({"--resume", "--save_dir=" + dir + "/root"}), "latest dir",
                 "latest is a directory, expected a file");
}

// `latest` moved back (an operator rolling back a loss spike), or left behind by a crash between
// committing a step's directory and moving `latest` (the same files on disk): the resumed run
// follows `latest`, says which newer checkpoints it ignores, and saves over them when it reaches
// their steps (each resume used to train up to step 6 and fail with "already committed"). It ends
// bitwise where a straight run ends.
TEST(PretrainReliability, ResumeFollowsLatestAndReplacesNewerCheckpoints) {
  const std::string dir = TempDir() + "/rollback";
  const std::vector<std::string> common = {"--steps=8", "--eval_every=0", "--check_every=0",
                                           "--global_batch=16", "--warmup_steps=2",
                                           "--save_every=2", "--keep_checkpoints=0"};
  std::vector<std::string> args = common;
  args.push_back("--save_dir=" + dir);
  const RunResult straight = RunPretrain(args);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  std::ofstream(dir + "/latest") << "step_000004\n";
  args.push_back("--resume");
  const RunResult resumed = RunPretrain(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr(absl::StrCat("warning: ", dir, " holds step_000006, "
                                                  "step_000008, newer than `latest` (step_000004)")));
  EXPECT_EQ(JsonField(LastLine(resumed.out), "param_checksum"),
            JsonField(LastLine(straight.out), "param_checksum"));
  EXPECT_EQ(ReadFile(dir + "/latest"), "step_000008\n");
  for (const char* leftover : {"step_000006.replaced", "step_000008.replaced",
                               "step_000006.tmp", "step_000008.tmp"}) {
    EXPECT_FALSE(std::filesystem::exists(dir + "/" + leftover)) << leftover;
  }
}

// A flipped bit anywhere in manifest.binpb (here: at the start, in the middle, in the trailer) is
// refused by --resume with exit 2; before the CRC trailer a flip in the step or the data position
// resumed silently elsewhere. (manifest_test flips every bit of a manifest through the same decoder;
// distributed_checkpoint_test flips a bit in every byte through the load that --resume runs.)
TEST(PretrainReliability, ACorruptManifestIsRefused) {
  const std::string dir = TempDir() + "/manifest";
  const RunResult save =
      RunPretrain({"--steps=2", "--eval_every=0", "--global_batch=16", "--save_dir=" + dir});
  ASSERT_EQ(save.exit_code, 0) << save.err;
  const std::string manifest = dir + "/step_000002/manifest.binpb";
  const std::string good = ReadFile(manifest);
  ASSERT_GT(good.size(), 100u);
  for (const size_t byte : {size_t{3}, good.size() / 2, good.size() - 6}) {
    std::string bad = good;
    bad[byte] ^= 0x04;
    std::ofstream(manifest, std::ios::binary | std::ios::trunc) << bad;
    ExpectBadInput(RunPretrain({"--steps=4", "--eval_every=0", "--global_batch=16", "--resume",
                                "--save_dir=" + dir}),
                   absl::StrCat("flip in byte ", byte), "manifest.binpb");
  }
}

// As ExpectBadInput, for what only the ranks can find (after the launch): each rank prints the
// error, the launcher a last line naming the first rank that failed; still exit 2 and no JSON.
void ExpectRefusedByTheRanks(const RunResult& run, const std::string& what,
                             const std::string& message) {
  EXPECT_EQ(run.exit_code, 2) << what << ": " << run.err;
  EXPECT_THAT(run.out, Not(HasSubstr("{\"steps\""))) << what;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(run.err, HasSubstr(absl::StrCat("[rank ", rank, "] pretrain: "))) << what;
  }
  EXPECT_THAT(run.err, HasSubstr(message)) << what;
  EXPECT_THAT(run.err, HasSubstr("failed first with exit code 2")) << what;
}

// Another dataset of the same size: the resume is refused (it trained on, and the loss jumped from
// about 2 to 6.5).
TEST(PretrainReliability, ResumeOnAnotherDatasetOfTheSameSizeIsRefused) {
  const std::string dir = TempDir() + "/data";
  std::filesystem::create_directories(dir);
  for (const auto& [name, seed] : {std::pair<const char*, int>{"a.txt", 1}, {"b.txt", 2}}) {
    std::mt19937 rng(seed);
    std::string text(40000, ' ');
    for (char& c : text) c = static_cast<char>('a' + rng() % 26);
    std::ofstream(dir + "/" + name) << text;
  }
  const std::vector<std::string> common = {"--eval_every=0", "--global_batch=16",
                                           "--save_dir=" + dir + "/ckpt"};
  std::vector<std::string> args = common;
  args.insert(args.end(), {"--steps=4", "--stop_after=2", "--data=text:" + dir + "/a.txt"});
  ASSERT_EQ(RunPretrain(args).exit_code, 0);
  args = common;
  args.insert(args.end(), {"--steps=4", "--resume", "--data=text:" + dir + "/b.txt"});
  ExpectRefusedByTheRanks(RunPretrain(args), "other data",
                          "data fingerprint (another dataset of the same size?)");
}

// One run per --save_dir: another process holding it (here this test, through the same lock) makes
// pretrain exit 2 naming the holder, before it launches; one run's garbage collection used to delete
// the other's in-flight save.
TEST(PretrainReliability, ASaveDirInUseIsRefused) {
  const std::string dir = TempDir() + "/locked";
  absl::StatusOr<checkpoint::RootLock> lock = checkpoint::LockRoot(dir, "pretrain_reliability_test");
  ASSERT_OK(lock.status());
  ExpectBadInput(RunPretrain({"--steps=2", "--save_dir=" + dir}), "locked",
                 absl::StrCat("is in use by another run (pid ", getpid(), " on host "));
  EXPECT_FALSE(std::filesystem::exists(dir + "/latest"));
}

// Round four: flags accepted before launch that then failed every rank or did nothing. A --route
// that cannot apply to the model failed only after launch, in 3 lines, with --save_dir made; MoE
// loss weights of 1e39 or 1e300 were accepted and every step was skipped; flags of another mode
// (--muon_tp_mode at tp 1, --fsdp_grad_syncs_in_flight outside fsdp) were silently ignored. Each
// now exits 2 before any rank starts, in one line, with nothing made.
TEST(PretrainReliability, FlagsThatCannotWorkAreRefusedBeforeLaunch) {
  const std::string save_dir = TempDir() + "/refused_save_dir";
  const std::string keep = " --save_dir=" + save_dir;
  testing::ExpectRefusedBeforeLaunch({
      {"--route='*norm*=muon'" + keep,
       "pretrain: --route '*norm*=muon': param 'layers.0.attn_norm.weight': override '*norm*' "
       "routes it to muon, which needs a 2-D matrix, got shape [64]"},
      {"--route='*experts*=adamw'" + keep,
       "--route '*experts*=adamw': '*experts*' matches no param of model 'tiny'"},
      {"--model=moe-tiny --moe_aux_loss_coeff=1e39" + keep,
       "pretrain: --moe_aux_loss_coeff must be in [0, 2^32] or -1, got 1e+39"},
      {"--model=moe-tiny --moe_z_loss_coeff=1e300" + keep,
       "pretrain: --moe_z_loss_coeff must be in [0, 2^32] or -1, got 1e+300"},
      {"--model=moe-tiny --moe_z_loss_coeff=nan", "--moe_z_loss_coeff must be in [0, 2^32] or -1"},
      {"--lr=0", "pretrain: --lr must be in (0, 2^64], got 0"},
      {"--muon_lr=-0.02", "pretrain: --muon_lr must be in (0, 2^39], got -0.02"},
      {"--muon_tp_mode=owner" + keep,
       "pretrain: --muon_tp_mode needs --tp > 1 and --optimizer=muon"},
      {"--fsdp_grad_syncs_in_flight=2" + keep,
       "pretrain: --fsdp_grad_syncs_in_flight needs --dist=fsdp; it does nothing here"},
      {"--fsdp_grad_accum=full", "pretrain: --fsdp_grad_accum needs --dist=fsdp"},
      {"--prefetch_params=false", "pretrain: --prefetch_params needs --dist=fsdp"},
      {"--reshard_after_forward=false", "pretrain: --reshard_after_forward needs --dist=fsdp"},
      {"--dist=replicated --overlap_param_gather=false",
       "pretrain: --overlap_param_gather needs --dist=layerwise, distopt or fsdp"},
      {"--recompute_layers=-1", "pretrain: --recompute_layers needs --recompute=full or"},
      {"--ep=1", "need a mixture-of-experts model, but 'tiny' is dense"},
      {"--muon_extra_scale=2", "pretrain: --muon_extra_scale needs --muon_scale_rule=spectral"},
      {"--optimizer=adamw --route='*=adamw'", "pretrain: --route needs --optimizer=muon"},
      {"--decay_steps=3", "pretrain: --decay_steps needs --schedule=wsd"},
      {"--grad_reduce_in_fp32=true", "pretrain: --grad_reduce_in_fp32 needs --precision=bf16"},
  });
  EXPECT_FALSE(std::filesystem::exists(save_dir));
}

}  // namespace
}  // namespace orthoshard::integration
