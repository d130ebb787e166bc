// The model a checkpoint records, read in one place: every reader of a checkpoint's model config
// (`ckpt forward`, `ckpt export --format=hf`) takes it from here, checked against the params the
// manifest lists before anything is built, allocated or written from it. The manifest's CRC says
// only that the file is the one written; a crafted one can carry any config beside any tensors.
#ifndef ORTHOSHARD_INTEGRATION_CHECKPOINT_MODEL_H_
#define ORTHOSHARD_INTEGRATION_CHECKPOINT_MODEL_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/manifest.pb.h"
#include "model/gpt_config.h"

namespace orthoshard::integration {

// The SavedModel of `manifest`'s model_config, checked by model::CheckSavedParams against the
// manifest's params (whole, tp slices assembled: checkpoint::WholeParams). `source` names the
// checkpoint in errors. The shard files' headers are not read here; CheckpointReader::Open checks
// them against these records. Errors: kInvalidArgument "checkpoint <source>: model config
// \"<text>\": <what contradicts what>" (those of ParseSavedModel and CheckSavedParams); those of
// WholeParams (kDataLoss).
absl::StatusOr<model::SavedModel> CheckpointModel(const checkpoint::Manifest& manifest,
                                                  absl::string_view source);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_CHECKPOINT_MODEL_H_
