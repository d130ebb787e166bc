// pretrain --sample_order=documents end to end: it trains on another sample sequence than windows,
// resumes bitwise from a mid-run checkpoint (the loader's state carries the order), and a resume
// with the other order, or the order on data without documents, is refused.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/testing/pretrain_runner.h"

namespace orthoshard::integration {
namespace {

using testing::ExpectRefusedBeforeLaunch;
using testing::ExpectSameTraining;
using testing::JsonField;
using testing::Pretrain;
using testing::RunPretrain;
using testing::RunResult;
using testing::TempDir;
using testing::TrainingRun;
using testing::With;
using ::testing::HasSubstr;

// The synthetic text's newline (10) ends its documents: a document per sentence.
const std::vector<std::string> kDocuments = {
    "--steps=4",       "--global_batch=16",         "--eval_every=0", "--check_every=0",
    "--warmup_steps=1", "--sample_order=documents", "--eod_token=10"};

TEST(SampleOrderPretrain, DocumentsTrainAndResumeBitwise) {
  const TrainingRun straight = Pretrain(kDocuments);
  const TrainingRun windows = Pretrain(With(kDocuments, {"--sample_order=windows"}));
  EXPECT_NE(JsonField(straight.json, "initial_loss"), JsonField(windows.json, "initial_loss"));

  const std::string dir = TempDir() + "/documents";
  Pretrain(With(kDocuments, {"--stop_after=2", "--save_dir=" + dir}));
  const RunResult other = RunPretrain(With(kDocuments, {"--resume", "--save_dir=" + dir,
                                                        "--sample_order=windows"}));
  EXPECT_EQ(other.exit_code, 2) << other.err;
  EXPECT_THAT(other.err,
              HasSubstr("loader resume: sample_order documents in the saved state, windows now"));
  const TrainingRun resumed = Pretrain(With(kDocuments, {"--resume", "--save_dir=" + dir}));
  ExpectSameTraining(straight, resumed, "resumed", {"steps", "final_loss", "param_checksum"});
}

TEST(SampleOrderPretrain, DataWithoutDocumentsIsRefused) {
  // The synthetic corpus without --eod_token is one document.
  ExpectRefusedBeforeLaunch({{"--steps=1 --eval_every=0 --sample_order=documents",
                              "--sample_order=documents: data loader: sample_order documents "
                              "needs documents (EOD tokens or a document index)"}});
}

}  // namespace
}  // namespace orthoshard::integration
