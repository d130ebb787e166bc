#include "layout/spec.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "layout/model_spec.pb.h"

namespace orthoshard::layout {

absl::StatusOr<std::vector<ParamSpec>> ParseModelSpecJson(absl::string_view json) {
  ModelSpecProto proto;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &proto, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec is not valid JSON for {\"params\": [...]}: ",
                     status.message().as_string()));
  }
  if (proto.params_size() == 0) {
    return absl::InvalidArgumentError("model spec: \"params\" is empty; expected at least one param");
  }
  std::vector<ParamSpec> params;
  for (int i = 0; i < proto.params_size(); ++i) {
    const ParamSpecProto& p = proto.params(i);
    const std::string entry = absl::StrCat("params[", i, "] ('", p.name(), "')");
    ParamSpec spec;
    spec.name = p.name();
    spec.shape.assign(p.shape().begin(), p.shape().end());
    if (!p.dtype().empty()) {
      absl::StatusOr<DType> dtype = ParseDType(p.dtype());
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(entry, ": dtype '", p.dtype(), "' is unknown; expected e.g. bf16, fp16, fp32"));
      }
      spec.dtype = *dtype;
    }
    if (p.role() == "muon") {
      spec.role = ParamRole::kMuon;
    } else if (p.role() == "adam" || p.role().empty()) {
      spec.role = ParamRole::kAdam;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(entry, ": role '", p.role(), "' is unknown; expected muon or adam"));
    }
    spec.expert = p.expert();
    spec.shared_embedding = p.shared_embedding();
    params.push_back(std::move(spec));
  }
  return params;
}

absl::StatusOr<std::vector<ParamSpec>> ReadModelSpecFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("model spec ", path, ": cannot be read"));
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<std::vector<ParamSpec>> params = ParseModelSpecJson(text.str());
  if (!params.ok()) {
    return absl::Status(params.status().code(),
                        absl::StrCat(path, ": ", params.status().message()));
  }
  return params;
}

}  // namespace orthoshard::layout
