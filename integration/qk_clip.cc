#include "integration/qk_clip.h"

#include <ATen/ops/full.h>

#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/qk_clip.h"

namespace orthoshard::integration {

QkClip::QkClip(double tau, model::Gpt* model) : tau_(tau), model_(model) {
  const model::GptConfig& c = model->config();
  record_ = at::full({c.num_layers, c.num_heads}, -std::numeric_limits<float>::infinity(),
                     model->params().front().tensor.options().dtype(at::kFloat)
                         .requires_grad(false));
}

void QkClip::BeginStep() {
  record_.fill_(-std::numeric_limits<float>::infinity());
  model_->set_max_logit_record(record_);
}

absl::StatusOr<QkClipStats> QkClip::Prepare(collectives::Communicator& comm,
                                            optimizers::ChainedOptimizer& optimizer) {
  model_->set_max_logit_record(at::Tensor());
  ASSIGN_OR_RETURN(std::unique_ptr<collectives::Work> work,
                   comm.AllReduce(record_, {collectives::ReduceOp::kMax}));
  RETURN_IF_ERROR(work->Wait(comm.timeout()));
  const at::Tensor maxima = record_.cpu();
  QkClipStats stats;
  stats.max_logit = maxima.max().item<double>();
  const model::GptConfig& c = model_->config();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    // The groups clipped in the whole model (every rank computes the same count), and the factors
    // of the rows this rank holds: with tensor parallelism its KV groups' slice of the QKV weight.
    int64_t clipped = 0;
    at::Tensor scales = model::QkClipRowScales(c, maxima[l], tau_, &clipped);
    if (clipped == 0) continue;
    stats.clipped_groups += clipped;
    const std::string name = absl::StrCat("layers.", l, ".attn.qkv.weight");
    for (const model::ModelParam& p : model_->params()) {
      if (p.name == name && p.tp.split()) {
        scales = model::QkClipRowScales(c, maxima[l], tau_, nullptr, p.tp);
      }
    }
    RETURN_IF_ERROR(optimizer.SetRowScales(name, scales));
  }
  return stats;
}

}  // namespace orthoshard::integration
