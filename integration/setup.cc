// Build (setup.h): data, model, routing, layout, DDP and the distributed optimizer of one rank.
#include "integration/setup.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "data/dataset.h"
#include "integration/training_data.h"
#include "model/gpt_config.h"
#include "model/tensor_parallel.h"
#include "optimizers/distributed/distributed_optimizer.h"
#include "optimizers/ns_schedule.h"
#include "optimizers/schedule.h"

namespace orthoshard::integration {
namespace {

using collectives::Communicator;
using model::Gpt;
using model::ModelParam;

// The config fields the libraries' option structs take as they are, one mapping per struct:
// X(field of the option struct, TrainerConfig field). Fields that need more than a copy (derived
// from several fields, or from the --dist mode) are set next to where the mapping is applied.
#define ORTHOSHARD_OPTIMIZER_FIELDS(X)      \
  X(adamw.lr, lr)                           \
  X(adamw.beta1, adam_beta1)                \
  X(adamw.beta2, adam_beta2)                \
  X(adamw.eps, adam_eps)                    \
  X(adamw.weight_decay, weight_decay)       \
  X(adamw.fused, adamw_fused)               \
  X(muon.lr, muon_lr)                       \
  X(muon.weight_decay, muon_weight_decay)   \
  X(muon.momentum, muon_momentum)           \
  X(muon.nesterov, muon_nesterov)           \
  X(muon.scale_rule, muon_scale_rule)       \
  X(muon.extra_scale, muon_extra_scale)     \
  X(muon.ns.ns_steps, muon_ns_steps)        \
  X(muon.ns.batched, muon_batched_ns)       \
  X(muon.ns.dtype, muon_ns_dtype)           \
  X(max_grad_norm, max_grad_norm)           \
  X(clip_mode, clip_mode)                   \
  X(params_norm, log_params_norm)           \
  X(count_zero_grads, log_num_zeros_in_grad)
#define ORTHOSHARD_LAYOUT_FIELDS(X)                \
  X(bucket_size, bucket_elems)                     \
  X(target_buckets, target_buckets)                \
  X(max_bucket_size, max_bucket_elems)             \
  X(padding_tolerance, bucket_padding)             \
  X(min_buckets, min_buckets)                      \
  X(max_padding_tolerance, max_bucket_padding)
#define ORTHOSHARD_DDP_FIELDS(X)                      \
  X(grad_reduce_in_fp32, grad_reduce_in_fp32)         \
  X(overlap_grad_reduce, overlap_grad_reduce)         \
  X(reshard_after_forward, reshard_after_forward)     \
  X(prefetch, prefetch_params)

// A config value into an option field of another type: counts beyond an int's range are "as many
// as there can be" (the layout's bucket counts).
template <typename To, typename From>
void CopyField(const From& from, To* to) {
  if constexpr (std::is_same_v<To, int> && std::is_same_v<From, int64_t>) {
    *to = static_cast<int>(std::min<int64_t>(from, std::numeric_limits<int>::max()));
  } else {
    *to = from;
  }
}

#define ORTHOSHARD_COPY_FIELD(option, field) CopyField(c.field, &out.option);

optimizers::ScheduleConfig ScheduleOf(const TrainerConfig& c) {
  optimizers::ScheduleConfig s;
  s.kind = c.schedule;
  s.warmup_steps = std::min(c.warmup_steps, c.steps);
  s.total_steps = c.steps;
  s.decay_steps = c.decay_steps > 0 ? c.decay_steps : std::max<int64_t>(1, c.steps / 5);
  s.min_lr_ratio = c.min_lr_ratio;
  return s;
}

}  // namespace

absl::StatusOr<optimizers::ChainedConfig> OptimizerConfigOf(const TrainerConfig& c) {
  optimizers::ChainedConfig out;
  ORTHOSHARD_OPTIMIZER_FIELDS(ORTHOSHARD_COPY_FIELD)
  out.no_weight_decay_patterns = NoWeightDecayPatterns(c);
  RETURN_IF_ERROR(optimizers::SetNsSchedule(c.muon_ns_coefficients, &out.muon.ns));
  out.muon.ns.gram = GramNewtonSchulz(c);
  out.schedule = ScheduleOf(c);
  return out;
}

layout::LayoutOptions LayoutOptionsOf(const TrainerConfig& c, int dp) {
  layout::LayoutOptions out;
  ORTHOSHARD_LAYOUT_FIELDS(ORTHOSHARD_COPY_FIELD)
  out.dp = dp;
  // fp32 grads for bf16 params: `.grad` is an fp32 view and AccumulateGrad's in-place add promotes
  // each bf16 gradient (buffers/param_and_grad_buffer.h). grad_reduce_in_fp32=false: bf16 grads.
  out.grad_dtype = c.grad_reduce_in_fp32 ? DType::kFloat32 : std::optional<DType>{};
  out.muon_strategy = SpecOf(c.dist).muon_strategy;
  // fsdp gathers whole buckets: a param of at least the bucket size in a bucket of its own keeps
  // an untied embedding out of the gathers of the blocks' norm gains. Every mode lays out the
  // same buckets: a bucket's shards fix the order in which the ranks' terms of each element are
  // summed (and the clip norm's partial sums), so the modes agree bitwise at equal --bucket_elems
  // only on equal layouts.
  out.isolate_large_params = true;
  // 0 = auto: 64 Ki elements (fsdp's size from the model replaces it in Build: FsdpBucketElems).
  if (c.bucket_elems == 0) out.bucket_size = kDefaultBucketElems;
  return out;
}

int64_t FsdpBucketElems(const std::vector<ModelParam>& params) {
  std::map<int, int64_t> block_elems;  // forward layer -> elements of its params
  std::set<int> blocks;                // layers holding a hidden matrix
  for (const ModelParam& p : params) {
    block_elems[p.layer] += p.tensor.numel();
    if (p.kind == model::ParamKind::kHidden) blocks.insert(p.layer);
  }
  int64_t largest = 0;
  for (int layer : blocks) largest = std::max(largest, block_elems[layer]);
  return std::max<int64_t>(1, (largest + 1) / 2);
}

ddp::DdpConfig DdpConfigOf(const TrainerConfig& c) {
  const DistModeSpec& mode = SpecOf(c.dist);
  ddp::DdpConfig out;
  ORTHOSHARD_DDP_FIELDS(ORTHOSHARD_COPY_FIELD)
  out.overlap_param_gather = mode.sharded_step && c.overlap_param_gather;
  out.grad_sync =
      mode.sharded_step ? buffers::GradSync::kReduceScatter : buffers::GradSync::kAllReduce;
  out.residency = mode.sharded_params ? buffers::Residency::kSharded : buffers::Residency::kFull;
  CopyField(c.fsdp_grad_syncs_in_flight, &out.grad_syncs_in_flight);
  out.grad_accumulation = c.fsdp_grad_accum == FsdpGradAccum::kSharded
                              ? ddp::GradAccumulation::kSharded
                              : ddp::GradAccumulation::kFull;
  return out;
}

#undef ORTHOSHARD_COPY_FIELD

absl::StatusOr<optimizers::RoutingConfig> RoutingConfigOf(const TrainerConfig& c) {
  optimizers::RoutingConfig routing;
  if (c.optimizer == OptimizerChoice::kAdamW) {
    routing.overrides.push_back({"*", optimizers::Route::kAdamW});
    return routing;
  }
  ASSIGN_OR_RETURN(const std::vector<RouteOverrideSpec> overrides, RouteOverrides(c));
  for (const RouteOverrideSpec& o : overrides) {
    routing.overrides.push_back({o.pattern, o.optimizer == OptimizerChoice::kMuon
                                                ? optimizers::Route::kMuon
                                                : optimizers::Route::kAdamW});
  }
  return routing;
}

std::vector<optimizers::ParamDescriptor> ParamDescriptorsOf(const std::vector<ModelParam>& params) {
  std::vector<optimizers::ParamDescriptor> descriptors;
  for (const ModelParam& p : params) {
    descriptors.push_back(
        {p.name, std::vector<int64_t>(p.tensor.sizes().begin(), p.tensor.sizes().end())});
  }
  return descriptors;
}

absl::Status CheckRouting(const TrainerConfig& c) {
  if (c.route.empty() || c.optimizer == OptimizerChoice::kAdamW) return absl::OkStatus();
  const absl::StatusOr<ResolvedModel> resolved = ResolveModel(c);
  if (!resolved.ok()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const optimizers::RoutingConfig routing, RoutingConfigOf(c));
  ASSIGN_OR_RETURN(const Gpt model, Gpt::CreateUninitialized(resolved->config, at::kFloat,
                                                             at::Device(at::kMeta)));
  const std::vector<optimizers::ParamDescriptor> params = ParamDescriptorsOf(model.params());
  const std::string flag = absl::StrCat("--route '", c.route, "'");
  if (absl::StatusOr<optimizers::RoutingReport> planned = optimizers::PlanRouting(routing, params);
      !planned.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", planned.status().message()));
  }
  for (const optimizers::RouteOverride& o : routing.overrides) {
    if (std::none_of(params.begin(), params.end(), [&o](const optimizers::ParamDescriptor& p) {
          return optimizers::GlobMatch(o.pattern, p.name);
        })) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": '", o.pattern, "' matches no param of model '", c.model,
          "' (its params are named like '", params.front().name, "' and '", params.back().name,
          "'); it would do nothing"));
    }
  }
  return absl::OkStatus();
}

namespace {

DType ParamDType(const TrainerConfig& c) {
  return c.precision == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat32;
}

// The routing (decided once) and the layout that publishes it, from which the optimizer reads it.
absl::Status RouteAndLayOut(const TrainerConfig& c, const model::GptConfig& gpt, int dp,
                            Setup& s) {
  const std::vector<ModelParam>& params = s.model->params();
  ASSIGN_OR_RETURN(const optimizers::RoutingConfig routing, RoutingConfigOf(c));
  const std::vector<optimizers::ParamDescriptor> descriptors = ParamDescriptorsOf(params);
  ASSIGN_OR_RETURN(s.routing, optimizers::PlanRouting(routing, descriptors));
  std::vector<layout::ParamSpec> specs;
  for (size_t i = 0; i < params.size(); ++i) {
    layout::ParamSpec spec;
    spec.name = params[i].name;
    spec.shape = descriptors[i].shape;
    spec.dtype = ParamDType(c);
    spec.role = s.routing.entries[i].route == optimizers::Route::kMuon ? layout::ParamRole::kMuon
                                                                      : layout::ParamRole::kAdam;
    spec.shared_embedding = params[i].kind == model::ParamKind::kEmbedding && gpt.tie_embeddings;
    spec.expert = params[i].expert >= 0;  // planned over expt_dp, in buffers of their own
    spec.tp = params[i].tp;               // the shape is the tp-local one: what the buffers hold
    specs.push_back(std::move(spec));
  }
  layout::LayoutOptions options = LayoutOptionsOf(c, dp);
  options.expert_dp = s.mesh->expt_dp().size();
  if (c.dist == DistMode::kFsdp && c.bucket_elems == 0) {
    options.bucket_size = FsdpBucketElems(params);
    options.target_buckets = 0;  // growing buckets to elements / target would merge layers again
  }
  ASSIGN_OR_RETURN(s.layout, layout::ComputeFullParamLayout(specs, options));
  return absl::OkStatus();
}

// DDP over the layout's buffers, the model's layer hooks, and the initial values written straight
// into what this rank keeps (with fsdp only its shards: no rank ever holds the whole initialised
// model; the model was built without them).
absl::Status BuildDataParallel(const TrainerConfig& c, Setup& s) {
  const std::vector<ModelParam>& params = s.model->params();
  std::vector<at::Tensor> tensors;
  std::vector<int> param_layers;
  std::vector<std::pair<int, int>> extra_reads;  // a tied embedding is read by the head too
  // Layers holding only embeddings: their backward (an index lookup's) never reads the weight, so
  // fsdp gathers nothing for it (a tied embedding is released after the head's backward for good).
  std::map<int, bool> only_embeddings;
  for (size_t i = 0; i < params.size(); ++i) {
    tensors.push_back(params[i].tensor);
    param_layers.push_back(params[i].layer);
    for (int layer : params[i].also_read_by) extra_reads.push_back({static_cast<int>(i), layer});
    auto [it, inserted] = only_embeddings.insert({params[i].layer, true});
    it->second = it->second && params[i].kind == model::ParamKind::kEmbedding;
  }
  std::vector<int> lookup_layers;
  for (const auto& [layer, embeddings] : only_embeddings) {
    if (embeddings) lookup_layers.push_back(layer);
  }
  ASSIGN_OR_RETURN(s.ddp,
                   ddp::DistributedDataParallel::Create(s.layout, tensors, &s.mesh->dp(),
                                                        &s.mesh->expt_dp(), DdpConfigOf(c)));
  ASSIGN_OR_RETURN(ddp::LayerHooks hooks,
                   s.ddp->MakeLayerHooks(param_layers, extra_reads, lookup_layers));
  s.model->set_layer_hooks({std::move(hooks.pre_forward), std::move(hooks.post_forward)});
  RETURN_IF_ERROR(s.model->ForEachInitialValue(
      c.seed, [&s](int i, const at::Tensor& value) { return s.ddp->SetParam(i, value); }));
  for (int i = 0; i < s.ddp->num_buffers(); ++i) s.buffers.push_back(&s.ddp->buffer(i));
  return absl::OkStatus();
}

// The distributed optimizer over the buffers. Each fused weight's split (QKV, SwiGLU fc1; the whole
// matrix's, also for tensor-parallel slices) is passed on: Muon orthogonalises it per block in
// every mode (blockwise derives each slice's own). Given DDP's bucket groups, its Step() starts each group's param sync as soon as this
// rank's part of it is updated (overlap_param_gather) and every remaining one at the end of the
// step. With tensor parallelism the tp-split matrices are orthogonalised as --muon_tp_mode says
// and the statistics are summed over the whole tp x dp grid (`world`), every element once.
absl::Status BuildOptimizer(const TrainerConfig& c, Communicator& world, Setup& s) {
  const std::vector<ModelParam>& params = s.model->params();
  std::map<std::string, optimizers::FusedSplit> splits;
  for (const ModelParam& p : params) {
    if (p.split.block_rows.empty()) continue;
    splits[p.name] = {p.split.num_groups, p.split.block_rows};
  }
  ASSIGN_OR_RETURN(const optimizers::ChainedConfig config, OptimizerConfigOf(c));
  optimizers::distributed::TensorParallelOptimizer tensor_parallel;
  if (s.mesh->grid().tp > 1) {
    tensor_parallel = {&s.mesh->tp(), &world, c.muon_tp_mode};
  }
  ASSIGN_OR_RETURN(s.optimizer, optimizers::distributed::CreateDistributedOptimizer(
                                    s.buffers, &s.mesh->dp(), config,
                                    SpecOf(c.dist).sharded_step
                                        ? optimizers::distributed::DistributedMode::kSharded
                                        : optimizers::distributed::DistributedMode::kReplicated,
                                    splits, &s.ddp->bucket_groups(), &s.mesh->expt_dp(),
                                    tensor_parallel));
  return absl::OkStatus();
}

// The train and eval loaders of this rank.
absl::Status BuildLoaders(const TrainerConfig& c, const TrainingData& data, Setup& s) {
  const Communicator& dp = s.mesh->dp();  // data is split over the data-parallel ranks
  data::LoaderOptions lo;
  lo.seq_len = s.seq_len;
  lo.micro_batch_size = s.micro_batch_size;
  lo.micro_batches = c.micro_batches;
  lo.rank = dp.rank();
  lo.world_size = dp.size();
  lo.seed = c.seed;
  lo.eod_token = data.eod_token;
  lo.reset_at_documents = s.documents;
  lo.mask_eod_loss = c.eod_mask_loss;
  lo.sample_order = c.sample_order == SampleOrder::kDocuments ? data::SampleOrder::kDocuments
                                                               : data::SampleOrder::kWindows;
  ASSIGN_OR_RETURN(data::DataLoader train, data::DataLoader::Create(data.train, lo));
  lo.micro_batches = c.eval_batches;
  lo.shuffle = false;  // eval: the file's order
  lo.sample_order = data::SampleOrder::kWindows;
  // An eval set without an EOD token may record no documents of its own (one stream).
  lo.reset_at_documents =
      s.documents && (data.eod_token >= 0 || data.eval->document_ends.size() > 1);
  ASSIGN_OR_RETURN(data::DataLoader eval, data::DataLoader::Create(data.eval, lo));
  s.train = std::make_unique<data::DataLoader>(std::move(train));
  s.eval = std::make_unique<data::DataLoader>(std::move(eval));
  return absl::OkStatus();
}

// --recompute and --recompute_layers as the model takes them (validated: layers -1 or in
// [1, num_layers]).
Gpt::RecomputeConfig RecomputeConfigOf(const TrainerConfig& c) {
  Gpt::RecomputeConfig r;
  r.granularity = c.recompute == RecomputeMode::kFull ? Gpt::RecomputeGranularity::kFull
                  : c.recompute == RecomputeMode::kSelective
                      ? Gpt::RecomputeGranularity::kSelective
                      : Gpt::RecomputeGranularity::kNone;
  r.layers = static_cast<int>(c.recompute_layers);
  return r;
}

}  // namespace

std::string LayoutSummary(const layout::FullParamLayout& full) {
  std::string out;
  for (const layout::PerBufferParamLayout& b : full.buffers) {
    std::vector<int64_t> sizes;
    for (const layout::Bucket& bucket : b.buckets) sizes.push_back(bucket.numel());
    const int64_t padding = b.numel() - b.unpadded_numel;
    absl::StrAppendFormat(
        &out,
        "layout: buffer %s (%s, dp %d): %d params, %d elements + %d padding (%.2f%%), "
        "%d buckets [%s]\n",
        b.key.ToString(), layout::StrategyName(b.strategy), b.dp, b.params.size(),
        b.unpadded_numel, padding, b.numel() > 0 ? 100.0 * padding / b.numel() : 0.0,
        b.buckets.size(), absl::StrJoin(sizes, ", "));
  }
  return out;
}

absl::StatusOr<Setup> Build(const TrainerConfig& c, Communicator& comm) {
  Setup s;
  s.mode = c.dist;
  // tp innermost (ranks 0..tp-1 hold the slices of one model copy), dense params data parallel
  // over dp = world / tp; experts split over ep, their params data parallel over expt_dp = dp / ep.
  collectives::MeshGrid grid = collectives::DataParallelGrid(comm.size());
  grid.tp = static_cast<int>(c.tp);
  grid.dp = comm.size() / grid.tp;
  grid.ep = static_cast<int>(c.ep);
  ASSIGN_OR_RETURN(collectives::Mesh mesh, collectives::Mesh::Create(comm, grid));
  s.mesh = std::make_unique<collectives::Mesh>(std::move(mesh));
  ASSIGN_OR_RETURN(TrainingData data, LoadTrainingData(c));
  const model::GptConfig& gpt = data.model.config;
  s.seq_len = c.seq_len > 0 ? c.seq_len : gpt.max_seq_len;
  s.micro_batch_size =
      c.global_batch / (static_cast<int64_t>(s.mesh->dp().size()) * c.micro_batches);
  s.unigram_entropy = data::UnigramEntropy(data.train->tokens);
  s.train_tokens = data.train->tokens.size();
  s.eval_tokens = data.eval->tokens.size();
  s.vocab_source = data.model.vocab_source;
  s.eval_source = data.eval_source;
  s.eod_token = data.eod_token;
  s.index_documents = static_cast<int64_t>(data.train->document_ends.size());
  s.documents = c.reset_attention_mask && (data.eod_token >= 0 || s.index_documents > 1);
  s.per_token_loss = c.eod_mask_loss;
  RETURN_IF_ERROR(BuildLoaders(c, data, s));
  // Built without values; BuildDataParallel writes them (drawn from the seed on the CPU, so every
  // device starts from the same weights) into the buffers.
  ASSIGN_OR_RETURN(Gpt model, Gpt::CreateUninitialized(
                                  gpt, c.precision == Precision::kBf16 ? at::kBFloat16 : at::kFloat,
                                  comm.device(), model::ExpertParallel{&s.mesh->ep()},
                                  model::TensorParallel{&s.mesh->tp()}));
  s.model = std::make_unique<Gpt>(std::move(model));
  RETURN_IF_ERROR(s.model->set_recompute(RecomputeConfigOf(c)));
  RETURN_IF_ERROR(RouteAndLayOut(c, gpt, s.mesh->dp().size(), s));
  RETURN_IF_ERROR(BuildDataParallel(c, s));
  RETURN_IF_ERROR(BuildOptimizer(c, comm, s));
  return s;
}

}  // namespace orthoshard::integration
