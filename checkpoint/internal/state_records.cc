#include "checkpoint/internal/state_records.h"

#include <map>
#include <utility>

#include <ATen/ops/empty.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/file_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/tp_slices.h"
#include "common/status_macros.h"

namespace orthoshard::checkpoint::internal_checkpoint {
namespace {

using optimizers::StateRecord;

// Reads one state record (a piece, as saved) with its offset and full shape.
absl::StatusOr<StateRecord> ReadStatePiece(const CheckpointReader& reader, const TensorRecord& r) {
  const auto& meta = reader.manifest().metadata();
  absl::string_view rest = absl::string_view(r.kind()).substr(sizeof(kStatePrefix) - 1);
  int64_t offset = 0;
  const size_t dot = rest.find('.');
  auto shape_it = meta.find(absl::StrCat(kFullShapePrefix, r.name()));
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dot), &offset) ||
      shape_it == meta.end()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", JoinPath(reader.dir(), r.file()),
                                            ": tensor '", r.name(), "' (", r.kind(),
                                            "): bad state record (offset or full shape)"));
  }
  StateRecord s;
  s.name = r.name();
  s.offset = offset;
  ASSIGN_OR_RETURN(s.full_shape, ParseShape(shape_it->second));
  ASSIGN_OR_RETURN(at::ScalarType type, ScalarTypeOf(r.dtype()));
  std::vector<int64_t> shape(r.global_shape().begin(), r.global_shape().end());
  s.tensor = at::empty(shape, type);
  RETURN_IF_ERROR(reader.Read(r.name(), r.kind(), r.dtype(), shape, MutableBytesOf(s.tensor)));
  return s;
}

// The elementwise state tensor `name` of a param held as `held`, whole in this rank's local
// shape, from the saved `pieces` (each some saving tp rank's piece, or a piece of the whole
// tensor): only the pieces of saving tp ranks whose slices overlap this rank's are read.
absl::StatusOr<StateRecord> AssembleStateSlice(const CheckpointReader& reader,
                                               const std::string& name,
                                               const std::vector<const TensorRecord*>& pieces,
                                               const HeldParam& held) {
  const std::vector<int64_t> model_whole =
      held.split.split() ? TpGlobalShape(held.local, held.split) : held.local;
  std::map<int, std::vector<const TensorRecord*>> by_rank;  // saving tp rank -> its pieces
  std::vector<int64_t> whole;
  for (const TensorRecord* r : pieces) {
    std::vector<int64_t> w = WholeShapeOf(*r);
    if (!r->has_tp()) {
      auto it = reader.manifest().metadata().find(absl::StrCat(kFullShapePrefix, r->name()));
      if (it == reader.manifest().metadata().end()) {
        return absl::DataLossError(absl::StrCat("checkpoint ", reader.dir(), ": state tensor '",
                                                name, "' has no full shape"));
      }
      ASSIGN_OR_RETURN(w, ParseShape(it->second));
    }
    if (!whole.empty() && w != whole) {
      return absl::DataLossError(absl::StrCat("checkpoint ", reader.dir(), ": state tensor '",
                                              name, "' has pieces of whole shapes [",
                                              absl::StrJoin(whole, ","), "] and [",
                                              absl::StrJoin(w, ","), "]"));
    }
    whole = w;
    by_rank[SplitOf(*r).rank].push_back(r);
  }
  if (whole != model_whole) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", reader.dir(), ": state tensor '", name, "' is [",
        absl::StrJoin(whole, ","), "] whole, the model's param is [",
        absl::StrJoin(model_whole, ","), "]"));
  }
  ASSIGN_OR_RETURN(at::ScalarType type, ScalarTypeOf(pieces.front()->dtype()));
  at::Tensor target = at::empty(held.local, type);
  int64_t covered = 0;
  for (const auto& [saved_rank, records] : by_rank) {
    const TpSplit from = SplitOf(*records.front());
    if (TpOverlapElements(from, held.split, whole) == 0) continue;
    std::vector<StateRecord> read;
    for (const TensorRecord* r : records) {
      ASSIGN_OR_RETURN(StateRecord s, ReadStatePiece(reader, *r));
      read.push_back(std::move(s));
    }
    const std::vector<int64_t> saved_local = from.split() ? TpLocalShape(whole, from) : whole;
    int64_t numel = 1;
    for (int64_t d : saved_local) numel *= d;
    ASSIGN_OR_RETURN(at::Tensor local, optimizers::ReadStateRange(read, name, saved_local, 0,
                                                                  numel, type));
    covered += CopyTpOverlap(BytesOf(local), from, MutableBytesOf(target), held.split, whole,
                             target.element_size());
  }
  if (covered != target.numel()) {
    return absl::NotFoundError(absl::StrCat(
        "checkpoint ", reader.dir(), ": state tensor '", name, "': its saved tp slices hold ",
        covered, " of the ", target.numel(), " elements this rank (tp ", held.split.ToString(),
        ") needs"));
  }
  StateRecord s;
  s.name = name;
  s.full_shape = held.local;
  s.tensor = target.view({-1});
  return s;
}

}  // namespace

absl::StatusOr<std::string> DTypeOf(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return std::string("F32");
    case at::kBFloat16: return std::string("BF16");
    case at::kHalf: return std::string("F16");
    case at::kDouble: return std::string("F64");
    case at::kLong: return std::string("I64");
    case at::kInt: return std::string("I32");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(t), " cannot be checkpointed"));
  }
}

absl::StatusOr<at::ScalarType> ScalarTypeOf(const std::string& dtype) {
  static const auto* kMap = new std::map<std::string, at::ScalarType>{
      {"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf},
      {"F64", at::kDouble}, {"I64", at::kLong},     {"I32", at::kInt}};
  auto it = kMap->find(dtype);
  if (it == kMap->end()) {
    return absl::DataLossError(absl::StrCat("dtype ", dtype, " is not a supported state dtype"));
  }
  return it->second;
}

absl::Span<const uint8_t> BytesOf(const at::Tensor& t) {
  return {static_cast<const uint8_t*>(t.data_ptr()), static_cast<size_t>(t.nbytes())};
}

absl::Span<uint8_t> MutableBytesOf(at::Tensor& t) {
  return {static_cast<uint8_t*>(t.data_ptr()), static_cast<size_t>(t.nbytes())};
}

std::string StateParam(const std::string& state_name) {
  const size_t slash = state_name.rfind('/');
  return slash == std::string::npos ? "" : state_name.substr(0, slash);
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& s) {
  std::vector<int64_t> shape;
  if (s.empty()) return shape;
  for (absl::string_view d : absl::StrSplit(s, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(d, &v) || v < 0) {
      return absl::DataLossError(absl::StrCat("bad full shape '", s, "'"));
    }
    shape.push_back(v);
  }
  return shape;
}

absl::Status ReadParamSlice(const CheckpointReader& reader, const std::string& name,
                            const std::string& dtype, const TpSplit& split, at::Tensor& out) {
  const WholeParam* saved = reader.FindParam(name);
  if (saved == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", reader.dir(), ": no record '", name, "' (", kParamKind, ")"));
  }
  const std::vector<int64_t> local = out.sizes().vec();
  const std::vector<int64_t> whole = split.split() ? TpGlobalShape(local, split) : local;
  if (saved->dtype != dtype || saved->shape != whole) {
    // The wording of CheckpointReader's own mismatch ("is X, the model expects Y"), plus this
    // rank's slice when the model splits the param over tp.
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", reader.dir(), ": param '", name, "' is ", saved->dtype, " [",
        absl::StrJoin(saved->shape, ","), "], the model expects ", dtype, " [",
        absl::StrJoin(whole, ","), "]",
        split.split() ? absl::StrCat(" whole (this rank's slice [", absl::StrJoin(local, ","),
                                     "], tp ", split.ToString(), ")")
                      : ""));
  }
  int64_t covered = 0;
  std::vector<uint8_t> bytes;
  for (const TensorRecord* r : saved->records) {
    const TpSplit from = SplitOf(*r);
    if (TpOverlapElements(from, split, whole) == 0) continue;
    const std::vector<int64_t> shape(r->global_shape().begin(), r->global_shape().end());
    bytes.resize(r->length());
    RETURN_IF_ERROR(reader.Read(name, r->kind(), r->dtype(), shape, absl::MakeSpan(bytes)));
    covered += CopyTpOverlap(bytes, from, MutableBytesOf(out), split, whole, out.element_size());
  }
  if (covered != out.numel()) {  // WholeParams checked the slices: a broken invariant
    return absl::InternalError(absl::StrCat("checkpoint ", reader.dir(), ": param '", name,
                                            "': its records hold ", covered, " of the ",
                                            out.numel(), " elements this rank needs"));
  }
  return absl::OkStatus();
}


absl::Status ReadState(const CheckpointReader& reader,
                       const absl::flat_hash_map<std::string, HeldParam>& held,
                       std::vector<StateRecord>& state) {
  std::map<std::string, std::vector<const TensorRecord*>> sliced;  // state name -> pieces
  std::map<std::string, const HeldParam*> sliced_param;
  for (const TensorRecord& r : reader.manifest().tensors()) {
    if (!absl::StartsWith(r.kind(), kStatePrefix)) continue;
    const std::string param = StateParam(r.name());
    const auto h = held.find(param);
    const WholeParam* saved = param.empty() ? nullptr : reader.FindParam(param);
    if (h == held.end() && saved != nullptr) continue;
    if (h != held.end() && saved != nullptr) {
      // Elementwise state of a param split when saved (the record says so) or split now (a whole
      // state tensor of the saved param's whole shape).
      bool elementwise = r.has_tp();
      if (!elementwise && h->second.split.split() && !saved->split.split()) {
        auto it = reader.manifest().metadata().find(absl::StrCat(kFullShapePrefix, r.name()));
        if (it != reader.manifest().metadata().end()) {
          absl::StatusOr<std::vector<int64_t>> full = ParseShape(it->second);
          elementwise = full.ok() && *full == saved->shape;
        }
      }
      if (elementwise) {
        sliced[r.name()].push_back(&r);
        sliced_param[r.name()] = &h->second;
        continue;
      }
    }
    ASSIGN_OR_RETURN(StateRecord s, ReadStatePiece(reader, r));
    state.push_back(std::move(s));
  }
  for (const auto& [name, pieces] : sliced) {
    ASSIGN_OR_RETURN(StateRecord s,
                     AssembleStateSlice(reader, name, pieces, *sliced_param.at(name)));
    state.push_back(std::move(s));
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::checkpoint::internal_checkpoint
