// Tensor-parallel models for the tp Muon test and benchmark: the global params and how tensor
// parallelism splits each (Megatron's layout, common/tp_split.h), and the buffers of one tp rank's
// slices (layout + buffers as test_model.h builds them, from the tp-local shapes).
#ifndef ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TESTING_TP_MODEL_H_
#define ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TESTING_TP_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "common/tp_split.h"
#include "layout/layout.h"
#include "optimizers/distributed/testing/test_model.h"
#include "optimizers/slot_optimizer.h"

namespace orthoshard::optimizers::distributed::testing {

// A param of the global model and how tensor parallelism splits it.
struct TpParam {
  std::string name;
  std::vector<int64_t> shape;  // global
  int dim = -1;                // TpSplit::dim; -1 replicated
  int64_t parts = 1;
  layout::ParamRole role = layout::ParamRole::kAdam;
  FusedSplit split;  // of the global matrix
};

// A GPT-like model of `layers` layers: C 16; attention of 2 KV groups, each 2 query heads of head
// dim 4 (qkv [32, 16], rows per group 8 + 4 + 4, split by KV groups); proj [16, 16] and fc2
// [16, 24] split along dim 1; SwiGLU fc1 [48, 16] (F 24) in 2 parts (gate, up); a vocab-split
// embedding [32, 16]; replicated norms.
std::vector<TpParam> GptLike(int layers);
// gpt2-124m's matrices (model/gpt_config: C 768, 12 heads = 12 KV groups of head dim 64, SwiGLU F
// 2048) for `layers` layers: global qkv [2304, 768], proj [768, 768], fc1 [4096, 768] (2 parts),
// fc2 [768, 2048]; at tp 2 the local qkv [1152, 768], proj [768, 384], fc1 [2048, 768], fc2
// [768, 1024].
std::vector<TpParam> Gpt2Matrices(int layers);

// p's split at tp size `tp`, held by `tp_rank` (replicated for dim -1).
TpSplit SplitOf(const TpParam& p, int tp, int tp_rank);
// bf16 specs of the global shapes (for MakeModelParams, RankGrad, MeanGrad).
std::vector<layout::ParamSpec> GlobalSpecs(const std::vector<TpParam>& ps);
// The FusedSplits of the global matrices, by name.
std::map<std::string, FusedSplit> GlobalSplits(const std::vector<TpParam>& ps);
// tp rank `tp_rank`'s slice of a global tensor of `p` (the tensor itself when replicated).
at::Tensor SliceOf(const TpParam& p, int tp, int tp_rank, const at::Tensor& global);

// The buffers of tp rank `tp_rank`'s slices over `dp` data-parallel ranks (layer-wise Muon
// buffers, `bucket_size` elements), params the slices of MakeModelParams(GlobalSpecs(ps)), or
// zeros without `with_values`.
absl::StatusOr<DistributedModel> BuildTpModel(const std::vector<TpParam>& ps, int tp, int tp_rank,
                                              int dp, int64_t bucket_size,
                                              bool with_values = true);

// Zeroes the grad buffers and writes each param's slice of RankGrad(global spec, dp_rank, step).
// With `poison`, the first element of `poison_param`'s slice becomes NaN.
void FillTpGrads(const std::vector<TpParam>& ps, DistributedModel& model, int tp, int tp_rank,
                 int dp_rank, int step, const std::string& poison_param = "");

}  // namespace orthoshard::optimizers::distributed::testing

#endif  // ORTHOSHARD_OPTIMIZERS_DISTRIBUTED_TESTING_TP_MODEL_H_
