// ChainedOptimizer: the one optimizer of every mode. It steps Muon on the slots routed to Muon and
// AdamW on the rest, and owns what spans both: the lr schedule, global gradient-norm clipping, the
// non-finite step skip, the step counters, and the state in model space (state.h).
//
// Local and distributed are the same class. Each rank gives the slots it updates (a single
// process: every param whole; a data-parallel rank: what it owns, see optimizers/distributed) and
// a StatsReducer that turns this rank's partial gradient statistics into the global ones: none
// (nullptr) when this process sees every gradient, one all-reduce when ranks hold parts. Every rank
// then takes the same clip and skip decision from the same global statistics.
//
// Clipping and Muon. Newton–Schulz normalises its input, so scaling a Muon gradient by a clip factor
// only changes its weight against the momentum history, and scaling after the momentum update would
// do nothing at all; meanwhile Muon's gradients, counted in one global norm, set the clip factor of
// AdamW's params too ("global-norm clipping silently stalling Muon" is a reported pitfall of
// distributed Muon). Two documented modes:
//   kAllBeforeMomentum: the norm covers every gradient; all of them, Muon's included, are scaled
//                       before they enter the moments / momentum buffer (Megatron's behaviour).
//   kExcludeMuon:       the norm covers AdamW's gradients only and only they are scaled; Muon's
//                       gradients are used as they are.
// Either way every gradient is checked for inf/NaN: a step with a non-finite gradient anywhere
// changes no param, moment, momentum buffer, step count or schedule position, and is counted in
// skipped_steps().
#ifndef ORTHOSHARD_OPTIMIZERS_CHAINED_H_
#define ORTHOSHARD_OPTIMIZERS_CHAINED_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optimizers/adamw.h"
#include "optimizers/kinds.h"
#include "optimizers/muon.h"
#include "optimizers/routing.h"
#include "optimizers/schedule.h"
#include "optimizers/slot_optimizer.h"
#include "optimizers/state.h"
#include "optimizers/tp_muon.h"

namespace orthoshard::optimizers {

struct ChainedConfig {
  RoutingConfig routing;
  AdamWHyper adamw;         // hyperparameters of the AdamW group of 2-D params (embeddings, head)
  // Weight decay of the second AdamW group: params that are not 2-D (norms, biases), which are
  // usually not decayed (Megatron's default no_weight_decay_cond). Its other hyperparameters are
  // `adamw`'s.
  double adamw_non_matrix_weight_decay = 0.0;
  // Params whose name matches one of these globs (GlobMatch) get no weight decay, whichever
  // optimizer updates them (Megatron-LM's no_weight_decay_cond by name, e.g. embeddings).
  std::vector<std::string> no_weight_decay_patterns;
  MuonHyper muon;           // hyperparameters of the Muon group
  ScheduleConfig schedule;  // multiplies both groups' lr
  double max_grad_norm = 1.0;  // global-norm clip threshold; <= 0 disables clipping
  ClipMode clip_mode = ClipMode::kAllBeforeMomentum;
  // Diagnostics, each one more pass over what the rank updates, carried by the statistics'
  // all-reduce (Megatron-LM's --log-params-norm and --log-num-zeros-in-grad): GradStats's
  // param_sum_squares (the params entering the step) and zero_grads.
  bool params_norm = false;
  bool count_zero_grads = false;
  // The local statistics over each slot's saved elements only (SlotOptimizer::GradSumSquares's
  // saved_only), for replicated ranks that do not all hold the same params (experts split over an
  // ep group), whose reducer then sums over every rank.
  bool stats_over_saved_elements = false;
  // The local statistics leave out params not split over tp (StatsScope::skip_tp_replicated): set
  // on tp ranks other than 0, so that a sum over the tp group counts such params once.
  bool stats_skip_tp_replicated = false;
};

// Sums of ||g||^2 per optimizer and whether a gradient held inf/NaN: this rank's (partial) or,
// after a StatsReducer, every rank's (global: the sums added, the flags or-ed).
struct GradStats {
  double adamw_sum_squares = 0.0;
  double muon_sum_squares = 0.0;
  bool nonfinite = false;
  // With ChainedConfig::params_norm / count_zero_grads, else 0. Doubles so that the statistics'
  // all-reduce carries them (counts are exact below 2^53).
  double param_sum_squares = 0.0;
  double zero_grads = 0.0;
};

// Combines every rank's GradStats once per step. Cross-rank contract: every rank calls Reduce once
// per ChainedOptimizer::Step, in step order, and gets the same result.
class StatsReducer {
 public:
  virtual ~StatsReducer() = default;
  // Errors: those of the collective (the job must stop).
  virtual absl::StatusOr<GradStats> Reduce(const GradStats& local) = 0;
};

struct StepResult {
  bool skipped = false;        // a gradient was not finite; nothing changed
  double grad_norm = 0.0;      // the norm clipping looked at (see ClipMode)
  double clip_scale = 1.0;     // factor applied to the clipped gradients (1 = not clipped)
  double lr_multiplier = 1.0;  // schedule factor used (0 when skipped)
  GradStats stats;             // the global statistics the decision was made from
};

// The clip-and-skip decision of one step from the global statistics. grad_norm covers Muon's params
// only under ClipMode::kAllBeforeMomentum. Skipped (lr_multiplier 0) when anything is not finite;
// else clip_scale = max_grad_norm / (grad_norm + 1e-6) when that is below 1 (Megatron's
// clip_grad_by_total_norm_fp32) and lr_multiplier is the schedule's after `steps_taken` steps.
StepResult DecideStep(const ChainedConfig& config, const GradStats& global, int64_t steps_taken);

// The clip scale Muon's params get: result.clip_scale under kAllBeforeMomentum, else 1.
double MuonClipScale(const ChainedConfig& config, const StepResult& result);

// A param given to the single-process Create: a tensor, its gradient (a handle: Step reads whatever
// the caller wrote into it), and its fused split (Muon only).
struct Param {
  std::string name;
  at::Tensor param;  // fp32 or bf16, contiguous; updated in place
  at::Tensor grad;   // same shape; undefined: not stepped
  FusedSplit split;
};

// A step cut into stages run in order, for a caller that communicates each stage's result while
// the next one is computed (a data-parallel rank starts the param all-gather of a bucket group as
// soon as its part of it is updated: see StepSync). Stage s updates every slot with
// stage_of(slot) == s, AdamW's then Muon's, then calls on_done(s); every stage in [0, num_stages)
// is run and reported, with slots or without, so ranks that own different slots report the same
// stages in the same order. The values computed are those of an unstaged step (each slot's update
// reads only its own gradient and state). A gradient that no longer matches its param is found when
// its stage runs, so earlier stages are already updated then (as an error in Muon's half leaves
// AdamW's updated in an unstaged step): callers treat step errors as fatal.
struct StepStages {
  int num_stages = 0;
  std::function<int(const Slot& slot)> stage_of;   // in [0, num_stages)
  std::function<absl::Status(int stage)> on_done;  // may be empty
};

// Whoever returns a step's updated params to the other ranks (the param sync of
// optimizers/distributed over the buffers' bucket groups), told by the optimizer as every step goes:
//   BeginStep()          before any slot is written (e.g. an all-gather still reading the params
//                        is finished first);
//   StageDone(s)         with num_stages() > 0, after stage s (StageOf) of the update, in order,
//                        every stage, whichever slots this rank owns (StepStages);
//   EndStep()            after the update, and after a skipped step too (nothing written).
// Cross-rank contract: the optimizer calls them in the same order on every rank (the step is
// skipped or not on all alike), so an implementation may launch collectives from them.
class StepSync {
 public:
  virtual ~StepSync() = default;
  // The stages of the update (0: not staged) and each slot's, in [0, num_stages()).
  virtual int num_stages() const = 0;
  virtual int StageOf(const Slot& slot) const = 0;
  // Errors: the implementation's (the collective's; the job must stop).
  virtual absl::Status BeginStep() = 0;
  virtual absl::Status StageDone(int stage) = 0;
  virtual absl::Status EndStep() = 0;
};

class ChainedOptimizer final : public OptimizerState {
 public:
  // The general form. `routing` routes every param of the model (not only this rank's);
  // `slots` are the parts this rank updates, each naming a param of `routing` (Muon slots must be
  // whole matrices); `splits` gives fused Muon params their blocks (absent: one matrix; splits of
  // AdamW params are ignored). AdamW slots of params that are not 2-D get
  // config.adamw_non_matrix_weight_decay. `reducer` combines statistics across ranks (nullptr:
  // this process sees every gradient). `sync` (may be null) is told every step's progress (see
  // StepSync); with sync->num_stages() > 0 every step is staged by it. `tp_ns` (may be null)
  // orthogonalises the Muon slots split over tensor parallelism (Slot::tp; their `splits` entry is
  // the global matrix's): see Muon and optimizers/tp_muon.h; without it they are blockwise.
  // Errors: kInvalidArgument
  // from the schedule, hyperparameters, a slot of an unknown param, a split of an unknown param,
  // or the slots themselves (see AdamW::Create, Muon::Create).
  static absl::StatusOr<std::unique_ptr<ChainedOptimizer>> Create(
      ChainedConfig config, RoutingReport routing, std::vector<Slot> slots,
      const std::map<std::string, FusedSplit>& splits, std::unique_ptr<StatsReducer> reducer,
      std::unique_ptr<StepSync> sync = nullptr, std::unique_ptr<TpNewtonSchulz> tp_ns = nullptr);

  // A single process: routes `params` with config.routing and gives each one whole slot.
  // Errors: as PlanRouting and the general Create.
  static absl::StatusOr<std::unique_ptr<ChainedOptimizer>> Create(std::vector<Param> params,
                                                                  ChainedConfig config);

  // What went where, for every param of the model; log routing_report().ToString() at start-up.
  const RoutingReport& routing_report() const { return routing_; }

  // This rank's partial statistics.
  absl::StatusOr<GradStats> LocalGradStats() const;

  // One step from global statistics: skip if not finite, else clip, schedule, update both.
  // Errors: as SlotOptimizer::Step (then, if the AdamW half had already stepped, state is
  // partially updated; a caller treats this as fatal).
  // With `stages`, the update runs stage by stage (see StepStages); a skipped step runs none.
  // Without, the StepSync's stages if it has any. With a StepSync, its BeginStep comes first and
  // its EndStep last, skipped or not. Errors: also kInvalidArgument for a slot whose stage is out
  // of range (nothing updated), on_done's and the StepSync's.
  absl::StatusOr<StepResult> StepWithStats(const GradStats& global,
                                           const StepStages* stages = nullptr);

  // LocalGradStats, the reducer (if any), StepWithStats. Errors: the reducer's, or as above.
  absl::StatusOr<StepResult> Step(const StepStages* stages = nullptr);

  // Row scales for the next step (QK-clip; see SlotOptimizer::SetRowScales): row r of param
  // `name` (2-D, whichever optimizer it is routed to) is multiplied by row_scales[r] right after
  // the next step updates this rank's part of it, on the fp32 main param and before the model
  // param is written and (through the StepSync) synced, so every mode ends with the scaled
  // param on every rank. A rank that holds nothing of `name` does nothing. The next step
  // consumes them, skipped or not (a skipped step changes no param, so none is scaled; nor is a
  // slot without a gradient). row_scales: 1-D, rows elements. Errors: kInvalidArgument for a param
  // the routing does not list, and, where this rank holds a part of it, for one that is not 2-D
  // or row scales of another length.
  absl::Status SetRowScales(absl::string_view name, const at::Tensor& row_scales);

  // Records "<param>/<field>" of every slot (the elements this rank saves) plus "chained/step"
  // and "chained/skipped_steps" (int64 scalars).
  std::vector<StateRecord> ExportState() const override;
  // Every record must be a counter above or "<param>/<field>" of a param of the model with a field
  // of its route's optimizer (kInvalidArgument "unexpected state tensor 'x'" otherwise); records of
  // params this rank does not update are otherwise ignored. Errors: see OptimizerState.
  absl::Status ImportState(absl::Span<const StateRecord> state) override;

  int64_t steps_taken() const { return steps_; }
  int64_t skipped_steps() const { return skipped_; }
  // Bytes of state this rank holds (AdamW's and Muon's SlotOptimizer::state_bytes).
  // `include` (may be empty: all) picks params by name.
  int64_t state_bytes(const std::function<bool(absl::string_view name)>& include = {}) const {
    return adamw_->state_bytes(include) + muon_->state_bytes(include);
  }
  // Muon's Newton–Schulz cost on this rank per step (Muon::ns_cost).
  double ns_cost() const;
  const AdamW& adamw() const { return *adamw_; }
  const Muon& muon() const { return *muon_; }

 private:
  ChainedOptimizer() = default;
  // StepWithStats without the StepSync's begin and end.
  absl::StatusOr<StepResult> Update(const GradStats& global, const StepStages* stages);

  ChainedConfig config_;
  RoutingReport routing_;
  std::unique_ptr<TpNewtonSchulz> tp_ns_;  // used by muon_
  std::unique_ptr<AdamW> adamw_;
  std::unique_ptr<Muon> muon_;
  std::unique_ptr<StatsReducer> reducer_;
  std::unique_ptr<StepSync> sync_;
  StepStages sync_stages_;  // the stages of sync_ (num_stages 0: none)
  int64_t steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace orthoshard::optimizers

#endif  // ORTHOSHARD_OPTIMIZERS_CHAINED_H_
