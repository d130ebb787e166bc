#include "integration/training_data.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "data/data_spec.h"

namespace orthoshard::integration {

using ::orthoshard::model::GptConfig;
using ::orthoshard::model::GptPreset;
using ::orthoshard::data::TokenDataset;
using ::orthoshard::data::LoadDatasetSpec;
using ::orthoshard::data::LoadEvalSplitOf;
using ::orthoshard::data::DescribeDatasetSpec;
using ::orthoshard::data::SplitTrainEval;
namespace {

constexpr const char* kPresets[] = {"tiny", "small", "gpt2-124m", "tinyllama-1.1b"};

// Fails when `data` holds an id the model's vocabulary cannot embed, saying what would fit.
absl::Status CheckVocabulary(const TokenDataset& data, const ResolvedModel& model,
                             const TrainerConfig& config) {
  const int64_t vocab = model.config.vocab_size;
  if (data.max_token < vocab) return absl::OkStatus();
  const int64_t needed = data.max_token + 1;
  std::vector<std::string> fitting;
  for (const char* name : kPresets) {
    if (const absl::StatusOr<GptConfig> preset = GptPreset(name);
        preset.ok() && preset->vocab_size >= needed) {
      fitting.push_back(absl::StrCat(name, " (", preset->vocab_size, ")"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "data '", data.name, "' holds token id ", data.max_token, ", so the model needs a vocabulary of at least ",
      needed, "; it has ", vocab, " (from ", model.vocab_source, "). Pass --vocab_size=", needed,
      fitting.empty() ? std::string()
                      : absl::StrCat(", or a --model preset whose vocabulary is large enough: ",
                                     absl::StrJoin(fitting, ", ")),
      config.data.rfind("prepared:", 0) == 0
          ? ""
          : "; data prepared by tools/prepare_data.py records its vocabulary, so pretrain "
            "sizes the model by itself"));
}

}  // namespace

absl::StatusOr<ResolvedModel> ResolveModel(const TrainerConfig& config) {
  ResolvedModel model;
  ASSIGN_OR_RETURN(model.config, GptPreset(config.model));
  if (config.moe_top_k > 0) model.config.moe_top_k = config.moe_top_k;
  ASSIGN_OR_RETURN(const TokenDataset described, DescribeDatasetSpec(config.data));
  if (config.vocab_size > 0) {
    if (described.vocab_size > config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--vocab_size ", config.vocab_size, " is below the vocabulary of --data=", config.data,
          " (", described.vocab_size, "); leave it out to use the data's, or give at least ",
          described.vocab_size));
    }
    model.config.vocab_size = config.vocab_size;
    model.vocab_source = "--vocab_size";
  } else if (const absl::StatusOr<data::DataSpec> spec = data::ParseDataSpec(config.data);
             described.vocab_size > 0 && spec.ok() && spec->kind == data::DataKind::kPrepared) {
    // A prepared dataset brings its tokenizer's vocabulary. Byte-level data (256 ids) keeps the
    // preset's vocabulary, which is at least that.
    model.config.vocab_size = described.vocab_size;
    model.vocab_source = absl::StrCat("--data=", config.data);
  } else {
    model.vocab_source = absl::StrCat("--model=", config.model);
  }
  return model;
}

absl::StatusOr<TrainingData> LoadTrainingData(const TrainerConfig& config) {
  TrainingData out;
  ASSIGN_OR_RETURN(out.model, ResolveModel(config));
  const int64_t seq_len = config.seq_len > 0 ? config.seq_len : out.model.config.max_seq_len;
  ASSIGN_OR_RETURN(TokenDataset data, LoadDatasetSpec(config.data, config.seed));
  RETURN_IF_ERROR(CheckVocabulary(data, out.model, config));

  std::optional<TokenDataset> held_out;
  if (!config.eval_data.empty()) {
    ASSIGN_OR_RETURN(held_out, LoadDatasetSpec(config.eval_data, config.seed));
    out.eval_source = absl::StrCat("--eval_data=", config.eval_data);
  } else {
    ASSIGN_OR_RETURN(held_out, LoadEvalSplitOf(config.data));
    out.eval_source = "the data's val split";
  }
  if (held_out.has_value()) {
    TokenDataset eval = *std::move(held_out);
    RETURN_IF_ERROR(CheckVocabulary(eval, out.model, config));
    for (const TokenDataset* d : {&data, &eval}) {
      if (d->tokens.size() < seq_len + 1) {
        return absl::InvalidArgumentError(absl::StrCat("dataset '", d->name, "' has ",
                                                       d->tokens.size(), " tokens, seq_len ",
                                                       seq_len, " needs at least ", seq_len + 1));
      }
    }
    out.train = std::make_shared<const TokenDataset>(std::move(data));
    out.eval = std::make_shared<const TokenDataset>(std::move(eval));
  } else {
    ASSIGN_OR_RETURN(auto split, SplitTrainEval(data, config.eval_fraction, seq_len + 1));
    out.eval_source = absl::StrCat("the last ", config.eval_fraction * 100, "% of --data");
    out.train = std::make_shared<const TokenDataset>(std::move(split.first));
    out.eval = std::make_shared<const TokenDataset>(std::move(split.second));
  }

  out.eod_token = out.train->eod_token;
  if (config.eod_token >= 0) {
    if (out.eod_token >= 0 && out.eod_token != config.eod_token) {
      return absl::InvalidArgumentError(absl::StrCat("--eod_token ", config.eod_token,
                                                     " differs from the EOD token ", out.eod_token,
                                                     " that --data=", config.data, " records"));
    }
    out.eod_token = config.eod_token;
  }
  if (out.eod_token >= out.model.config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("--eod_token ", out.eod_token,
                                                   " is outside the vocabulary [0, ",
                                                   out.model.config.vocab_size, ")"));
  }
  if (config.eod_mask_loss && out.eod_token < 0) {
    return absl::InvalidArgumentError(
        "--eod_mask_loss needs an end-of-document token: data prepared by tools/prepare_data.py "
        "(prepared:DIR) records one; for other data pass --eod_token");
  }
  return out;
}

}  // namespace orthoshard::integration
