// What one rank builds before its first step (Build): the data and its loaders, the model, and how
// the model is trained on this rank — the routing (which params Muon updates), the layout that
// publishes it, DDP over the layout's buffers, and the distributed optimizer. What each --dist mode
// implies comes from one table (choices.h, kDistModes); the config fields reach the libraries'
// option structs through one mapping each (setup.cc).
#ifndef ORTHOSHARD_INTEGRATION_SETUP_H_
#define ORTHOSHARD_INTEGRATION_SETUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "buffers/param_and_grad_buffer.h"
#include "collectives/communicator.h"
#include "collectives/mesh.h"
#include "data/loader.h"
#include "ddp/distributed_data_parallel.h"
#include "integration/config/trainer_config.h"
#include "layout/layout.h"
#include "model/model.h"
#include "optimizers/chained.h"
#include "optimizers/routing.h"

namespace orthoshard::integration {

// Everything one rank builds before the first step.
struct Setup {
  int64_t seq_len = 0;
  int64_t micro_batch_size = 0;
  double unigram_entropy = 0;
  int64_t train_tokens = 0, eval_tokens = 0;
  std::string vocab_source, eval_source;
  int64_t eod_token = -1;
  // Documents the train data's index records (a Megatron .idx; 0 for other forms).
  int64_t index_documents = 0;
  // Rows carry their documents (attention stops at each EOD and each document end of the index).
  bool documents = false;
  bool per_token_loss = false;  // --eod_mask_loss: the step's loss is a mean over counted targets
  DistMode mode = DistMode::kReplicated;
  // The ranks' named groups over the world communicator. Today's grid is 1-D (dp = world size), so
  // mesh->dp() is the world communicator itself; DDP, the layout and the optimizer take the dp
  // group (expert buffers would take expt_dp), never the world.
  std::unique_ptr<collectives::Mesh> mesh;
  std::unique_ptr<model::Gpt> model;
  layout::FullParamLayout layout;
  // DDP owns the buffers (grads reduce-scattered, or all-reduced for kReplicated); the distributed
  // optimizer steps this rank's part (every param, in kReplicated).
  std::unique_ptr<ddp::DistributedDataParallel> ddp;
  std::unique_ptr<optimizers::ChainedOptimizer> optimizer;
  optimizers::RoutingReport routing;  // decided once, before the layout publishes it
  std::vector<buffers::ParamAndGradBuffer*> buffers;  // parallel to layout.buffers
  std::unique_ptr<data::DataLoader> train, eval;
};

// The data, the model and how it is trained on this rank of `comm` (the world communicator, which
// must outlive the result). Every rank calls it with the same config. Errors: as Mesh::Create,
// LoadTrainingData,
// DataLoader::Create, Gpt::CreateUninitialized, PlanRouting, ComputeFullParamLayout,
// DistributedDataParallel::Create and CreateDistributedOptimizer.
absl::StatusOr<Setup> Build(const TrainerConfig& config, collectives::Communicator& comm);

// The routing a config asks for: --optimizer=adamw sends every param to AdamW, else --route's
// overrides in order (then PlanRouting's default rules). Errors: as RouteOverrides.
absl::StatusOr<optimizers::RoutingConfig> RoutingConfigOf(const TrainerConfig& config);

// The params' names and shapes, as PlanRouting takes them.
std::vector<optimizers::ParamDescriptor> ParamDescriptorsOf(
    const std::vector<model::ModelParam>& params);

// --route against the model's params before any rank starts, as Build will plan it: the model the
// config resolves to (ResolveModel: a prepared dataset brings its vocabulary), built on the meta
// device (names and whole shapes, no memory). OK when the model cannot be resolved (the run
// reports that itself). Errors: kInvalidArgument "--route '*norm*=muon': param
// 'layers.0.attn_norm.weight': override '*norm*' routes it to muon, which needs a 2-D matrix, got
// shape [64]", or naming an entry that matches no param of the model.
absl::Status CheckRouting(const TrainerConfig& config);

// The libraries' option structs a config implies (setup.cc's field mappings plus what is derived
// from several fields or from the --dist mode's row of kDistModes). Errors (OptimizerConfigOf):
// kInvalidArgument for --muon_ns_coefficients that do not parse.
absl::StatusOr<optimizers::ChainedConfig> OptimizerConfigOf(const TrainerConfig& config);
layout::LayoutOptions LayoutOptionsOf(const TrainerConfig& config, int dp);

// --bucket_elems=0 (auto) outside fsdp: Megatron's 64 Ki-element soft minimum (grown by
// --target_buckets).
inline constexpr int64_t kDefaultBucketElems = int64_t{1} << 16;

// --bucket_elems=0 (auto) with --dist=fsdp: the soft minimum bucket size from the model, half the
// elements of its largest block (a forward layer holding a hidden matrix; tp-local), at least 1;
// Build then turns --target_buckets off. fsdp gathers whole bucket groups, so its transient memory
// is a number of groups (ddp/distributed_data_parallel.h, the transient bound): a bucket larger
// than a layer gathers a multiple of a layer at once, and a shallow model would hold most of its
// params. Half a block lets a layer span two groups; the layer-wise layout keeps every Muon matrix
// whole in one shard (a bucket is dp shards of at least the largest matrix, and it closes only
// where the matrices pack within --bucket_padding), so where dp x the largest matrix exceeds half a
// block (gpt2-124m or `small` at dp 2) the buckets are about one layer: the fewest the matrices
// allow, never several layers merged by --target_buckets.
int64_t FsdpBucketElems(const std::vector<model::ModelParam>& params);
ddp::DdpConfig DdpConfigOf(const TrainerConfig& config);

// One line per buffer of `full`: key, strategy, params, elements, padding and bucket sizes.
std::string LayoutSummary(const layout::FullParamLayout& full);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_SETUP_H_
