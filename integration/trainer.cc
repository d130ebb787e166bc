// The training loop of trainer.h over what Build (setup.h) made, with distributed checkpoints
// (checkpoint/distributed_checkpoint.h) for save and resume.
#include "integration/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "buffers/param_and_grad_buffer.h"
#include "checkpoint/commit.h"
#include "checkpoint/distributed_checkpoint.h"
#include "common/exact_sum.h"
#include "common/heap.h"
#include "common/status_macros.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "ddp/distributed_data_parallel.h"
#include "integration/checkpointer.h"
#include "integration/experts.h"
#include "integration/metrics/allocator_stats.h"
#include "integration/metrics/progress.h"
#include "integration/metrics/run_metrics.h"
#include "integration/metrics/step_profiler.h"
#include "integration/qk_clip.h"
#include "integration/run_policy.h"
#include "integration/step_agreement.h"
#include "integration/setup.h"
#include "layout/layout.h"
#include "model/gpt_config.h"
#include "model/model.h"
#include "optimizers/chained.h"

namespace orthoshard::integration {
namespace {

using data::LoaderState;
using data::MicroBatch;
using model::Documents;
using model::LossReduction;
using model::SavedModel;

using collectives::AllReduceOp;
using collectives::Communicator;
using collectives::ReduceOp;

// Token ids as an int64 [rows, cols] tensor on `device` (owning its memory).
at::Tensor ToTensor(const std::vector<int64_t>& ids, int64_t rows, int64_t cols,
                    at::Device device) {
  const at::Tensor view = at::from_blob(const_cast<int64_t*>(ids.data()), {rows, cols},
                                        at::TensorOptions().dtype(at::kLong));
  return device.is_cpu() ? view.clone() : view.to(device);
}

// A float64 [1] tensor holding `value` on the communicator's device, for a scalar collective.
at::Tensor ScalarOn(const Communicator& comm, double value) {
  return at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(comm.device()));
}

// The value of a one-element tensor on any device (one device-to-host copy).
double ValueOf(const at::Tensor& t) { return t.item<double>(); }

// "SIGTERM", "SIGINT", "SIGHUP" (the signals pretrain stops on), or "signal N".
std::string SignalName(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return absl::StrCat("signal ", signal_number);
  }
}

// Launches `ops` as one group and waits for it.
absl::Status RunGroup(Communicator& comm, std::vector<collectives::CollectiveOp> ops) {
  ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work, comm.LaunchGroup(std::move(ops)));
  return work->Wait(comm.timeout());
}


static_assert(data::kIgnoreTarget == model::kIgnoredTarget, "the loader's ignored target is the model's");

// A micro-batch's loss (mean over its counted targets, or their sum), within each row's documents
// when the run has them.
absl::StatusOr<at::Tensor> MicroBatchLoss(const Setup& s, const MicroBatch& b, at::Device device,
                                          LossReduction reduction) {
  const at::Tensor inputs = ToTensor(b.inputs, b.rows, b.cols, device);
  const at::Tensor targets = ToTensor(b.targets, b.rows, b.cols, device);
  if (!s.documents || !b.has_boundaries) {  // one document per row: plain causal attention
    return s.model->Loss(inputs, targets, nullptr, reduction);
  }
  const Documents documents{ToTensor(b.segments, b.rows, b.cols, device),
                            ToTensor(b.positions, b.rows, b.cols, device)};
  return s.model->Loss(inputs, targets, &documents, reduction);
}

// Runs `pass`, a forward or a backward over the model. A DDP hook that fails (a gather from a lost
// peer) records its error and the pass goes on over released params, where LibTorch throws an error
// that names no rank: the hook's error, which names the rank and the collective, is the one
// returned, also when nothing was thrown.
absl::Status RunModelPass(Setup& s, const std::function<absl::Status()>& pass) {
  absl::Status status;
  try {
    status = pass();
  } catch (const c10::Error&) {
    RETURN_IF_ERROR(s.ddp->TakeHookError());
    RETURN_IF_ERROR(s.model->TakeCollectiveError());  // an expert all-to-all in backward
    throw;
  }
  RETURN_IF_ERROR(s.ddp->TakeHookError());
  RETURN_IF_ERROR(s.model->TakeCollectiveError());
  return status;
}

// Eval loss over every rank's fixed eval micro-batches: the mean of the micro-batches' means, or
// with --eod_mask_loss the mean over all counted targets.
absl::StatusOr<double> Evaluate(Setup& s, Communicator& comm) {
  at::NoGradGuard no_grad;
  double total = 0, counted = 0;
  const std::vector<MicroBatch> batches = s.eval->BatchAt(0);
  for (const MicroBatch& b : batches) {
    at::Tensor loss;
    RETURN_IF_ERROR(RunModelPass(s, [&]() -> absl::Status {
      ASSIGN_OR_RETURN(loss, MicroBatchLoss(s, b, comm.device(),
                                            s.per_token_loss ? LossReduction::kSum
                                                             : LossReduction::kMean));
      return absl::OkStatus();
    }));
    total += loss.item<double>();
    counted += static_cast<double>(b.counted_targets);
  }
  if (s.per_token_loss) {
    at::Tensor sums = at::tensor({total, counted}, at::kDouble).to(comm.device());
    RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{sums, {ReduceOp::kSum}}}));
    sums = sums.cpu();
    return sums[0].item<double>() / std::max(1.0, sums[1].item<double>());
  }
  at::Tensor mean = ScalarOn(comm, total / static_cast<double>(batches.size()));
  RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{mean, {ReduceOp::kAvg}}}));
  return ValueOf(mean);
}

// Adds every element of `t` (any float dtype, any device) to `sum`.
void AddToSum(const at::Tensor& t, ExactFloatSum& sum) {
  const at::Tensor values = t.detach().to(at::kCPU).to(at::kFloat).contiguous();
  sum.Add(absl::MakeConstSpan(values.data_ptr<float>(), static_cast<size_t>(values.numel())));
}

// An exact sum's limbs as an int64 tensor on `device` (for a collective), and back.
at::Tensor LimbsTensor(const ExactFloatSum::Limbs& limbs, at::Device device) {
  return at::tensor(std::vector<int64_t>(limbs.begin(), limbs.end()), at::kLong).to(device);
}
ExactFloatSum::Limbs LimbsOf(const at::Tensor& t) {
  const at::Tensor cpu = t.cpu();
  ExactFloatSum::Limbs limbs;
  std::copy(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + limbs.size(), limbs.begin());
  return limbs;
}

// Whether this rank adds param `index` (of the model's list) to a checksum: a tensor-parallel
// slice always (the tp ranks' slices add up to the whole), a param every tp rank holds whole
// (norms) on tp rank 0 only, so that every element counts once.
bool CountedInChecksum(const Setup& s, int index) {
  return s.model->params()[index].tp.split() || s.mesh->tp().rank() == 0;
}

// The exact sum of the params of the dense buffers (expert = false) or the expert buffers, over the
// ranks of `copies`, which hold the same params (the dp group, or expt_dp), each param counted as
// CountedInChecksum says: with full residency each rank sums its own copy and compares it with
// rank 0's (a divergence fails the run; `*compared` is set); with sharded residency (fsdp) each
// holds only its shards, whose exact partial sums are added.
absl::StatusOr<ExactFloatSum> GroupChecksum(Setup& s, bool expert, Communicator& copies,
                                            int64_t step, bool* compared) {
  const bool sharded = SpecOf(s.mode).sharded_params;
  ExactFloatSum local;
  for (const buffers::ParamAndGradBuffer* buffer : s.buffers) {
    const layout::PerBufferParamLayout& l = buffer->layout();
    if (l.key.expert != expert) continue;
    for (int b = 0; b < buffer->num_buckets(); ++b) {
      // This rank's elements of the bucket: all of them, or its shard. Padding is zeros.
      const auto [begin, end] =
          sharded ? l.ShardRange(b, copies.rank()) : std::make_pair(l.buckets[b].start,
                                                                    l.buckets[b].end);
      const at::Tensor held = sharded ? buffer->ParamShard(b, copies.rank())
                                      : buffer->param_data().narrow(0, begin, end - begin);
      for (int i : buffer->BucketParams(b)) {
        const layout::ParamPlacement& p = l.params[i];
        const int64_t from = std::max(p.start, begin), to = std::min(p.end, end);
        if (from < to && CountedInChecksum(s, p.param_index)) {
          AddToSum(held.narrow(0, from - begin, to - from), local);
        }
      }
    }
  }
  const ExactFloatSum::Limbs limbs = local.limbs();
  at::Tensor agreed = LimbsTensor(limbs, copies.device());
  *compared = !sharded;
  if (sharded) {
    RETURN_IF_ERROR(RunGroup(copies, {AllReduceOp{agreed, {ReduceOp::kSum}}}));
  } else {
    RETURN_IF_ERROR(RunGroup(copies, {collectives::BroadcastOp{agreed, {0}}}));
  }
  ExactFloatSum total;
  total.Merge(LimbsOf(agreed));
  if (sharded) return total;
  at::Tensor flag = ScalarOn(copies, total.limbs() != limbs ? 1.0 : 0.0);
  RETURN_IF_ERROR(RunGroup(copies, {AllReduceOp{flag, {ReduceOp::kSum}}}));
  if (const double ranks = ValueOf(flag); ranks != 0) {
    return absl::InternalError(absl::StrFormat(
        "param checksum%s differs from rank 0's at step %d on %d rank(s) (this rank: %.17g vs "
        "%.17g)",
        expert ? " of the experts" : "", step, static_cast<int64_t>(ranks), local.ToDouble(),
        total.ToDouble()));
  }
  return total;
}

// The exact sum of every param (common/exact_sum.h), the same on every rank and for bitwise-equal
// params at any rank count, tp, ep or layout: the dense params' over the data-parallel ranks (the
// copies of this tp rank's slices), added over the tp group (every slice once), plus, for MoE, the
// experts' over each expt_dp group (the copies of an ep rank's experts) added over the ep group
// (every expert once).
absl::StatusOr<double> ParamChecksum(Setup& s, int64_t step, bool* compared) {
  at::NoGradGuard no_grad;
  RETURN_IF_ERROR(s.ddp->FinishParamSync());
  ASSIGN_OR_RETURN(ExactFloatSum dense,
                   GroupChecksum(s, /*expert=*/false, s.mesh->dp(), step, compared));
  at::Tensor slices = LimbsTensor(dense.limbs(), s.mesh->tp().device());
  RETURN_IF_ERROR(RunGroup(s.mesh->tp(), {AllReduceOp{slices, {ReduceOp::kSum}}}));
  ExactFloatSum total;
  total.Merge(LimbsOf(slices));
  if (!s.model->config().is_moe()) return total.ToDouble();
  ASSIGN_OR_RETURN(ExactFloatSum experts,
                   GroupChecksum(s, /*expert=*/true, s.mesh->expt_dp(), step, compared));
  at::Tensor all = LimbsTensor(experts.limbs(), s.mesh->ep().device());
  RETURN_IF_ERROR(RunGroup(s.mesh->ep(), {AllReduceOp{all, {ReduceOp::kSum}}}));
  total.Merge(LimbsOf(all));
  return total.ToDouble();
}

// What every rank holds (params, grads, optimizer state, transient peak, and against it the whole
// param buffers and fsdp's stated bound), one row per rank.
absl::StatusOr<std::vector<RankMemory>> GatherRankMemory(Setup& s, Communicator& comm) {
  const ddp::DdpMemory m = s.ddp->memory();
  const absl::StatusOr<ddp::TransientBound> bound = s.ddp->TransientBoundOf();  // fsdp only
  // The experts' params and grads as their buffers keep them (whole, or this rank's shards).
  int64_t expert_params = 0, expert_grads = 0, param_buffer = 0;
  std::set<std::string> expert_names;
  for (const buffers::ParamAndGradBuffer* buffer : s.buffers) {
    const layout::PerBufferParamLayout& l = buffer->layout();
    param_buffer += l.numel() * DTypeSize(l.key.param_dtype);
    if (!l.key.expert) continue;
    for (const layout::ParamPlacement& p : l.params) expert_names.insert(p.name);
    int64_t held = l.numel();
    if (buffer->residency() == buffers::Residency::kSharded) {
      held = 0;
      for (const layout::Bucket& bucket : l.buckets) held += bucket.shard_size;
    }
    expert_params += held * DTypeSize(l.key.param_dtype);
    expert_grads += held * DTypeSize(l.key.grad_dtype);
  }
  const int64_t expert_state = s.optimizer->state_bytes(
      [&](absl::string_view name) { return expert_names.count(std::string(name)) > 0; });
  // In RankMemory's field order, so that each row is the struct's fields in turn.
  const std::array<int64_t, 12> mine = {m.param_bytes,
                                        m.grad_bytes,
                                        s.optimizer->state_bytes(),
                                        m.peak_transient_bytes,
                                        MaxRssBytes(),
                                        CpuAllocatorStats().peak_bytes,
                                        expert_params,
                                        expert_grads,
                                        expert_state,
                                        static_cast<int64_t>(s.optimizer->ns_cost()),
                                        param_buffer,
                                        bound.ok() ? bound->total() : 0};
  at::Tensor rows = at::zeros({comm.size(), static_cast<int64_t>(mine.size())}, at::kLong);
  for (size_t i = 0; i < mine.size(); ++i) rows[comm.rank()][i].fill_(mine[i]);
  rows = rows.to(comm.device());
  RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{rows, {ReduceOp::kSum}}}));
  rows = rows.cpu();
  std::vector<RankMemory> out(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* row = rows[r].data_ptr<int64_t>();
    out[r] = {row[0], row[1], row[2], row[3], row[4],  row[5],
              row[6], row[7], row[8], row[9], row[10], row[11]};
  }
  return out;
}

// `value` summed over the ranks of `comm` (in fp64), the same on every rank.
absl::StatusOr<double> SumOverRanks(Communicator& comm, double value) {
  at::Tensor t = at::full({1}, value, at::kDouble).to(comm.device());
  RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{t, {ReduceOp::kSum}}}));
  return t.cpu().item<double>();
}

// The configs a checkpoint records; a resume must match them (trainer.h: "incompatible").
std::string ModelConfigString(const TrainerConfig& c, const Setup& s) {
  SavedModel saved;
  saved.preset = c.model;
  saved.config = s.model->config();
  saved.seq_len = s.seq_len;
  saved.precision = ChoiceName(c.precision);
  if (s.eod_token >= 0) {
    saved.documents = absl::StrCat("eod", s.eod_token, s.documents ? ",reset" : "",
                                   s.per_token_loss ? ",mask_loss" : "");
  } else if (s.documents) {
    saved.documents = "index,reset";
  }
  return model::FormatSavedModel(saved);
}

// The startup line's recompute: "" without, else ", recompute full" (", ... of the first N blocks").
std::string RecomputeText(const TrainerConfig& c) {
  if (c.recompute == RecomputeMode::kNone) return "";
  return absl::StrCat(", recompute ", ChoiceName(c.recompute),
                      c.recompute_layers >= 0
                          ? absl::StrCat(" (the first ", c.recompute_layers, " blocks)")
                          : std::string());
}

// The startup line's account of documents.
std::string DocumentsSummary(const Setup& s) {
  const std::string how =
      s.documents ? ": attention and positions restart after each"
                  : ": attention crosses documents (--reset_attention_mask=false)";
  if (s.eod_token >= 0) {
    return absl::StrCat("documents end with token ", s.eod_token, how,
                        s.per_token_loss ? ", loss after EOD masked" : "");
  }
  if (s.index_documents > 1) {
    return absl::StrCat("no end-of-document token; the .idx records ", s.index_documents,
                        " documents", how);
  }
  return "no end-of-document token: the data is one stream";
}

std::string OptimizerConfigString(const TrainerConfig& c) {
  return absl::StrCat("optimizer=", ChoiceName(c.optimizer));
}

// Loads save_dir's `latest` into the buffers, the sharded optimizer and the train loader; returns
// the step it was saved at. Nothing is written. Errors: see Train in trainer.h.
absl::StatusOr<int64_t> Resume(const TrainerConfig& c, Setup& s, Communicator& comm,
                               int64_t last_step, std::FILE* out) {
  at::NoGradGuard no_grad;
  absl::StatusOr<checkpoint::SharedState> loaded =
      checkpoint::LoadDistributedCheckpoint(c.save_dir, s.buffers, *s.optimizer, comm,
                                            &s.mesh->expt_dp(), CheckpointTensorParallelism(s));
  if (!loaded.ok()) {
    const absl::Status& e = loaded.status();
    // kAborted is "another rank failed to load": still the checkpoint's fault, i.e. bad input.
    return absl::Status(e.code() == absl::StatusCode::kAborted
                            ? absl::StatusCode::kFailedPrecondition
                            : e.code(),
                        absl::StrCat("--resume from '", c.save_dir, "': ", e.message()));
  }
  // Nothing below can fail on one rank only: every rank got the same shared state.
  const std::string prefix = absl::StrCat("--resume from '", c.save_dir, "' (step ", loaded->step, "): ");
  if (loaded->model_config != ModelConfigString(c, s)) {
    return absl::FailedPreconditionError(absl::StrCat(prefix, "saved by '", loaded->model_config,
                                                      "', this run is '", ModelConfigString(c, s), "'"));
  }
  if (loaded->optimizer_config != OptimizerConfigString(c)) {
    return absl::FailedPreconditionError(absl::StrCat(prefix, "saved by '", loaded->optimizer_config,
                                                      "', this run is '", OptimizerConfigString(c), "'"));
  }
  if (comm.rank() == 0) {
    // Complete checkpoints newer than the one resumed from belong to an abandoned timeline (a crash
    // before `latest` moved, or `latest` moved back by hand); saves of those steps replace them.
    absl::StatusOr<std::vector<int64_t>> newer = checkpoint::CheckpointsNewerThanLatest(c.save_dir);
    if (newer.ok() && !newer->empty()) {
      std::vector<std::string> names;
      for (int64_t step : *newer) names.push_back(checkpoint::StepDirName(step));
      std::fprintf(out, "pretrain: warning: %s holds %s, newer than `latest` (%s): "
                   "ignored, and replaced when training saves those steps again\n",
                   c.save_dir.c_str(), absl::StrJoin(names, ", ").c_str(),
                   checkpoint::StepDirName(loaded->step).c_str());
      std::fflush(out);
    }
  }
  if (loaded->step >= last_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "nothing left to run: the last step of this run is ", last_step));
  }
  absl::StatusOr<LoaderState> position = LoaderState::Parse(loaded->data_position);
  if (!position.ok()) {
    return absl::DataLossError(absl::StrCat(prefix, "data position: ", position.status().message()));
  }
  if (absl::Status r = s.train->Restore(*position); !r.ok()) {
    return absl::Status(r.code(), absl::StrCat(prefix, r.message()));
  }
  return loaded->step;
}

absl::Status MarkFailedWhileTraining(absl::Status status) {
  status.SetPayload(kFailedWhileTrainingPayload, absl::Cord());
  return status;
}

// One run per --save_dir: rank 0, which commits, takes the root's lock for the whole run. Every
// rank learns the outcome, so none waits on a rank 0 that gave up. Returns rank 0's lock.
absl::StatusOr<std::optional<checkpoint::RootLock>> LockSaveDir(const TrainerConfig& c,
                                                                Communicator& comm) {
  std::optional<checkpoint::RootLock> root_lock;
  if (c.save_dir.empty()) return root_lock;
  absl::Status locked = absl::OkStatus();
  if (comm.rank() == 0) {
    absl::StatusOr<checkpoint::RootLock> lock =
        checkpoint::LockRoot(c.save_dir, absl::StrCat("pretrain rank 0 of ", comm.size()));
    if (lock.ok()) {
      root_lock.emplace(*std::move(lock));
    } else {
      locked = absl::FailedPreconditionError(absl::StrCat("--save_dir: ", lock.status().message()));
    }
  }
  ASSIGN_OR_RETURN(const bool all_ok, collectives::AllRanksOk(comm, locked.ok()));
  if (!locked.ok()) return locked;
  if (!all_ok) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--save_dir '", c.save_dir, "': rank 0 could not lock it (see rank 0's error)"));
  }
  return root_lock;
}

// Whether this CPU has bf16 arithmetic (AVX512-BF16 or AMX-BF16), from /proc/cpuinfo's flags.
// Without it ATen's bf16 GEMMs take a fallback path: measured 10-40x slower than fp32 GEMMs on an
// AVX2-only EPYC (BENCHMARKS.md section 8).
bool CpuHasBf16Arithmetic() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return true;  // unknown: no warning
  char line[8192];
  bool has = false;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, "flags", 5) != 0) continue;
    has = std::strstr(line, " avx512_bf16") != nullptr || std::strstr(line, " amx_bf16") != nullptr;
    break;
  }
  std::fclose(f);
  return has;
}

// Rank 0's start-up report: model, data, ranks, batch shape, routing and layout.
void PrintRunHeader(const TrainerConfig& c, const Setup& s, const Communicator& comm,
                    std::FILE* out) {
  if (c.precision == Precision::kBf16 && !comm.device().is_cuda() && !CpuHasBf16Arithmetic()) {
    std::fputs("pretrain: warning: --precision=bf16 on a CPU without AVX512-BF16 or AMX: ATen "
               "runs bf16 matrix products on a fallback path, several times slower than fp32 "
               "(--precision=fp32 trains faster here)\n",
               out);
  }
  // Every expert's params, as the summary counts them; with tp or ep > 1 also what each rank holds
  // (its tp slices; the dense params and E / ep experts).
  const collectives::MeshGrid& grid = s.mesh->grid();
  const int64_t params = model::GptParamCount(s.model->config());
  std::string held;
  if (s.model->num_params() != params) {
    std::vector<std::string> at;
    if (s.model->tensor_parallel().size() > 1) {
      at.push_back(absl::StrCat("tp ", s.model->tensor_parallel().size()));
    }
    if (s.model->expert_parallel().size() > 1) {
      at.push_back(absl::StrCat("ep ", s.model->expert_parallel().size()));
    }
    held = absl::StrFormat(", %d per rank at %s", s.model->num_params(), absl::StrJoin(at, ", "));
  }
  std::fprintf(out,
               "pretrain: model %s (%lld params%s), data %s (%lld train / %lld eval tokens, "
               "unigram entropy %.3f nats), %d ranks%s, dist %s, optimizer %s%s\n"
               "pretrain: global batch %lld = %d %s x %lld micro-batches x %lld samples x "
               "%lld tokens\n",
               c.model.c_str(), static_cast<long long>(params), held.c_str(), c.data.c_str(),
               static_cast<long long>(s.train_tokens), static_cast<long long>(s.eval_tokens),
               s.unigram_entropy, comm.size(),
               grid.tp > 1 ? absl::StrFormat(" (tp %d x dp %d)", grid.tp, grid.dp).c_str() : "",
               ChoiceName(c.dist), ChoiceName(c.optimizer), RecomputeText(c).c_str(),
               static_cast<long long>(c.global_batch), grid.dp, grid.tp > 1 ? "dp ranks" : "ranks",
               static_cast<long long>(c.micro_batches), static_cast<long long>(s.micro_batch_size),
               static_cast<long long>(s.seq_len));
  std::fprintf(out, "pretrain: vocabulary %lld (from %s), eval on %s, %s\n",
               static_cast<long long>(s.model->config().vocab_size), s.vocab_source.c_str(),
               s.eval_source.c_str(),
               DocumentsSummary(s).c_str());
  std::fputs(s.routing.ToString().c_str(), out);
  std::fputs(LayoutSummary(s.layout).c_str(), out);
  std::fflush(out);
}

// What one step produced.
struct StepOutcome {
  optimizers::StepResult result;
  ExpertStats experts;           // MoE: the same on every rank (all_to_all_bytes: this rank's)
  StepAgreement::Agreed agreed;  // the same on every rank
  StepCost cost;                 // this rank's
  QkClipStats qk_clip;           // with --qk_clip_threshold; the same on every rank
};

// One optimizer step: the micro-batches' forward and backward (DDP syncs grads as backward goes:
// reduce-scatter, or all-reduce for replicated), the step agreement folded into one all-reduce,
// this rank's part of the update, and the start of the param all-gathers that the next forward's
// pre-forward hooks wait on layer by layer (nothing to gather for replicated). With `qk_clip` (may
// be null) the forwards record their max logits and the update clips the qkv weights.
absl::StatusOr<StepOutcome> RunStep(Setup& s, Communicator& comm, StepAgreement& agreement,
                                    ExpertStep& experts, int stop_signal, bool save_written,
                                    QkClip* qk_clip) {
  const absl::Time start = absl::Now();
  const double cpu_start = ProcessCpuSeconds();
  const MeshTraffic traffic_before = TrafficOf(*s.mesh);
  const ddp::DdpWaits waits_before = s.ddp->waits();
  StepOutcome out;
  s.ddp->ZeroGradBuffers();
  if (qk_clip != nullptr) qk_clip->BeginStep();
  double loss_sum = 0;
  const int64_t step = s.train->state().step;
  const std::vector<MicroBatch> batches = s.train->Next();
  // The scale that makes the dp ranks' mean gradient (pre-scaled by 1/dp) the gradient of the
  // step's loss: the mean of the micro-batches' means, or with --eod_mask_loss the sum over every
  // dp rank's counted targets divided by their number (the same on every rank: from the data
  // alone; the tp ranks of a group read the same data).
  const double per_token_scale =
      s.per_token_loss
          ? static_cast<double>(s.mesh->dp().size()) /
                static_cast<double>(std::max<int64_t>(1, s.train->CountedTargets(step)))
          : 0.0;
  for (size_t m = 0; m < batches.size(); ++m) {
    const MicroBatch& b = batches[m];
    s.ddp->set_is_last_microbatch(m + 1 == batches.size());
    const absl::Time forward_start = absl::Now();
    at::Tensor loss;
    {
      RECORD_USER_SCOPE("step/forward");  // named ranges in a --profile_step_start trace
      RETURN_IF_ERROR(RunModelPass(s, [&]() -> absl::Status {
        ASSIGN_OR_RETURN(loss, MicroBatchLoss(s, b, comm.device(),
                                              s.per_token_loss ? LossReduction::kSum
                                                               : LossReduction::kMean));
        return absl::OkStatus();
      }));
    }
    const absl::Time backward_start = absl::Now();
    {
      RECORD_USER_SCOPE("step/backward");
      RETURN_IF_ERROR(RunModelPass(s, [&]() -> absl::Status {
        const double micro_scale = 1.0 / static_cast<double>(batches.size());
        // MoE: plus the weighted auxiliary losses of this micro-batch (nothing for a dense model).
        experts
            .AddAuxLosses(loss.mul(s.per_token_loss ? per_token_scale : micro_scale), micro_scale)
            .backward();
        return absl::OkStatus();
      }));
    }
    // Averaged over the ranks below: per rank, loss_sum is what makes that average the step's loss.
    loss_sum += s.per_token_loss
                    ? loss.item<double>() * per_token_scale * static_cast<double>(batches.size())
                    : loss.item<double>();
    out.cost.forward_s += absl::ToDoubleSeconds(backward_start - forward_start);
    out.cost.backward_s += absl::ToDoubleSeconds(absl::Now() - backward_start);
  }
  {
    RECORD_USER_SCOPE("step/grad_sync_wait");
    RETURN_IF_ERROR(s.ddp->FinishGradSync());
    const ddp::DdpWaits waited = s.ddp->waits();
    agreement.Set(loss_sum / static_cast<double>(batches.size()), stop_signal, save_written,
                  waited.param_gather_s + waited.grad_sync_s);
    RETURN_IF_ERROR(RunGroup(comm, {AllReduceOp{agreement.tensor(), {ReduceOp::kAvg}}}));
    ASSIGN_OR_RETURN(out.experts, experts.Finish(comm, static_cast<int>(batches.size())));
  }
  {
    RECORD_USER_SCOPE("step/optimizer");
    const absl::Time optimizer_start = absl::Now();
    at::NoGradGuard no_grad;  // the optimizers update leaf params in place
    if (qk_clip != nullptr) {
      ASSIGN_OR_RETURN(out.qk_clip, qk_clip->Prepare(comm, *s.optimizer));
    }
    ASSIGN_OR_RETURN(out.result, s.optimizer->Step());  // starts the param sync
    out.cost.optimizer_s = absl::ToDoubleSeconds(absl::Now() - optimizer_start);
  }
  out.cost.time = absl::Now() - start;
  out.cost.cpu_s = ProcessCpuSeconds() - cpu_start;
  const MeshTraffic traffic = TrafficOf(*s.mesh);
  out.cost.comm_bytes = traffic.bytes - traffic_before.bytes;
  out.cost.wire_bytes = traffic.wire_bytes - traffic_before.wire_bytes;
  out.experts.all_to_all_bytes = traffic.all_to_all_bytes - traffic_before.all_to_all_bytes;
  out.experts.all_to_all_wire_bytes =
      traffic.all_to_all_wire_bytes - traffic_before.all_to_all_wire_bytes;
  out.cost.param_gather_wait_s = s.ddp->waits().param_gather_s - waits_before.param_gather_s;
  out.cost.grad_sync_wait_s = s.ddp->waits().grad_sync_s - waits_before.grad_sync_s;
  out.agreed = agreement.Read();
  out.cost.exposed_comm_s = out.agreed.min_comm_wait_s;
  out.cost.rank_skew_s = out.agreed.max_comm_wait_s - out.agreed.min_comm_wait_s;
  return out;
}

// The shared state a checkpoint of `step` records.
checkpoint::SharedState SharedStateAt(const TrainerConfig& c, const Setup& s, int64_t step) {
  checkpoint::SharedState shared;
  shared.step = step;
  shared.data_position = s.train->state().Serialize();
  shared.rng_seed = c.seed;
  shared.model_config = ModelConfigString(c, s);
  shared.optimizer_config = OptimizerConfigString(c);
  return shared;
}

// The stop signal the process has received (0: none).
int StopSignal(const TrainOptions& options) {
  return options.stop_signal != nullptr ? options.stop_signal->load(std::memory_order_relaxed) : 0;
}

// How the run ended, after its last step: an error when it gave up on non-finite gradients, a line
// on out when a signal stopped it.
absl::Status ReportEnd(const TrainerConfig& c, const Communicator& comm, const TrainOptions& options,
                       const TrainSummary& summary, const StepPlan& plan,
                       int64_t consecutive_skips) {
  const bool saved = !c.save_dir.empty();
  if (plan.give_up) {
    return absl::AbortedError(absl::StrCat(
        "stopping at step ", summary.steps, ": ", consecutive_skips,
        " consecutive steps had non-finite gradients (--max_consecutive_skips=",
        c.max_consecutive_skips, ")",
        saved ? absl::StrCat("; final checkpoint of step ", summary.steps, " saved in ", c.save_dir)
              : std::string("; no --save_dir, nothing saved")));
  }
  if (comm.rank() == 0 && summary.stop_signal != 0) {
    std::fprintf(options.out, "pretrain: stopped after step %lld of %lld on %s; %s\n",
                 static_cast<long long>(summary.steps), static_cast<long long>(LastStep(c)),
                 SignalName(summary.stop_signal).c_str(),
                 saved ? absl::StrCat("checkpoint of step ", summary.steps, " saved in ",
                                      c.save_dir, ": continue with --resume")
                             .c_str()
                       : "no --save_dir, nothing saved");
    std::fflush(options.out);
  }
  return absl::OkStatus();
}

// The training loop, from the initial eval to the last step's plan: every decision is made
// elsewhere (RunStep and the ranks' agreement, RunPolicy, RunMetrics, the Checkpointer) and only
// carried out here.
absl::Status TrainLoop(const TrainerConfig& c, Communicator& comm, const TrainOptions& options,
                       Setup& s, RunMetrics& metrics, TrainSummary& summary, int64_t first_step) {
  ASSIGN_OR_RETURN(const double initial_eval, Evaluate(s, comm));
  RETURN_IF_ERROR(metrics.InitialEval(initial_eval));
  std::unique_ptr<Checkpointer> saver;
  if (!c.save_dir.empty()) {
    saver = std::make_unique<Checkpointer>(c, comm, metrics.progress(), options, summary,
                                           s.buffers, *s.optimizer,
                                           [&s] { return s.ddp->FinishParamSync(); },
                                           &s.mesh->expt_dp(), CheckpointTensorParallelism(s));
  }
  RunPolicy policy(c, first_step);
  StepAgreement agreement(comm);
  std::unique_ptr<QkClip> qk_clip;
  if (c.qk_clip_threshold > 0) {
    qk_clip = std::make_unique<QkClip>(c.qk_clip_threshold, s.model.get());
  }
  ASSIGN_OR_RETURN(
      const std::unique_ptr<StepProfiler> profiler,
      StepProfiler::Create(c.profile_dir.empty() ? c.log_dir : c.profile_dir,
                           c.profile_step_start,
                           c.profile_step_end > 0 ? c.profile_step_end : c.profile_step_start,
                           comm.rank(), comm.device().is_cuda()));
  StepPlan plan;
  ExpertStep experts(c, *s.model);
  for (int64_t step = first_step; step <= policy.last_step() && !plan.last; ++step) {
    profiler->BeforeStep(step);
    ASSIGN_OR_RETURN(const StepOutcome outcome,
                     RunStep(s, comm, agreement, experts, StopSignal(options),
                             saver && saver->in_flight_written(), qk_clip.get()));
    plan = policy.After(step, outcome.result.skipped, outcome.agreed.stop_signal);
    if (profiler->StopsAfter(step, plan.last)) RETURN_IF_ERROR(s.ddp->FinishParamSync());
    RETURN_IF_ERROR(profiler->AfterStep(step, plan.last));
    if (plan.stop_early) summary.stop_signal = outcome.agreed.stop_signal;
    // The background save commits as soon as every rank has written its part: `latest` moves (and
    // a failure shows) within a step of the slowest write, not at the next save.
    if (saver) {
      RETURN_IF_ERROR(saver->CommitIfWrittenEverywhere(outcome.agreed.save_written_everywhere));
    }
    if (qk_clip) {
      RETURN_IF_ERROR(metrics.QkClip(step, outcome.qk_clip.max_logit,
                                     outcome.qk_clip.clipped_groups, outcome.result.skipped));
    }
    RETURN_IF_ERROR(
        metrics.Step(step, outcome.agreed.loss, outcome.result, outcome.cost, outcome.experts));
    if (plan.eval) {
      ASSIGN_OR_RETURN(const double eval, Evaluate(s, comm));
      RETURN_IF_ERROR(metrics.Eval(step, eval));
    }
    if (plan.check) {
      bool compared = false;
      ASSIGN_OR_RETURN(summary.param_checksum, ParamChecksum(s, step, &compared));
      summary.checksum_checks += compared;
    }
    // Snapshot now, written in the background while the next steps run.
    if (plan.save) RETURN_IF_ERROR(saver->Save(SharedStateAt(c, s, step), plan.last));
  }
  if (saver) RETURN_IF_ERROR(saver->Finish());
  RETURN_IF_ERROR(s.ddp->FinishParamSync());
  ASSIGN_OR_RETURN(summary.memory, GatherRankMemory(s, comm));
  RETURN_IF_ERROR(metrics.Finish(s.optimizer->skipped_steps()));
  ASSIGN_OR_RETURN(summary.cpu_s_per_step, SumOverRanks(comm, metrics.steady_cpu_s_per_step()));
  return ReportEnd(c, comm, options, summary, plan, policy.consecutive_skips());
}

absl::StatusOr<TrainSummary> TrainImpl(const TrainerConfig& c, Communicator& comm,
                                       const TrainOptions& options) {
  RETURN_IF_ERROR(ValidateTrainerConfig(c, comm.size()));
  RETURN_IF_ERROR(CheckSaveDir(c));
  // Model, buffers and batches live on the communicator's device; the config must agree with it.
  if (const bool cuda = c.device == Device::kCuda; cuda != comm.device().is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", ChoiceName(c.device), ": the ", comm.backend_name(),
                     " communicator reduces on ", comm.device().str(), ", expected ",
                     cuda ? "a CUDA device (NCCL)" : "the CPU (Gloo)"));
  }
  if (c.num_threads > 0) at::set_num_threads(c.num_threads);
  if (c.retain_freed_memory) RETURN_IF_ERROR(RetainFreedHeapMemory());
  ASSIGN_OR_RETURN(const std::optional<checkpoint::RootLock> root_lock, LockSaveDir(c, comm));
  ASSIGN_OR_RETURN(Setup s, Build(c, comm));
  int64_t first_step = 1;
  if (Resuming(c)) {
    ASSIGN_OR_RETURN(const int64_t saved_step, Resume(c, s, comm, LastStep(c), options.out));
    first_step = saved_step + 1;
  }
  TrainSummary summary;
  summary.world_size = comm.size();
  summary.tp = s.mesh->grid().tp;
  summary.dist = ChoiceName(c.dist);
  summary.recompute = ChoiceName(c.recompute);
  summary.recompute_layers = c.recompute_layers;
  summary.model = c.model;
  summary.optimizer = ChoiceName(c.optimizer);
  summary.num_params = model::GptParamCount(s.model->config());  // every expert, at any ep
  for (const layout::PerBufferParamLayout& b : s.layout.buffers) {
    summary.param_buffer_bytes += b.numel() * DTypeSize(b.key.param_dtype);
  }
  summary.unigram_entropy = s.unigram_entropy;
  if (comm.rank() == 0) {
    PrintRunHeader(c, s, comm, options.out);
    if (first_step > 1) {
      std::fprintf(options.out, "pretrain: resumed from the checkpoint of step %lld in %s\n",
                   static_cast<long long>(first_step - 1), c.save_dir.c_str());
    } else if (!c.save_dir.empty()) {
      std::fprintf(options.out, "pretrain: starting afresh (checkpoints in %s)\n",
                   c.save_dir.c_str());
    }
    std::fflush(options.out);
  }
  RunMetrics metrics(c, comm, *s.mesh, options, summary, first_step,
                     static_cast<double>(c.global_batch) * s.seq_len);
  RETURN_IF_ERROR(metrics.OpenTensorBoard(c.log_dir));
  // From here on a failure is the run's, not its input's.
  absl::Status trained = TrainLoop(c, comm, options, s, metrics, summary, first_step);
  if (!trained.ok()) return MarkFailedWhileTraining(std::move(trained));
  return summary;
}

}  // namespace

absl::StatusOr<TrainSummary> Train(const TrainerConfig& config, Communicator& comm,
                                   const TrainOptions& options) {
  try {
    return TrainImpl(config, comm, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("training: LibTorch error: ", e.what_without_backtrace()));
  }
}

bool FailedWhileTraining(const absl::Status& status) {
  return status.GetPayload(kFailedWhileTrainingPayload).has_value();
}

int ExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  if (FailedWhileTraining(status)) return 1;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnimplemented:
      return 2;
    default:
      return 1;
  }
}

}  // namespace orthoshard::integration
