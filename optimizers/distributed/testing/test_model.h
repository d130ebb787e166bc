// A small model for the distributed-optimizer tests and benchmark: its param specs, deterministic
// initial values, deterministic per-rank gradients whose data-parallel mean is exact in fp32
// (multiples of 1/64 in [-1, 1]; sums over up to 64 ranks are exact, so the mean does not depend on
// the order a collective adds them in), the buffers a rank builds from a layout, and the
// single-process ChainedOptimizer reference that steps on the mean gradient.
#ifndef ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TESTING_TEST_MODEL_H_
#define ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TESTING_TEST_MODEL_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"
#include "layout/layout.h"
#include "optimizers/chained.h"

namespace orthoshard::optimizers::distributed::testing {

// A transformer-like model in bf16: a tied embedding [24, 16] (shared_embedding), per layer a
// fused qkv [48, 16], proj [16, 16], fc1 [40, 16] + bias, fc2 [16, 40], norms; a final norm.
// 4 Muon matrices per layer; `only_two_matrices` keeps qkv and fc2 only (1 layer = 2 matrices, for
// idle ranks).
std::vector<layout::ParamSpec> SmallModel(int num_layers, bool only_two_matrices = false);

// Fused splits of SmallModel's params: every qkv [48, 16] as 2 query groups of {16, 4, 4} rows
// (Q, K, V) and every fc1 [40, 16] as {1, {20, 20}} (gate; up).
std::map<std::string, FusedSplit> SmallModelSplits(const std::vector<layout::ParamSpec>& specs);

// `n` Muon matrices of [rows, cols] plus a [rows] norm each and an embedding [vocab, cols].
std::vector<layout::ParamSpec> LargeModel(int n, int64_t rows, int64_t cols, int64_t vocab);

// Deterministic initial values (same on every rank and process), in each spec's dtype.
std::vector<at::Tensor> MakeModelParams(const std::vector<layout::ParamSpec>& specs);

// Rank `rank`'s fp32 gradient for param `index` at step `step`.
at::Tensor RankGrad(const layout::ParamSpec& spec, int index, int rank, int step);
// The mean of RankGrad over `dp` ranks (exact sum, then one division, as an AVG collective does).
at::Tensor MeanGrad(const layout::ParamSpec& spec, int index, int dp, int step);

struct DistributedModel {
  layout::FullParamLayout layout;
  std::vector<at::Tensor> params;  // model params, now views of the buffers
  std::vector<std::unique_ptr<buffers::ParamAndGradBuffer>> owned_buffers;
  std::vector<buffers::ParamAndGradBuffer*> buffers;
};

// Lays out `specs` over `dp` ranks with `bucket_size` elements and builds the buffers, keeping
// everything (kFull) or only rank `rank`'s shards (kSharded, ZeRO-3).
absl::StatusOr<DistributedModel> BuildDistributedModel(
    const std::vector<layout::ParamSpec>& specs, int dp, layout::Strategy muon_strategy,
    int64_t bucket_size, buffers::Residency residency = buffers::Residency::kFull, int rank = 0);

// Zeroes every grad buffer and writes RankGrad(rank, step) into each param's gradient view (with
// sharded residency into the full grad buckets, materialized for it: run the grad sync, then
// ReleaseFullGrads).
void FillRankGrads(const std::vector<layout::ParamSpec>& specs, DistributedModel& model, int rank,
                   int step);
// Frees the full grad buckets of sharded buffers (a no-op for kFull).
void ReleaseFullGrads(DistributedModel& model);

// Every param whole, as fresh tensors: clones of the params for kFull buffers; for kSharded ones,
// each bucket all-gathered from the ranks' shards (collective over `comm`; buckets stay released).
absl::StatusOr<std::vector<at::Tensor>> WholeParams(collectives::Communicator& comm,
                                                    DistributedModel& model);

// Every param of `got` bitwise equal to `want`'s; else kInternal naming `when`, the first param that
// differs and the largest difference.
absl::Status CompareParamsBitwise(const std::vector<layout::ParamSpec>& specs,
                                  const std::vector<at::Tensor>& got,
                                  const std::vector<at::Tensor>& want, const std::string& when);

// OK when `ok`, else kInternal `what`.
absl::Status Check(bool ok, const std::string& what);

// Config used by the tests: distinct lrs and weight decays; clipping at `max_grad_norm`.
ChainedConfig TestConfig(double max_grad_norm);

// Single-process reference: ChainedOptimizer over fresh copies of MakeModelParams.
class Reference {
 public:
  // `splits`: Param::split of the named params (the rest are one matrix).
  static absl::StatusOr<std::unique_ptr<Reference>> Create(
      const std::vector<layout::ParamSpec>& specs, const ChainedConfig& config,
      const std::map<std::string, FusedSplit>& splits = {});
  // Sets every gradient to MeanGrad(dp, step) and steps. `nan_param` >= 0 puts a NaN into that
  // param's gradient. `global`, when given, are the statistics to clip and skip by (a distributed
  // optimizer's StepResult::stats) instead of the reference's own sums of squares.
  absl::StatusOr<StepResult> Step(int dp, int step, int nan_param = -1,
                                  const GradStats* global = nullptr);
  const std::vector<at::Tensor>& params() const { return params_; }
  ChainedOptimizer& optimizer() { return *optimizer_; }

 private:
  std::vector<layout::ParamSpec> specs_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grads_;
  std::unique_ptr<ChainedOptimizer> optimizer_;
};

}  // namespace orthoshard::optimizers::distributed::testing

#endif  // ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TESTING_TEST_MODEL_H_
