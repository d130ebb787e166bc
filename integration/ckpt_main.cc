// `ckpt`: inspect, verify and export checkpoints, and run the saved model on given tokens.
// Exit codes: 0 success, 1 the command failed, 2 bad arguments. The format-level commands live in
// checkpoint/tool/ckpt_commands.h; this file adds what needs orthoshard's model: the Hugging Face
// mapping of `export --format=hf` (hf_export.h) and `forward` (logits and next-token loss of the
// saved model on given ids, the reference for interop tests).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/tool/ckpt_commands.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "common/status_macros.h"
#include "integration/checkpoint_model.h"
#include "integration/hf_export.h"
#include "model/gpt_config.h"
#include "model/model.h"

namespace orthoshard::integration {

using ::orthoshard::model::SavedModel;
using ::orthoshard::model::ModelParam;
using ::orthoshard::model::Gpt;
namespace {

// What an export without --tokenizer cannot do (docs/huggingface.md#hugging-face-export).
std::string TokenizerlessExportNote(int64_t eod) {
  return absl::StrCat(
      "ckpt: note: export without --tokenizer: no tokenizer files, so "
      "AutoTokenizer.from_pretrained fails on it; tokenize with the data's own tokenizer and pass "
      "token ids. ",
      eod >= 0 ? absl::StrCat("eos_token_id is ", eod,
                              ", the checkpoint's end-of-document token (config.json, "
                              "generation_config.json).\n")
               : "The checkpoint records no end-of-document token: eos_token_id is null and "
                 "generate() stops only at max_length or max_new_tokens.\n");
}

// --tokens: "ID,ID,..." or "@FILE" (ids separated by commas or blanks).
absl::StatusOr<std::vector<int64_t>> ParseTokens(const std::string& spec, int64_t vocab) {
  std::string text = spec;
  if (!spec.empty() && spec[0] == '@') {
    std::ifstream in(spec.substr(1));
    if (!in) return absl::InvalidArgumentError(absl::StrCat("--tokens: cannot read '", spec.substr(1), "'"));
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(", \n\t"), absl::SkipEmpty())) {
    int64_t id;
    if (!absl::SimpleAtoi(piece, &id) || id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: '", piece,
                                                     "' is not a token id in [0, ", vocab, ")"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--tokens: no ids");
  return ids;
}

// The saved model with its params read from the checkpoint (CRC-checked).
absl::StatusOr<Gpt> LoadModel(const checkpoint::CheckpointReader& reader, const SavedModel& saved) {
  const bool bf16 = saved.precision == "bf16";
  ASSIGN_OR_RETURN(Gpt model,
                   Gpt::CreateUninitialized(saved.config, bf16 ? at::kBFloat16 : at::kFloat));
  for (const ModelParam& p : model.params()) {
    const std::vector<int64_t> shape(p.tensor.sizes().begin(), p.tensor.sizes().end());
    RETURN_IF_ERROR(reader.Read(
        p.name, checkpoint::kParamKind, bf16 ? "BF16" : "F32", shape,
        absl::MakeSpan(static_cast<uint8_t*>(p.tensor.data_ptr()), p.tensor.nbytes())));
  }
  return model;
}

absl::Status Forward(const std::string& dir, const checkpoint::CkptCommand& command,
                     std::ostream& out) {
  ASSIGN_OR_RETURN(checkpoint::CheckpointReader reader, checkpoint::CheckpointReader::Open(dir));
  ASSIGN_OR_RETURN(const SavedModel saved, CheckpointModel(reader.manifest(), reader.dir()));
  ASSIGN_OR_RETURN(const std::vector<int64_t> ids, ParseTokens(command.tokens, saved.config.vocab_size));
  const int64_t T = static_cast<int64_t>(ids.size());
  if (T > saved.config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens: ", T, " ids, the model takes at most ",
                                                   saved.config.max_seq_len));
  }
  ASSIGN_OR_RETURN(Gpt model, LoadModel(reader, saved));
  try {
    at::NoGradGuard no_grad;
    const at::Tensor tokens = at::tensor(ids, at::kLong).view({1, T});
    ASSIGN_OR_RETURN(at::Tensor logits, model.Forward(tokens));
    logits = logits.to(at::kFloat).contiguous();  // [1, T, V]
    if (T >= 2) {
      const at::Tensor loss = at::cross_entropy_loss(logits[0].narrow(0, 0, T - 1),
                                                     tokens[0].narrow(0, 1, T - 1));
      out << absl::StrFormat("loss %.9g over %d next-token predictions\n", loss.item<double>(), T - 1);
    }
    if (!command.out.empty()) {
      ASSIGN_OR_RETURN(checkpoint::SafetensorsWriter writer,
                       checkpoint::SafetensorsWriter::Create(
                           command.out, {{"logits", "F32", {T, saved.config.vocab_size}}},
                           {{"format", "pt"}}));
      RETURN_IF_ERROR(writer.Append(absl::MakeConstSpan(
          static_cast<const uint8_t*>(logits.data_ptr()), logits.nbytes())));
      RETURN_IF_ERROR(writer.Finish().status());
      out << "wrote logits [" << T << ", " << saved.config.vocab_size << "] to " << command.out << "\n";
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("forward: LibTorch error: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  // Under `bazel run`, resolve relative paths against the directory the user ran it from.
  if (const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY"); cwd != nullptr) {
    if (chdir(cwd) != 0) {
      std::cerr << "ckpt: cannot change to BUILD_WORKING_DIRECTORY " << cwd << "\n";
      return 1;
    }
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  auto command = checkpoint::ParseCkptArgs(args);
  if (!command.ok()) {
    std::cerr << "ckpt: " << command.status().message() << "\n" << checkpoint::kCkptUsage << "\n";
    return 2;
  }
  checkpoint::CkptExtensions extensions;
  extensions.hf_mapping = [](const checkpoint::Manifest& manifest, const std::string& dir,
                             const checkpoint::CkptCommand& c)
      -> absl::StatusOr<checkpoint::ExportMapping> {
    ASSIGN_OR_RETURN(const SavedModel saved, CheckpointModel(manifest, dir));
    ASSIGN_OR_RETURN(checkpoint::ExportMapping mapping, HfExportMapping(saved, c.tokenizer));
    if (c.tokenizer.empty()) {
      ASSIGN_OR_RETURN(const int64_t eod, SavedEodToken(saved));
      std::cerr << TokenizerlessExportNote(eod);
    }
    return mapping;
  };
  extensions.forward = Forward;
  const absl::Status status = checkpoint::RunCkptCommand(*command, std::cout, extensions);
  if (!status.ok()) {
    std::cerr << "ckpt: " << status.message() << "\n";
    // A tokenizer or token list the user gave that does not fit is bad input, as bad arguments.
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace
}  // namespace orthoshard::integration

int main(int argc, char** argv) { return orthoshard::integration::Main(argc, argv); }
