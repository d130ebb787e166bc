// The data a pretraining run trains and evaluates on, and the model shape that fits it: the one
// place that turns --data, --eval_data, --vocab_size and --eod_token into datasets (pretrain checks
// them before launching; every rank's trainer loads them). LibTorch-free.
#ifndef ORTHOSHARD_INTEGRATION_TRAINING_DATA_H_
#define ORTHOSHARD_INTEGRATION_TRAINING_DATA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/dataset.h"
#include "integration/config/trainer_config.h"
#include "model/gpt_config.h"

namespace orthoshard::integration {

// --model's preset with its vocabulary resolved: --vocab_size when given, else the data's own
// (a prepared directory's tokenizer; raw text's 256), else the preset's. `source` says which, for
// the startup line. Reads at most the data's dataset.json. Errors: as model::GptPreset and
// data::DescribeDatasetSpec; kInvalidArgument for a --vocab_size below the data's vocabulary.
struct ResolvedModel {
  model::GptConfig config;
  std::string vocab_source;  // "--vocab_size", "the data", "--model=<preset>"
};
absl::StatusOr<ResolvedModel> ResolveModel(const TrainerConfig& config);

struct TrainingData {
  ResolvedModel model;
  std::shared_ptr<const data::TokenDataset> train, eval;
  std::string eval_source;  // "--eval_data=...", "the data's val split", "the last 5% of --data"
  int64_t eod_token = -1;   // documents end with it; -1: none (a Megatron .idx may still record
                            // documents: train->document_ends)
};

// Loads --data and the eval set (--eval_data, else the data's own validation split, else the last
// --eval_fraction of --data), resolves the model (ResolveModel) and the EOD token (--eod_token, else
// the data's). Errors: as data::LoadDatasetSpec and data::SplitTrainEval; kInvalidArgument when a token does not
// fit the model's vocabulary, naming the largest id, the vocabulary it needs and the flag or presets
// that fit; when --eod_token contradicts the data's or is outside the vocabulary; for
// --eod_mask_loss without an EOD token; when a set is shorter than seq_len + 1 tokens.
absl::StatusOr<TrainingData> LoadTrainingData(const TrainerConfig& config);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_TRAINING_DATA_H_
