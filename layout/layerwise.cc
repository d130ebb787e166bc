// Strategy::kLayerwise: orthoshard's shard-aligned layout for Muon-managed buffers.
//
// Same contract as Megatron's layer-wise layout (no param crosses a shard boundary; the shards of a
// bucket are equal and a multiple of ShardDivisor(dp); buckets are contiguous runs of backprop
// order), but it chooses *where buckets end* by what packs well, instead of closing a bucket as
// soon as it is big enough:
//
// 1. Bucket boundaries. From the first boundary at which a chunk holds >= bucket_size elements,
//    each later boundary is a candidate. A candidate is accepted as soon as a packing of the chunk
//    with padding <= LayoutOptions::padding_tolerance exists. Cheap bounds first: every shard is at
//    least as large as the largest param and as the mean (padding >= dp * PadTo(max(max_param,
//    ceil(numel / dp)), sd) - numel), and Martello–Toth's L2 bound must not need more than dp
//    shards of the largest tolerated size; only candidates passing both are packed for real.
//    Repeated-layer models hit exact fits (e.g. one fc1 == fc2 + qkv + proj; one MoE expert's fc1
//    + fc2 per shard), so they get zero-padding buckets of about the requested size. If no
//    candidate within kMaxGrowth x max(bucket_size, dp * largest param) passes, the candidate
//    with the least padding among the best few lower bounds is taken.
// 2. Packing a bucket. Try shard sizes from the lower bound upwards; for each, place params by
//    decreasing Newton–Schulz cost onto the shard with the smallest running compute load (carried
//    across buckets) among shards where the param fits, then, if that fails, best-fit decreasing
//    by numel. The first size at which either succeeds is used (both: the one leaving the
//    slowest rank less work). The fallback is the better of numel-LPT and Megatron's packing, so
//    a layerwise bucket never pads more than either would for the same chunk. Equal-size shards
//    are then handed to ranks costliest-first onto the least loaded rank.
// 3. Tail. A short last chunk that pads badly is merged into the previous bucket when that pads
//    less in total.
//
// Trade-off at dp 64 on the reference GPT (and wherever dp * largest param approaches the buffer
// size): 64 fc1 matrices of 128 Mi elements are the whole 8 Gi buffer, and a bucket holding an
// fc1 spans at least dp * |fc1| = 8 Gi. A second bucket can then hold only a few params at either
// end without an fc1 (best case layer 0's {proj, qkv}: 64 shards of 48 Mi for 64 Mi of params),
// so any layout with two or more buckets pads >= 37.5% (Megatron's split pads 100%), for a second
// bucket too small to hide any communication. The boundary search above finds no candidate within
// tolerance before the end of the buffer and emits one zero-padding bucket: memory over overlap.
// The Muon buffer's reduce-scatter then starts when its last gradient is ready (the Adam buffers
// keep their buckets); a caller that prefers overlap to memory can choose Strategy::kMegatronLpt.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <vector>

#include "layout/internal/planning.h"
#include "layout/layout.h"

namespace orthoshard::layout::internal_layout {
namespace {

constexpr double kMaxGrowth = 2.0;
constexpr int kMaxPackAttemptsPerBucket = 32;
constexpr int kFinalCandidates = 4;
// Bounds the boundary search per bucket (and so planning time) for models of many tiny params.
constexpr size_t kMaxCandidates = 4096;

struct Item {
  int index;
  int64_t numel;
  double cost;
};

int64_t PaddedNumel(const ShardPacking& p) { return p.shard_size * p.shards.size(); }

// Martello–Toth lower bound L2 on the number of shards of `capacity` elements needed to hold items
// of the given sizes ({size: count}, sizes already padded to 64 so that they add up exactly): for a
// threshold K <= capacity / 2, items larger than capacity - K each need a shard nobody else can
// use, items in (capacity / 2, capacity - K] each need their own shard, and items in
// [K, capacity / 2] must fit into what the latter leave free plus further shards.
// S. Martello, P. Toth, "Lower bounds and reduction procedures for the bin packing problem",
// Discrete Applied Mathematics 28 (1990).
int64_t MinShards(const std::map<int64_t, int64_t>& size_counts, int64_t capacity) {
  constexpr size_t kMaxThresholds = 64;
  if (size_counts.empty()) return 0;
  if (size_counts.rbegin()->first > capacity) return std::numeric_limits<int64_t>::max();
  auto bound = [&](int64_t k) {
    int64_t alone = 0, big = 0, big_sum = 0, small_sum = 0;
    for (const auto& [size, count] : size_counts) {
      if (size > capacity - k) {
        alone += count;
      } else if (2 * size > capacity) {
        big += count;
        big_sum += size * count;
      } else if (size >= k) {
        small_sum += size * count;
      }
    }
    const int64_t free_in_big = big * capacity - big_sum;
    const int64_t extra =
        small_sum > free_in_big ? (small_sum - free_in_big + capacity - 1) / capacity : 0;
    return alone + big + extra;
  };
  int64_t best = bound(0);
  if (size_counts.size() > kMaxThresholds) return best;
  for (const auto& [size, count] : size_counts) {
    if (2 * size > capacity) break;
    best = std::max(best, bound(size));
  }
  return best;
}

class Packer {
 public:
  Packer(const std::vector<ParamSpec>& specs, int dp, int64_t divisor)
      : specs_(specs), dp_(dp), divisor_(divisor) {}

  // Smallest shard size any packing of `items` can have.
  int64_t LowerBound(int64_t sum, int64_t max_numel) const {
    return PadTo(std::max(max_numel, (sum + dp_ - 1) / dp_), divisor_);
  }

  // Packs `items` into dp shards of size <= limit (no limit if nullopt); nullopt if none found.
  // `loads` is the running compute load per shard, used to balance Newton–Schulz work.
  std::optional<ShardPacking> Pack(const std::vector<Item>& items, const std::vector<double>& loads,
                                   std::optional<int64_t> limit) const {
    int64_t sum = 0;
    int64_t max_numel = 0;
    for (const Item& it : items) {
      sum += it.numel;
      max_numel = std::max(max_numel, it.numel);
    }
    const int64_t lower = LowerBound(sum, max_numel);
    if (limit.has_value() && lower > *limit) return std::nullopt;

    std::vector<Item> by_cost = items;
    std::stable_sort(by_cost.begin(), by_cost.end(), [](const Item& a, const Item& b) {
      return a.cost != b.cost ? a.cost > b.cost : a.numel > b.numel;
    });
    std::vector<Item> by_numel = items;
    std::stable_sort(by_numel.begin(), by_numel.end(),
                     [](const Item& a, const Item& b) { return a.numel > b.numel; });
    // Fallbacks that always succeed: numel-LPT, and Megatron's compute-balanced LPT (so a layerwise
    // bucket never pads more than Megatron's packing of the same chunk would).
    ShardPacking lpt = Lpt(by_numel, loads);
    ShardPacking megatron = MegatronLpt(by_cost, loads);
    AssignShardsToRanks(items, loads, &lpt);
    AssignShardsToRanks(items, loads, &megatron);
    if (megatron.shard_size < lpt.shard_size ||
        (megatron.shard_size == lpt.shard_size &&
         MaxLoad(megatron, items, loads) < MaxLoad(lpt, items, loads))) {
      lpt = std::move(megatron);
    }

    std::vector<int64_t> sizes = {lower};
    for (int shift = 12; shift >= 0; --shift) {
      const int64_t s = PadTo(lower + (lower >> shift), divisor_);
      if (s > sizes.back()) sizes.push_back(s);
    }
    for (int64_t size : sizes) {
      if (size >= lpt.shard_size) break;
      if (limit.has_value() && size > *limit) break;
      std::optional<ShardPacking> by_load = Fit(by_cost, loads, size, /*tightest=*/false);
      std::optional<ShardPacking> by_fit = Fit(by_numel, loads, size, /*tightest=*/true);
      if (by_load) AssignShardsToRanks(items, loads, &*by_load);
      if (by_fit) AssignShardsToRanks(items, loads, &*by_fit);
      if (by_load && by_fit) {
        // Both fit at this size: keep the one whose slowest rank has less Newton–Schulz work.
        return MaxLoad(*by_fit, items, loads) < MaxLoad(*by_load, items, loads) ? by_fit : by_load;
      }
      if (by_load) return by_load;
      if (by_fit) return by_fit;
    }
    if (limit.has_value() && lpt.shard_size > *limit) return std::nullopt;
    return lpt;
  }

 private:
  // Places each item on a shard where it fits within `size`: the least compute-loaded one, or
  // with `tightest` the fullest one (ties to the least loaded, then the lowest rank).
  std::optional<ShardPacking> Fit(const std::vector<Item>& order, std::vector<double> loads,
                                  int64_t size, bool tightest) const {
    ShardPacking p;
    p.shards.assign(dp_, {});
    std::vector<int64_t> cursors(dp_, 0);
    for (const Item& it : order) {
      int best = -1;
      for (int s = 0; s < dp_; ++s) {
        if (Pad64(cursors[s]) + it.numel > size) continue;
        if (best < 0) {
          best = s;
          continue;
        }
        if (tightest && cursors[s] != cursors[best]) {
          if (cursors[s] > cursors[best]) best = s;
        } else if (loads[s] < loads[best]) {
          best = s;
        }
      }
      if (best < 0) return std::nullopt;
      cursors[best] = Pad64(cursors[best]) + it.numel;
      loads[best] += it.cost;
      p.shards[best].push_back(it.index);
    }
    p.shard_size = PadTo(*std::max_element(cursors.begin(), cursors.end()), divisor_);
    return p;
  }

  // Numel-LPT: largest first onto the emptiest shard (ties to the least loaded). Always succeeds.
  ShardPacking Lpt(const std::vector<Item>& by_numel, const std::vector<double>& loads) const {
    ShardPacking p;
    p.shards.assign(dp_, {});
    std::vector<int64_t> cursors(dp_, 0);
    for (const Item& it : by_numel) {
      int best = 0;
      for (int s = 1; s < dp_; ++s) {
        if (cursors[s] < cursors[best] ||
            (cursors[s] == cursors[best] && loads[s] < loads[best])) {
          best = s;
        }
      }
      cursors[best] = Pad64(cursors[best]) + it.numel;
      p.shards[best].push_back(it.index);
    }
    p.shard_size = PadTo(*std::max_element(cursors.begin(), cursors.end()), divisor_);
    return p;
  }

  // Megatron's placement (see megatron_lpt.cc): by decreasing cost onto the least compute-loaded
  // shard whose numel stays within 1.3x the mean, else onto the emptiest shard.
  ShardPacking MegatronLpt(const std::vector<Item>& by_cost, std::vector<double> loads) const {
    constexpr double kNumelSlack = 1.3;
    int64_t sum = 0;
    for (const Item& it : by_cost) sum += it.numel;
    const double cap = static_cast<double>(sum) / dp_ * kNumelSlack;
    ShardPacking p;
    p.shards.assign(dp_, {});
    std::vector<int64_t> cursors(dp_, 0);
    for (const Item& it : by_cost) {
      int best = -1;
      for (int s = 0; s < dp_; ++s) {
        if (static_cast<double>(Pad64(cursors[s]) + it.numel) > cap) continue;
        if (best < 0 || loads[s] < loads[best]) best = s;
      }
      if (best < 0) {
        best = static_cast<int>(std::min_element(cursors.begin(), cursors.end()) - cursors.begin());
      }
      cursors[best] = Pad64(cursors[best]) + it.numel;
      loads[best] += it.cost;
      p.shards[best].push_back(it.index);
    }
    p.shard_size = PadTo(*std::max_element(cursors.begin(), cursors.end()), divisor_);
    return p;
  }

  // Shards of equal size are interchangeable, so a packing's shards can go to any ranks: give the
  // costliest shard to the least loaded rank, and so on, to even out the running loads.
  void AssignShardsToRanks(const std::vector<Item>& items, const std::vector<double>& loads,
                           ShardPacking* p) const {
    const size_t dp = p->shards.size();
    std::vector<double> shard_cost(dp, 0.0);
    for (size_t s = 0; s < dp; ++s) {
      for (int i : p->shards[s]) shard_cost[s] += NsCost(specs_[i]);
    }
    std::vector<size_t> shards(dp), ranks(dp);
    std::iota(shards.begin(), shards.end(), 0);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::stable_sort(shards.begin(), shards.end(),
                     [&](size_t a, size_t b) { return shard_cost[a] > shard_cost[b]; });
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&](size_t a, size_t b) { return loads[a] < loads[b]; });
    std::vector<std::vector<int>> by_rank(dp);
    for (size_t k = 0; k < dp; ++k) by_rank[ranks[k]] = std::move(p->shards[shards[k]]);
    p->shards = std::move(by_rank);
  }

  // Largest running compute load after adding packing `p` of `items` to `loads`.
  double MaxLoad(const ShardPacking& p, const std::vector<Item>& items,
                 std::vector<double> loads) const {
    for (size_t r = 0; r < p.shards.size(); ++r) {
      for (int i : p.shards[r]) loads[r] += NsCost(specs_[i]);
    }
    return *std::max_element(loads.begin(), loads.end());
  }

  const std::vector<ParamSpec>& specs_;
  int dp_;
  int64_t divisor_;
};

void AddLoads(const std::vector<ParamSpec>& specs, const ShardPacking& p,
              std::vector<double>* loads) {
  for (size_t r = 0; r < p.shards.size(); ++r) {
    for (int i : p.shards[r]) (*loads)[r] += NsCost(specs[i]);
  }
}

struct Chunk {
  ShardPacking packing;
  std::vector<double> loads_before;
  int64_t numel = 0;
  size_t begin_item = 0;  // first item of the chunk within its segment
};

class SegmentPlanner {
 public:
  SegmentPlanner(const std::vector<ParamSpec>& specs, int dp, std::optional<int64_t> bucket_size,
                 double padding_tolerance, std::vector<double>* loads)
      : specs_(specs), dp_(dp), bucket_size_(bucket_size), padding_tolerance_(padding_tolerance),
        loads_(loads),
        packer_(specs, dp, ShardDivisor(dp)) {}

  // Appends the buckets of one run of backprop-ordered items (no shared embedding inside).
  void Plan(const std::vector<Item>& items, std::vector<Chunk>* chunks) {
    const size_t first_chunk = chunks->size();
    size_t pos = 0;
    while (pos < items.size()) {
      size_t end = items.size();
      ShardPacking packing;
      if (!bucket_size_.has_value()) {
        packing = *packer_.Pack(items, *loads_, std::nullopt);
      } else {
        ChooseEnd(items, pos, &end, &packing);
      }
      Chunk c;
      c.loads_before = *loads_;
      c.begin_item = pos;
      c.packing = std::move(packing);
      for (size_t i = pos; i < end; ++i) c.numel += items[i].numel;
      AddLoads(specs_, c.packing, loads_);
      chunks->push_back(std::move(c));
      pos = end;
    }
    MergeTail(items, first_chunk, chunks);
  }

 private:
  static double PaddingFraction(int64_t padded, int64_t numel) {
    return static_cast<double>(padded - numel) / static_cast<double>(numel);
  }

  void ChooseEnd(const std::vector<Item>& items, size_t pos, size_t* end, ShardPacking* packing) {
    struct Candidate {
      double lower_bound_fraction;
      size_t end;
    };
    std::vector<Candidate> candidates;
    int64_t sum = 0;
    int64_t max_numel = 0;
    int attempts = 0;
    std::map<int64_t, int64_t> size_counts;  // Pad64(numel) -> count
    const int64_t divisor = ShardDivisor(dp_);
    for (size_t e = pos + 1; e <= items.size(); ++e) {
      sum += items[e - 1].numel;
      max_numel = std::max(max_numel, items[e - 1].numel);
      ++size_counts[Pad64(items[e - 1].numel)];
      const bool last = e == items.size();
      if (sum < *bucket_size_ && !last) continue;
      const int64_t lower = packer_.LowerBound(sum, max_numel);
      const double lb_fraction = PaddingFraction(lower * dp_, sum);
      candidates.push_back({lb_fraction, e});
      // Largest shard size that keeps the padding within tolerance.
      const int64_t limit =
          static_cast<int64_t>(std::floor(static_cast<double>(sum) * (1 + padding_tolerance_) / dp_)) /
          divisor * divisor;
      if (lb_fraction <= padding_tolerance_ && attempts < kMaxPackAttemptsPerBucket &&
          limit >= lower && MinShards(size_counts, limit) <= dp_) {
        ++attempts;
        std::vector<Item> chunk(items.begin() + pos, items.begin() + e);
        if (auto p = packer_.Pack(chunk, *loads_, limit)) {
          *end = e;
          *packing = std::move(*p);
          return;
        }
      }
      const int64_t floor = std::max(*bucket_size_, static_cast<int64_t>(dp_) * max_numel);
      if (static_cast<double>(sum) >= kMaxGrowth * static_cast<double>(floor) ||
          candidates.size() >= kMaxCandidates) {
        break;
      }
    }
    // No boundary within the window packs within tolerance: take the least padding among the
    // candidates with the best lower bounds (ties to the earlier boundary).
    std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a,
                                                              const Candidate& b) {
      return a.lower_bound_fraction < b.lower_bound_fraction;
    });
    candidates.resize(std::min<size_t>(candidates.size(), kFinalCandidates));
    double best_fraction = 0;
    bool have = false;
    for (const Candidate& c : candidates) {
      std::vector<Item> chunk(items.begin() + pos, items.begin() + c.end);
      int64_t numel = 0;
      for (const Item& it : chunk) numel += it.numel;
      ShardPacking p = *packer_.Pack(chunk, *loads_, std::nullopt);
      const double fraction = PaddingFraction(PaddedNumel(p), numel);
      if (!have || fraction < best_fraction || (fraction == best_fraction && c.end < *end)) {
        have = true;
        best_fraction = fraction;
        *end = c.end;
        *packing = std::move(p);
      }
    }
  }

  void MergeTail(const std::vector<Item>& items, size_t first_chunk, std::vector<Chunk>* chunks) {
    if (chunks->size() < first_chunk + 2) return;
    Chunk& last = chunks->back();
    if (PaddingFraction(PaddedNumel(last.packing), last.numel) <= padding_tolerance_) return;
    Chunk& prev = (*chunks)[chunks->size() - 2];
    const int64_t separate = PaddedNumel(prev.packing) + PaddedNumel(last.packing);
    std::vector<Item> merged_items(items.begin() + prev.begin_item, items.end());
    ShardPacking merged = *packer_.Pack(merged_items, prev.loads_before, std::nullopt);
    if (PaddedNumel(merged) >= separate) return;
    *loads_ = prev.loads_before;
    AddLoads(specs_, merged, loads_);
    prev.packing = std::move(merged);
    prev.numel += last.numel;
    chunks->pop_back();
  }

  const std::vector<ParamSpec>& specs_;
  int dp_;
  std::optional<int64_t> bucket_size_;
  double padding_tolerance_;
  std::vector<double>* loads_;
  Packer packer_;
};

}  // namespace

void PlanLayerwise(const BufferInput& input, PerBufferParamLayout* out) {
  const std::vector<ParamSpec>& specs = *input.specs;
  const int dp = input.dp;
  std::vector<double> loads(dp, 0.0);
  std::vector<Chunk> chunks;
  SegmentPlanner planner(specs, dp, input.bucket_size, input.padding_tolerance, &loads);
  std::vector<Item> segment;
  for (auto it = input.indices.rbegin(); it != input.indices.rend(); ++it) {
    const ParamSpec& spec = specs[*it];
    if (!spec.shared_embedding) {
      segment.push_back(Item{*it, spec.numel(), NsCost(spec)});
      continue;
    }
    planner.Plan(segment, &chunks);
    segment.clear();
    // A shared (tied) embedding gets a bucket of its own, owned by the least compute-loaded rank.
    Chunk c;
    c.loads_before = loads;
    c.numel = spec.numel();
    c.packing.shards.assign(dp, {});
    const int owner = static_cast<int>(std::min_element(loads.begin(), loads.end()) - loads.begin());
    c.packing.shards[owner].push_back(*it);
    c.packing.shard_size = PadTo(spec.numel(), ShardDivisor(dp));
    loads[owner] += NsCost(spec);
    chunks.push_back(std::move(c));
  }
  planner.Plan(segment, &chunks);
  for (const Chunk& c : chunks) EmitShardAlignedBucket(specs, c.packing, out);
}

}  // namespace orthoshard::layout::internal_layout
