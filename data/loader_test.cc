#include "data/loader.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "data/testing/dataset_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::data {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::shared_ptr<const TokenDataset> Counting(int64_t n) {
  auto data = std::make_shared<TokenDataset>();
  data->name = "counting";
  data->vocab_size = static_cast<int64_t>(n);
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0);
  data->tokens = TokenStream(std::move(tokens));
  data->max_token = n - 1;
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
  std::vector<int32_t> changed = data->tokens.ToVector();
  changed[250] += 1;
  other->tokens = TokenStream(std::move(changed));
  ASSERT_OK_AND_ASSIGN(DataLoader resumed, DataLoader::Create(other, Options(0, 2)));
  EXPECT_THAT(resumed.Restore(saved.state()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("loader resume: data fingerprint (another dataset of the same "
                                 "size?)")));
  ASSERT_OK_AND_ASSIGN(DataLoader same, DataLoader::Create(Counting(500), Options(0, 2)));
  EXPECT_OK(same.Restore(saved.state()));
}

// Data read from a file carries its CRC-32C, so a one-token change anywhere (here between the
// blocks the fingerprint samples) is refused at resume; a state saved without the CRC resumes on
// the sampled fingerprint alone.
TEST(DataLoader, ResumeCoversEveryByteOfAFile) {
  const std::string path = testing::TempPath("loader_full.bin");
  std::vector<uint16_t> tokens = testing::Ramp(200000, 50000);
  const auto write = [&] {
    std::string bytes;
    for (uint16_t t : tokens) testing::Put<uint16_t>(&bytes, t);
    testing::WriteFile(path, bytes);
  };
  write();
  ASSERT_OK_AND_ASSIGN(TokenDataset original, LoadNanoGptFile(path));
  ASSERT_OK_AND_ASSIGN(DataLoader saved, DataLoader::Create(
                                             std::make_shared<TokenDataset>(original), Options(0, 1)));
  saved.Next();
  const LoaderState state = saved.state();
  ASSERT_TRUE(state.content_crc32c.has_value());
  EXPECT_THAT(state.Serialize(), HasSubstr(" content="));
  ASSERT_OK_AND_ASSIGN(LoaderState parsed, LoaderState::Parse(state.Serialize()));
  EXPECT_EQ(parsed.content_crc32c, state.content_crc32c);

  tokens[2000] += 1;  // sampled blocks: [0, 1024), [3158, 4182), ...
  write();
  ASSERT_OK_AND_ASSIGN(TokenDataset changed, LoadNanoGptFile(path));
  ASSERT_OK_AND_ASSIGN(DataLoader resumed, DataLoader::Create(
                                               std::make_shared<TokenDataset>(changed), Options(0, 1)));
  EXPECT_EQ(resumed.state().data_fingerprint, state.data_fingerprint);
  EXPECT_THAT(resumed.Restore(parsed),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("loader resume: content CRC-32C (the data's files changed)")));
  LoaderState old_format = parsed;
  old_format.content_crc32c.reset();
  EXPECT_THAT(old_format.Serialize(), ::testing::Not(HasSubstr("content")));
  EXPECT_OK(resumed.Restore(old_format));
}

// Documents ending in EOD (0): segments and positions restart after each EOD, the target
// predicted from an EOD is ignored with mask_eod_loss, and CountedTargets is the sum of every
// rank's counted targets.
TEST(DataLoader, DocumentsAndEodLossMask) {
  auto data = std::make_shared<TokenDataset>();
  data->name = "docs";
  // Documents of 3, 1, 4 and 2 tokens, each followed by its EOD, then again.
  std::vector<int32_t> tokens;
  for (int round = 0; round < 8; ++round) {
    for (int length : {3, 1, 4, 2}) {
      for (int i = 0; i < length; ++i) tokens.push_back(1 + (round + i) % 9);
      tokens.push_back(0);
    }
  }
  data->tokens = TokenStream(tokens);
  data->max_token = 9;
  data->eod_token = 0;
  LoaderOptions o;
  o.seq_len = 8;
  o.micro_batch_size = 2;
  o.micro_batches = 2;
  o.shuffle = false;
  o.eod_token = 0;
  o.reset_at_documents = true;
  o.mask_eod_loss = true;
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, o));
  const std::vector<MicroBatch> batches = loader.BatchAt(0);
  const MicroBatch& b = batches[0];
  // Row 0 is window 0: tokens 1 2 3 EOD 1 EOD 1 2 | next 3.
  EXPECT_THAT(std::vector<int64_t>(b.inputs.begin(), b.inputs.begin() + 8),
              ElementsAre(1, 2, 3, 0, 1, 0, 1, 2));
  EXPECT_THAT(std::vector<int64_t>(b.targets.begin(), b.targets.begin() + 8),
              ElementsAre(2, 3, 0, kIgnoreTarget, 0, kIgnoreTarget, 2, 3));
  EXPECT_THAT(std::vector<int64_t>(b.segments.begin(), b.segments.begin() + 8),
              ElementsAre(0, 0, 0, 0, 1, 1, 2, 2));
  EXPECT_THAT(std::vector<int64_t>(b.positions.begin(), b.positions.begin() + 8),
              ElementsAre(0, 1, 2, 3, 0, 1, 0, 1));
  EXPECT_TRUE(b.has_boundaries);
  int64_t counted = 0;
  for (const MicroBatch& m : batches) {
    int64_t kept = 0;
    for (int64_t t : m.targets) kept += t != kIgnoreTarget;
    EXPECT_EQ(m.counted_targets, kept);
    counted += kept;
  }
  EXPECT_EQ(loader.CountedTargets(0), counted);  // one rank: its batches are the global batch
  // At two ranks each rank's part adds up to the same global count.
  int64_t over_ranks = 0;
  for (int rank = 0; rank < 2; ++rank) {
    LoaderOptions r = o;
    r.world_size = 2;
    r.rank = rank;
    r.micro_batches = 1;
    ASSERT_OK_AND_ASSIGN(DataLoader part, DataLoader::Create(data, r));
    EXPECT_EQ(part.CountedTargets(0), counted);
    for (const MicroBatch& m : part.BatchAt(0)) over_ranks += m.counted_targets;
  }
  EXPECT_EQ(over_ranks, counted);
  // Without the loss mask every target counts; without reset no segments are given.
  o.mask_eod_loss = false;
  o.reset_at_documents = false;
  ASSERT_OK_AND_ASSIGN(DataLoader plain, DataLoader::Create(data, o));
  EXPECT_EQ(plain.CountedTargets(0), 4 * 8);
  EXPECT_TRUE(plain.BatchAt(0)[0].segments.empty());
  o.eod_token = -1;
  o.mask_eod_loss = true;
  EXPECT_THAT(DataLoader::Create(data, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mask_eod_loss needs an EOD token")));
}

// Documents from the dataset's index (a Megatron .idx) without EOD tokens: segments and positions
// restart at each document end, also at a window's first and last token; CountedTargets counts all.
TEST(DataLoader, DocumentsFromTheIndex) {
  auto data = std::make_shared<TokenDataset>();
  data->name = "indexed";
  std::vector<int32_t> tokens(33);
  std::iota(tokens.begin(), tokens.end(), 1);
  data->tokens = TokenStream(tokens);
  data->max_token = 33;
  data->document_ends = {3, 4, 8, 16, 17, 33};  // documents [0,3) [3,4) [4,8) [8,16) [16,17) [17,33)
  LoaderOptions o;
  o.seq_len = 8;
  o.micro_batch_size = 4;
  o.shuffle = false;
  o.reset_at_documents = true;
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, o));
  const MicroBatch b = loader.BatchAt(0)[0];
  ASSERT_EQ(b.rows, 4);
  // Window 0: tokens 0..7 (ends after 2, 3, 7); window 1: 8..15 (ends after 15); window 2: 16..23
  // (ends after 16); window 3: 24..31 (none).
  EXPECT_THAT(std::vector<int64_t>(b.segments.begin(), b.segments.end()),
              ElementsAre(0, 0, 0, 1, 2, 2, 2, 2,  //
                          0, 0, 0, 0, 0, 0, 0, 0,  //
                          0, 1, 1, 1, 1, 1, 1, 1,  //
                          0, 0, 0, 0, 0, 0, 0, 0));
  EXPECT_THAT(std::vector<int64_t>(b.positions.begin(), b.positions.end()),
              ElementsAre(0, 1, 2, 0, 0, 1, 2, 3,  //
                          0, 1, 2, 3, 4, 5, 6, 7,  //
                          0, 0, 1, 2, 3, 4, 5, 6,  //
                          0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_TRUE(b.has_boundaries);
  EXPECT_EQ(b.counted_targets, 32);
  EXPECT_EQ(loader.CountedTargets(0), 32);

  // Without reset_at_documents the rows carry no documents; without an index or EOD it is refused.
  o.reset_at_documents = false;
  ASSERT_OK_AND_ASSIGN(DataLoader plain, DataLoader::Create(data, o));
  EXPECT_TRUE(plain.BatchAt(0)[0].segments.empty());
  o.reset_at_documents = true;
  data->document_ends = {33};
  EXPECT_THAT(DataLoader::Create(data, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("reset_at_documents needs an EOD token (eod_token >= 0) or a "
                                 "document index; dataset 'indexed' has neither")));
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
}  // namespace orthoshard::data
