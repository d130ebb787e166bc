// Pure planning of where every parameter lives in the contiguous param/grad buffers, and which
// data-parallel rank owns it. No tensors, no communicator: descriptors in, a plan out.
//
// Everything downstream obeys the plan: buffers/ allocates one ParamAndGradBuffer per
// PerBufferParamLayout and makes params views at `start`; ddp/ reduce-scatters and all-gathers whole
// buckets in shards of `shard_size`; the distributed optimizers step the ranges each rank owns;
// checkpoint/ writes each param from its owner. Ownership is derived from the layout
// (PerBufferParamLayout::OwnerOf), never stored twice.
#ifndef ORTHOSHARD_LAYOUT_LAYOUT_H_
#define ORTHOSHARD_LAYOUT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/tp_split.h"

namespace orthoshard::layout {

// Which optimizer manages a parameter. Muon-managed params need whole-matrix ownership.
enum class ParamRole { kMuon, kAdam };

// One model parameter, as the model defines it.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // shape on this rank (see tp); numel is the product (1 for a scalar)
  DType dtype = DType::kBFloat16;
  ParamRole role = ParamRole::kAdam;
  bool expert = false;            // MoE expert param: planned over the expert data-parallel size
  bool shared_embedding = false;  // tied input/output embedding: gets a bucket of its own
  // Tensor parallelism: `shape` is then this tp rank's local shape (what the buffers hold), and
  // TpGlobalShape(shape, tp) the whole matrix's (common/tp_split.h). Replicated by default.
  TpSplit tp;

  int64_t numel() const;
};

// How a buffer's params are placed.
enum class Strategy {
  kDistOpt,      // ZeRO-1 byte-level layout; params may straddle shard boundaries
  kMegatronLpt,  // Megatron-LM's layer-wise layout (longest-processing-time packing), the baseline
  kLayerwise,    // orthoshard's shard-aligned layout (default for Muon-managed buffers)
};

const char* StrategyName(Strategy strategy);                       // "distopt", ...
absl::StatusOr<Strategy> ParseStrategy(absl::string_view name);  // kInvalidArgument if unknown

// Params that must not share a buffer. Buffers are ordered by this key (see operator<).
struct BufferKey {
  DType param_dtype = DType::kBFloat16;
  DType grad_dtype = DType::kFloat32;
  bool expert = false;
  // Managed by the layer-wise (Muon) optimizer with a shard-aligned layout: true for Muon params
  // unless LayoutOptions::muon_strategy is kDistOpt (then they share the byte-level buffer).
  bool layerwise = false;

  bool operator==(const BufferKey& other) const;
  bool operator!=(const BufferKey& other) const { return !(*this == other); }
  bool operator<(const BufferKey& other) const;
  std::string ToString() const;  // e.g. "bf16/fp32/dense/layerwise"
};

// Where one param lives inside its buffer.
struct ParamPlacement {
  std::string name;
  int param_index = -1;  // index into the ParamSpec list given to ComputeFullParamLayout
  int64_t start = 0;     // [start, end) in elements of the buffer
  int64_t end = 0;
  int bucket = -1;       // index into PerBufferParamLayout::buckets
  // The optimizer that manages it (ParamSpec::role): routing is decided once, before the layout,
  // and read from here by everyone after it.
  ParamRole role = ParamRole::kAdam;
  // How the param is split over the tp group (ParamSpec::tp); start/end hold its tp-local slice.
  TpSplit tp;

  int64_t numel() const { return end - start; }
};

// A contiguous run of the buffer that is reduce-scattered / all-gathered as one collective.
// [start, end) is split into `dp` shards of `shard_size` elements: shard r is
// [start + r * shard_size, start + (r + 1) * shard_size). end - start == dp * shard_size.
struct Bucket {
  int64_t start = 0;
  int64_t end = 0;
  int64_t shard_size = 0;

  int64_t numel() const { return end - start; }
};

// The plan for one buffer.
//
// Offsets follow Megatron's convention: buckets are laid out from offset 0 in backprop order, so
// bucket 0 (at the start of the buffer) holds the params whose gradients are ready first (the
// last layers) and the first layers sit at the end. Bucket ids therefore increase both with the
// buffer offset and in backprop order. Within a bucket of a shard-aligned strategy, params are
// grouped by owning shard (not in model order); with kDistOpt they follow backprop order.
struct PerBufferParamLayout {
  BufferKey key;
  Strategy strategy = Strategy::kDistOpt;
  int dp = 1;                          // data-parallel size this buffer is sharded over
  std::vector<ParamPlacement> params;  // in buffer order (increasing start)
  std::vector<Bucket> buckets;         // in buffer order; bucket ids increase in backprop order
  int64_t unpadded_numel = 0;          // sum of param numels

  // Total elements including padding (end of the last bucket).
  int64_t numel() const;
  // Rank whose shard holds `param` entirely, i.e. (start - bucket.start) / shard_size, or -1 if the
  // param straddles a shard boundary (only possible with Strategy::kDistOpt).
  int OwnerOf(const ParamPlacement& param) const;
  // [begin, end) in buffer elements of shard `rank` of bucket `bucket`. Preconditions:
  // 0 <= bucket < buckets.size(), 0 <= rank < dp.
  std::pair<int64_t, int64_t> ShardRange(int bucket, int rank) const;
  // Placement of the param named `name`, or nullptr.
  const ParamPlacement* Find(absl::string_view name) const;
};

// The plan for a whole model: one PerBufferParamLayout per BufferKey present, ordered by key.
struct FullParamLayout {
  std::vector<PerBufferParamLayout> buffers;

  // (buffer index, placement) of the param named `name`; {-1, nullptr} if absent.
  std::pair<int, const ParamPlacement*> Find(absl::string_view name) const;
};

struct LayoutOptions {
  int dp = 1;                // data-parallel size for dense params
  int expert_dp = 0;         // data-parallel size for expert params; 0 means `dp`
  // Soft minimum bucket size in elements; std::nullopt puts each buffer in one bucket.
  std::optional<int64_t> bucket_size;
  // Strategy for Muon-managed (layer-wise) buffers. Adam-managed buffers always use kDistOpt.
  // With kDistOpt here, Muon-managed params share the byte-level layout (plain ZeRO-1).
  Strategy muon_strategy = Strategy::kLayerwise;
  // Strategy::kLayerwise: the padding (as a fraction of a bucket's elements) at which a bucket
  // boundary is accepted as soon as it is reached. Low keeps memory tight but merges layers into
  // few large buckets where matrix sizes do not pack evenly (a `small` GPT at dp 2: 2 buckets at
  // 0.001, one per layer at 0.05, 2.3% padding); higher gives more bucket groups to overlap
  // communication with. In [0, 1].
  double padding_tolerance = 0.001;
  // Strategy::kLayerwise: the fewest buckets a layer-wise buffer should get, so that its grad
  // reduce-scatters and param all-gathers have something to overlap with (a small model packs
  // exactly only every few layers and would otherwise get one or two buckets). When the plan has
  // fewer, the bucket size is lowered to the buffer's elements / min_buckets (if it was above),
  // then the padding tolerance doubled, up to max_padding_tolerance, until a plan has at least
  // min_buckets; if none does, the plan with the most buckets wins (the earliest among equals).
  // 0 turns the rule off. A buffer that cannot make that many buckets within the cap (fewer than
  // dp params per bucket, matrices that do not pack) keeps the most it can get.
  int min_buckets = 0;
  double max_padding_tolerance = 0.05;  // in [0, 1]; at or below padding_tolerance: no retries
  // Every strategy, with bucket_size set: when > 0, each buffer's soft minimum bucket size grows
  // to its elements / target_buckets, but not beyond max_bucket_size (bucket_size stays the
  // floor). A small buffer then gets about target_buckets buckets instead of one per param above
  // bucket_size, a large one buckets of about max_bucket_size: fewer, larger collectives, whose
  // per-operation cost (thread hand-offs, wake-ups) dominates on CPU Gloo ranks. 0: bucket_size
  // alone (Megatron's rule).
  int target_buckets = 0;
  // 25 MiB of fp32: PyTorch DDP's default bucket_cap_mb. >= 1.
  int64_t max_bucket_size = int64_t{25} << 18;
  // Strategy::kDistOpt buffers, with bucket_size set: a param of at least the buffer's soft
  // minimum bucket size (after target_buckets) gets a bucket of its own, as a shared embedding
  // does, instead of closing the bucket that the smaller params before it in backprop order
  // opened. Sharded residency (fsdp) gathers whole buckets, so without it the gather of a small
  // param (an untied embedding's neighbours: every block's norm gains) gathers the large one too.
  // false: Megatron's packing.
  bool isolate_large_params = false;
  // Gradient dtype of every buffer; std::nullopt means the param dtype.
  std::optional<DType> grad_dtype = DType::kFloat32;
};

// Plans every buffer. `params` are in model-definition (forward) order; backprop order is its
// reverse. Params are grouped by BufferKey (param dtype, grad dtype, expert, layer-wise); expert
// buffers are sharded over expert_dp. Deterministic: the same input gives the same plan on every
// rank. Metrics of a plan: layout/metrics.h.
// Errors: kInvalidArgument naming the param for an empty name, a duplicate name, a non-positive
// dimension, a non-2-D Muon param, or more than 2^50 elements (in the param, or in all params up to
// it); kInvalidArgument for dp outside 1..2^20, expert_dp outside 0..2^20, bucket_size < 1, or
// max(dp, expert_dp) times the elements of all params above 2^60 (padded offsets would overflow
// int64_t), padding_tolerance or max_padding_tolerance outside [0, 1], min_buckets < 0,
// target_buckets < 0, max_bucket_size < 1.
absl::StatusOr<FullParamLayout> ComputeFullParamLayout(const std::vector<ParamSpec>& params,
                                                        const LayoutOptions& options);

}  // namespace orthoshard::layout

#endif  // ORTHOSHARD_LAYOUT_LAYOUT_H_
