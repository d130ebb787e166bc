#include "integration/loader.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

std::shared_ptr<const TokenDataset> Counting(int64_t n) {
  auto data = std::make_shared<TokenDataset>();
  data->name = "counting";
  data->vocab_size = static_cast<int64_t>(n);
  data->tokens.resize(n);
  std::iota(data->tokens.begin(), data->tokens.end(), 0);
  return data;
}

LoaderOptions Options(int rank, int world_size) {
  LoaderOptions o;
  o.seq_len = 4;
  o.micro_batch_size = 2;
  o.micro_batches = 3;
  o.rank = rank;
  o.world_size = world_size;
  o.seed = 17;
  return o;
}

TEST(DataLoader, WindowsAndShiftedTargets) {
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(Counting(101), Options(0, 1)));
  EXPECT_EQ(loader.num_windows(), 25);
  EXPECT_EQ(loader.global_batch(), 6);
  const std::vector<MicroBatch> step = loader.Next();
  ASSERT_EQ(step.size(), 3u);
  for (const MicroBatch& b : step) {
    ASSERT_EQ(b.rows, 2);
    ASSERT_EQ(b.cols, 4);
    for (int64_t r = 0; r < b.rows; ++r) {
      for (int64_t t = 0; t < b.cols; ++t) {
        EXPECT_EQ(b.inputs[r * 4 + t], b.windows[r] * 4 + t);  // token value == position
        EXPECT_EQ(b.targets[r * 4 + t], b.inputs[r * 4 + t] + 1);
      }
    }
  }
}

// Every rank's slices are disjoint and together make exactly the world_size = 1 global batch.
TEST(DataLoader, RankSlicesPartitionTheGlobalBatch) {
  const auto data = Counting(1000);
  for (int world : {1, 2, 3}) {
    LoaderOptions single = Options(0, 1);
    single.micro_batches = world * 3;  // same global batch of world * 3 * 2 samples
    ASSERT_OK_AND_ASSIGN(DataLoader reference, DataLoader::Create(data, single));
    for (int64_t step = 0; step < 20; ++step) {
      std::vector<int64_t> want_ids, want_windows;
      for (const MicroBatch& b : reference.BatchAt(step)) {
        want_ids.insert(want_ids.end(), b.sample_ids.begin(), b.sample_ids.end());
        want_windows.insert(want_windows.end(), b.windows.begin(), b.windows.end());
      }
      std::vector<int64_t> ids, windows;
      for (int rank = 0; rank < world; ++rank) {
        ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, Options(rank, world)));
        for (const MicroBatch& b : loader.BatchAt(step)) {
          ids.insert(ids.end(), b.sample_ids.begin(), b.sample_ids.end());
          windows.insert(windows.end(), b.windows.begin(), b.windows.end());
        }
      }
      EXPECT_EQ(ids, want_ids) << "world " << world << " step " << step;
      EXPECT_EQ(windows, want_windows);
      EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), ids.size());  // disjoint
    }
  }
}

TEST(DataLoader, EachEpochIsAPermutation) {
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(Counting(241), Options(0, 1)));
  ASSERT_EQ(loader.num_windows(), 60);  // 10 steps of 6 samples per epoch
  std::vector<int64_t> epoch0, epoch1;
  for (int step = 0; step < 20; ++step) {
    for (const MicroBatch& b : loader.Next()) {
      (step < 10 ? epoch0 : epoch1).insert((step < 10 ? epoch0 : epoch1).end(), b.windows.begin(),
                                           b.windows.end());
    }
  }
  std::vector<int64_t> all(60);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_NE(epoch0, all);     // shuffled
  EXPECT_NE(epoch0, epoch1);  // a new order each epoch
  std::sort(epoch0.begin(), epoch0.end());
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(epoch0, all);
  EXPECT_EQ(epoch1, all);
}

TEST(DataLoader, NoShuffleIsInOrder) {
  LoaderOptions o = Options(1, 2);
  o.shuffle = false;
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(Counting(1000), o));
  const std::vector<MicroBatch> step = loader.Next();
  EXPECT_EQ(step[0].windows, (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(step[2].windows, (std::vector<int64_t>{10, 11}));
}

TEST(DataLoader, ResumeContinuesTheSameStream) {
  const auto data = Counting(500);
  ASSERT_OK_AND_ASSIGN(DataLoader straight, DataLoader::Create(data, Options(1, 2)));
  ASSERT_OK_AND_ASSIGN(DataLoader first, DataLoader::Create(data, Options(1, 2)));
  for (int i = 0; i < 7; ++i) {
    straight.Next();
    first.Next();
  }
  const std::string saved = first.state().Serialize();
  EXPECT_THAT(saved, ::testing::MatchesRegex("loader v2 step=7 seed=17 seq_len=4 global_batch=12 "
                                             "num_windows=124 shuffle=1 data=[0-9a-f]{8}"));
  ASSERT_OK_AND_ASSIGN(LoaderState parsed, LoaderState::Parse(saved));
  ASSERT_OK_AND_ASSIGN(DataLoader resumed, DataLoader::Create(data, Options(1, 2)));
  ASSERT_OK(resumed.Restore(parsed));
  for (int i = 0; i < 30; ++i) {  // crosses epoch boundaries
    const std::vector<MicroBatch> a = straight.Next(), b = resumed.Next();
    ASSERT_EQ(a.size(), b.size());
    for (size_t m = 0; m < a.size(); ++m) {
      EXPECT_EQ(a[m].inputs, b[m].inputs);
      EXPECT_EQ(a[m].sample_ids, b[m].sample_ids);
    }
  }
}

TEST(DataLoader, ResumeMismatchesAreRejected) {
  const auto data = Counting(500);
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, Options(0, 2)));
  LoaderState state = loader.state();
  state.seq_len = 8;
  EXPECT_THAT(loader.Restore(state), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              HasSubstr("loader resume: seq_len 8 in the saved "
                                                        "state, 4 now")));
  state = loader.state();
  state.global_batch = 6;
  EXPECT_THAT(loader.Restore(state),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("loader resume: global batch 6 in the saved state, 12 now")));
  state = loader.state();
  state.num_windows = 3;
  EXPECT_THAT(loader.Restore(state),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("window count (dataset size) 3 in the saved state, 124 now")));
  state = loader.state();
  state.seed = 1;
  EXPECT_THAT(loader.Restore(state), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              HasSubstr("seed 1 in the saved state, 17 now")));
  EXPECT_THAT(LoaderState::Parse("loader v1 step=7 seed=17 seq_len=4 global_batch=12 "
                                 "num_windows=124 shuffle=1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected \"loader v2\"")));
  EXPECT_THAT(LoaderState::Parse("loader v2 step=x seed=1 seq_len=4 global_batch=1 "
                                 "num_windows=2 shuffle=1 data=00000000"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("loader state: malformed field \"step=x\"")));
  EXPECT_THAT(LoaderState::Parse("loader v2 step=1 seed=1 seq_len=4 global_batch=1 "
                                 "num_windows=2 shuffle=1 data=xyz"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("loader state: malformed field \"data=xyz\"")));
}

// Another dataset of the same size (one token changed in the middle of a block the fingerprint
// samples, or anywhere in a dataset shorter than 64 blocks) is refused at resume.
TEST(DataLoader, ResumeOnOtherDataOfTheSameSizeIsRejected) {
  const auto data = Counting(500);
  ASSERT_OK_AND_ASSIGN(DataLoader saved, DataLoader::Create(data, Options(0, 2)));
  saved.Next();
  auto other = std::make_shared<TokenDataset>(*data);
  other->tokens[250] += 1;
  ASSERT_OK_AND_ASSIGN(DataLoader resumed, DataLoader::Create(other, Options(0, 2)));
  EXPECT_THAT(resumed.Restore(saved.state()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("loader resume: data fingerprint (another dataset of the same "
                                 "size?)")));
  ASSERT_OK_AND_ASSIGN(DataLoader same, DataLoader::Create(Counting(500), Options(0, 2)));
  EXPECT_OK(same.Restore(saved.state()));
}

TEST(DataLoader, CreateErrors) {
  EXPECT_THAT(DataLoader::Create(Counting(4), Options(0, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dataset 'counting' has 4 tokens, seq_len 4 needs at least 5")));
  EXPECT_THAT(DataLoader::Create(Counting(100), Options(2, 2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data loader: rank 2 is outside [0, 2)")));
  LoaderOptions o = Options(0, 1);
  o.micro_batches = 0;
  EXPECT_THAT(DataLoader::Create(Counting(100), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be >= 1")));
}

}  // namespace
}  // namespace orthoshard::integration
