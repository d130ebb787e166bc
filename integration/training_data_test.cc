// LoadTrainingData: the datasets and vocabulary a run's config resolves to.
#include "integration/training_data.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "data/testing/dataset_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::data::testing::MegatronIdx;
using ::orthoshard::data::testing::Put;
using ::orthoshard::data::testing::Ramp;
using ::orthoshard::data::testing::TempPath;
using ::orthoshard::data::testing::WriteFile;
using ::orthoshard::data::testing::WritePrepared;
using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TrainingData, VocabularyEodAndValSplitComeFromAPreparedDirectory) {
  const std::string dir = TempPath("prepared");
  WritePrepared(dir, 300, 299, Ramp(200, 300), Ramp(80, 300));
  TrainerConfig c;
  c.model = "tiny";  // vocab 256, seq_len 64
  c.data = "prepared:" + dir;
  c.seq_len = 16;
  ASSERT_OK_AND_ASSIGN(TrainingData td, LoadTrainingData(c));
  EXPECT_EQ(td.model.config.vocab_size, 300);
  EXPECT_EQ(td.model.vocab_source, "--data=prepared:" + dir);
  EXPECT_EQ(td.eod_token, 299);
  EXPECT_EQ(td.train->tokens.size(), 200);
  EXPECT_EQ(td.eval->tokens.size(), 80);
  EXPECT_EQ(td.eval_source, "the data's val split");

  // --vocab_size may pad the vocabulary, never cut it.
  c.vocab_size = 384;
  ASSERT_OK_AND_ASSIGN(td, LoadTrainingData(c));
  EXPECT_EQ(td.model.config.vocab_size, 384);
  c.vocab_size = 256;
  EXPECT_THAT(LoadTrainingData(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--vocab_size 256 is below the vocabulary of --data=prepared:" +
                                 dir + " (300)")));
  c.vocab_size = 0;
  c.eod_token = 5;
  EXPECT_THAT(LoadTrainingData(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--eod_token 5 differs from the EOD token 299")));
  c.eod_token = -1;
  c.eval_data = "megatron:" + dir + "/train";
  ASSERT_OK_AND_ASSIGN(td, LoadTrainingData(c));
  EXPECT_EQ(td.eval->tokens.size(), 200);
  EXPECT_EQ(td.eval_source, "--eval_data=megatron:" + dir + "/train");
}

TEST(TrainingData, TokensBeyondTheVocabularySayWhatFits) {
  const std::string prefix = TempPath("big_ids");
  std::vector<uint16_t> ids = Ramp(200, 250);
  ids[17] = 50256;  // a GPT-2 token id
  WriteFile(prefix + ".idx", MegatronIdx(8, 2, {200}, {0, 1}));
  std::string bin;
  for (uint16_t t : ids) Put<uint16_t>(&bin, t);
  WriteFile(prefix + ".bin", bin);
  TrainerConfig c;
  c.model = "tiny";
  c.data = "megatron:" + prefix;
  c.seq_len = 16;
  EXPECT_THAT(LoadTrainingData(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds token id 50256, so the model needs a vocabulary of at "
                                 "least 50257; it has 256 (from --model=tiny). Pass "
                                 "--vocab_size=50257, or a --model preset whose vocabulary is "
                                 "large enough: gpt2-124m (50304)")));
  c.vocab_size = 50257;
  c.eval_fraction = 0.2;
  ASSERT_OK_AND_ASSIGN(TrainingData td, LoadTrainingData(c));
  EXPECT_EQ(td.model.config.vocab_size, 50257);
  EXPECT_EQ(td.eod_token, -1);
  EXPECT_EQ(td.train->tokens.size() + td.eval->tokens.size(), 200);
  c.eod_mask_loss = true;
  EXPECT_THAT(LoadTrainingData(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--eod_mask_loss needs an end-of-document token")));
}

}  // namespace
}  // namespace orthoshard::integration
