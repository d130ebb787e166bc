// SampleOrder::kDocuments (Megatron's document-shuffled sample index): every epoch covers every
// document whole, once, in a seeded order that differs per epoch; segments, positions, the EOD loss
// mask and CountedTargets follow the reordered stream; ranks, resume and the saved state.
#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "data/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::data {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kS = 8;
constexpr int64_t kWindows = 60;

// 1 + kWindows * kS tokens, token i == i, cut into documents of 1 to 19 tokens by the index.
std::shared_ptr<TokenDataset> Indexed() {
  auto data = std::make_shared<TokenDataset>();
  data->name = "indexed";
  const int64_t n = 1 + kWindows * kS;
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0);
  data->tokens = TokenStream(std::move(tokens));
  data->max_token = n - 1;
  std::mt19937_64 rng(5);
  for (int64_t end = 0; end < n;) {
    end = std::min<int64_t>(n, end + 1 + static_cast<int64_t>(rng() % 19));
    data->document_ends.push_back(end);
  }
  return data;
}

LoaderOptions Options(int rank, int world_size, int64_t micro_batches) {
  LoaderOptions o;
  o.seq_len = kS;
  o.micro_batch_size = 2;
  o.micro_batches = micro_batches;
  o.rank = rank;
  o.world_size = world_size;
  o.seed = 17;
  o.sample_order = SampleOrder::kDocuments;
  o.reset_at_documents = true;
  return o;
}

// The documents (index into document_ends) in the order one epoch's stream holds them, read back
// from the batches of the epoch: the windows in stream order, then checked to be whole documents
// one after another. Also checks every row's segments and positions against the documents.
std::vector<int64_t> EpochDocuments(const DataLoader& loader, const TokenDataset& data,
                                    int64_t epoch) {
  const std::vector<int64_t>& ends = data.document_ends;
  std::vector<int64_t> stream(kWindows * kS + 1, -1);
  std::vector<bool> input(stream.size(), false);
  const int64_t steps = kWindows / loader.global_batch();
  for (int64_t step = epoch * steps; step < (epoch + 1) * steps; ++step) {
    for (const MicroBatch& b : loader.BatchAt(step)) {
      for (int64_t r = 0; r < b.rows; ++r) {
        for (int64_t t = 0; t < kS; ++t) {
          const int64_t token = b.inputs[r * kS + t];
          EXPECT_FALSE(input[b.windows[r] * kS + t]) << "window " << b.windows[r] << " twice";
          input[b.windows[r] * kS + t] = true;
          stream[b.windows[r] * kS + t] = token;
          // Segments restart exactly after a document's last token.
          const bool last = std::binary_search(ends.begin(), ends.end(), token + 1);
          if (t + 1 < kS) {
            EXPECT_EQ(b.segments[r * kS + t + 1], b.segments[r * kS + t] + (last ? 1 : 0));
            EXPECT_EQ(b.positions[r * kS + t + 1], last ? 0 : b.positions[r * kS + t] + 1);
          }
        }
        // The last target is the next window's first input (one shared boundary token).
        if (b.windows[r] == kWindows - 1) stream[kWindows * kS] = b.targets[r * kS + kS - 1];
      }
    }
  }
  std::vector<int64_t> order;
  for (size_t i = 0; i < stream.size();) {
    const auto doc = std::upper_bound(ends.begin(), ends.end(), stream[i]) - ends.begin();
    const int64_t start = doc > 0 ? ends[doc - 1] : 0;
    EXPECT_EQ(stream[i], start) << "stream position " << i << " starts no document";
    for (int64_t token = start; token < ends[doc]; ++token, ++i) {
      EXPECT_EQ(stream[i], token) << "document " << doc << " is not whole";
    }
    order.push_back(doc);
  }
  return order;
}

TEST(DocumentOrder, EachEpochCoversEveryDocumentOnceInAnotherOrder) {
  const std::shared_ptr<TokenDataset> data = Indexed();
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, Options(0, 1, 3)));
  ASSERT_EQ(loader.num_windows(), kWindows);
  std::vector<int64_t> all(data->document_ends.size());
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    orders.push_back(EpochDocuments(loader, *data, epoch));
    std::vector<int64_t> sorted = orders.back();
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all) << "epoch " << epoch;
    EXPECT_NE(orders.back(), all) << "epoch " << epoch << " is in file order";
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  // Rows are not in stream order either (the samples are permuted too).
  const std::vector<int64_t> windows = loader.BatchAt(0)[0].windows;
  EXPECT_NE(windows, (std::vector<int64_t>{0, 1}));
}

TEST(DocumentOrder, SeededAndRankSlicesPartitionTheGlobalBatch) {
  const std::shared_ptr<TokenDataset> data = Indexed();
  ASSERT_OK_AND_ASSIGN(DataLoader one, DataLoader::Create(data, Options(0, 1, 4)));
  ASSERT_OK_AND_ASSIGN(DataLoader again, DataLoader::Create(data, Options(0, 1, 4)));
  LoaderOptions other_seed = Options(0, 1, 4);
  other_seed.seed = 18;
  ASSERT_OK_AND_ASSIGN(DataLoader other, DataLoader::Create(data, other_seed));
  ASSERT_OK_AND_ASSIGN(DataLoader rank0, DataLoader::Create(data, Options(0, 2, 2)));
  ASSERT_OK_AND_ASSIGN(DataLoader rank1, DataLoader::Create(data, Options(1, 2, 2)));
  bool differs = false;
  for (int64_t step = 0; step < 20; ++step) {  // 8 samples a step: 2.7 epochs
    std::vector<int64_t> whole, sliced;
    for (const MicroBatch& b : one.BatchAt(step)) whole.insert(whole.end(), b.inputs.begin(), b.inputs.end());
    for (const MicroBatch& b : again.BatchAt(step)) sliced.insert(sliced.end(), b.inputs.begin(), b.inputs.end());
    EXPECT_EQ(whole, sliced) << "step " << step;
    sliced.clear();
    for (const DataLoader* rank : {&rank0, &rank1}) {
      for (const MicroBatch& b : rank->BatchAt(step)) {
        sliced.insert(sliced.end(), b.inputs.begin(), b.inputs.end());
      }
    }
    EXPECT_EQ(whole, sliced) << "step " << step;
    std::vector<int64_t> others;
    for (const MicroBatch& b : other.BatchAt(step)) others.insert(others.end(), b.inputs.begin(), b.inputs.end());
    differs = differs || others != whole;
  }
  EXPECT_TRUE(differs);
}

TEST(DocumentOrder, ResumeMidEpochAndTheSavedState) {
  const std::shared_ptr<TokenDataset> data = Indexed();
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, Options(0, 1, 3)));
  for (int i = 0; i < 7; ++i) loader.Next();  // 42 of 60 samples: mid-epoch
  const std::string saved = loader.state().Serialize();
  EXPECT_THAT(saved, HasSubstr(" order=documents"));
  ASSERT_OK_AND_ASSIGN(LoaderState state, LoaderState::Parse(saved));
  EXPECT_EQ(state.sample_order, SampleOrder::kDocuments);
  ASSERT_OK_AND_ASSIGN(DataLoader resumed, DataLoader::Create(data, Options(0, 1, 3)));
  ASSERT_OK(resumed.Restore(state));
  for (int i = 0; i < 6; ++i) {  // across the epoch boundary
    const std::vector<MicroBatch> want = loader.Next(), got = resumed.Next();
    for (size_t m = 0; m < want.size(); ++m) {
      EXPECT_EQ(got[m].inputs, want[m].inputs);
      EXPECT_EQ(got[m].targets, want[m].targets);
      EXPECT_EQ(got[m].segments, want[m].segments);
      EXPECT_EQ(got[m].positions, want[m].positions);
    }
  }
  // Another order refuses the state, both ways.
  LoaderOptions windows = Options(0, 1, 3);
  windows.sample_order = SampleOrder::kWindows;
  ASSERT_OK_AND_ASSIGN(DataLoader other, DataLoader::Create(data, windows));
  EXPECT_THAT(other.Restore(state),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("loader resume: sample_order documents in the saved state, "
                                 "windows now")));
  EXPECT_THAT(resumed.Restore(other.state()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("sample_order windows in the saved state, documents now")));
  // A windows state reads as before (no order field), and states saved before the field parse.
  EXPECT_THAT(other.state().Serialize(), ::testing::Not(HasSubstr("order=")));
  for (const char* old : {"loader v2 step=12 seed=7 seq_len=64 global_batch=16 num_windows=1000 "
                          "shuffle=1 data=8c1d0a3f",
                          "loader v2 step=12 seed=7 seq_len=64 global_batch=16 num_windows=1000 "
                          "shuffle=1 data=8c1d0a3f content=5e2b0c11"}) {
    ASSERT_OK_AND_ASSIGN(LoaderState parsed, LoaderState::Parse(old));
    EXPECT_EQ(parsed.sample_order, SampleOrder::kWindows);
    EXPECT_EQ(parsed.step, 12);
  }
  EXPECT_THAT(LoaderState::Parse("loader v2 step=12 seed=7 seq_len=64 global_batch=16 "
                                 "num_windows=1000 shuffle=1 data=8c1d0a3f order=sideways"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("order=sideways")));
}

// Documents ending in EOD (0), no index: segments restart after each EOD of the shuffled stream,
// targets after an EOD input are ignored, and CountedTargets counts what the batches count.
TEST(DocumentOrder, EodDocumentsAndTheLossMask) {
  auto data = std::make_shared<TokenDataset>();
  data->name = "eod";
  std::vector<int32_t> tokens;
  std::mt19937_64 rng(3);
  while (tokens.size() < 400) {
    const int64_t length = 1 + static_cast<int64_t>(rng() % 12);
    for (int64_t i = 0; i < length; ++i) tokens.push_back(1 + static_cast<int32_t>(rng() % 50));
    tokens.push_back(0);
  }
  data->tokens = TokenStream(tokens);
  data->max_token = 50;
  LoaderOptions o = Options(0, 1, 2);
  o.eod_token = 0;
  o.mask_eod_loss = true;
  ASSERT_OK_AND_ASSIGN(DataLoader loader, DataLoader::Create(data, o));
  for (int64_t step = 0; step < 30; ++step) {
    int64_t counted = 0;
    for (const MicroBatch& b : loader.BatchAt(step)) {
      counted += b.counted_targets;
      for (int64_t i = 0; i < b.rows * kS; ++i) {
        const bool eod = b.inputs[i] == 0;
        EXPECT_EQ(b.targets[i] == kIgnoreTarget, eod);
        if (i % kS + 1 < kS) {
          EXPECT_EQ(b.segments[i + 1], b.segments[i] + (eod ? 1 : 0));
          EXPECT_EQ(b.positions[i + 1], eod ? 0 : b.positions[i] + 1);
        }
      }
    }
    EXPECT_EQ(loader.CountedTargets(step), counted);
  }
}

TEST(DocumentOrder, DataWithoutDocumentsIsRefused) {
  auto data = std::make_shared<TokenDataset>();
  data->name = "one";
  data->tokens = TokenStream(std::vector<int32_t>(100, 7));
  data->max_token = 7;
  LoaderOptions o = Options(0, 1, 1);
  o.reset_at_documents = false;
  EXPECT_THAT(DataLoader::Create(data, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sample_order documents needs documents (EOD tokens or a "
                                 "document index); dataset 'one' is one document of 100 tokens")));
  o.eod_token = 3;
  EXPECT_THAT(DataLoader::Create(data, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(no EOD token 3 in it)")));
  o.sample_order = SampleOrder::kWindows;
  EXPECT_OK(DataLoader::Create(data, o).status());
}

}  // namespace
}  // namespace orthoshard::data
