#include "integration/metrics/tensorboard.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace orthoshard::integration {
namespace {

// TFRecord's checksum: the Castagnoli CRC of checkpoint/ (hardware-accelerated where available).
uint32_t Crc32c(absl::string_view data) { return ::orthoshard::Crc32c(data.data(), data.size()); }

// Protobuf wire format: https://protobuf.dev/programming-guides/encoding/
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, uint32_t field, WireType type) { PutVarint(out, (field << 3) | type); }

template <typename T>
void PutFixed(std::string* out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian host assumed (x86-64, aarch64)
  out->append(bytes, sizeof(T));
}

void PutBytes(std::string* out, uint32_t field, absl::string_view bytes) {
  PutTag(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// A cursor over serialized protobuf bytes.
class WireReader {
 public:
  explicit WireReader(absl::string_view data) : data_(data) {}
  bool done() const { return pos_ >= data_.size(); }

  absl::StatusOr<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return absl::DataLossError("protobuf: truncated varint");
      const uint8_t byte = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    return absl::DataLossError("protobuf: varint longer than 10 bytes");
  }
  template <typename T>
  absl::StatusOr<T> Fixed() {
    if (data_.size() - pos_ < sizeof(T)) return absl::DataLossError("protobuf: truncated fixed field");
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<absl::string_view> Bytes() {
    ASSIGN_OR_RETURN(const uint64_t n, Varint());
    if (n > data_.size() - pos_) {
      return absl::DataLossError(absl::StrCat("protobuf: length-delimited field of ", n,
                                              " bytes, only ", data_.size() - pos_, " left"));
    }
    absl::string_view v = data_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  absl::Status Skip(uint32_t type) {
    switch (type) {
      case kVarint: return Varint().status();
      case kFixed64: return Fixed<uint64_t>().status();
      case kLengthDelimited: return Bytes().status();
      case kFixed32: return Fixed<uint32_t>().status();
      default: return absl::DataLossError(absl::StrCat("protobuf: unsupported wire type ", type));
    }
  }

 private:
  absl::string_view data_;
  size_t pos_ = 0;
};

absl::StatusOr<ScalarValue> DecodeValue(absl::string_view data) {
  ScalarValue value;
  WireReader r(data);
  while (!r.done()) {
    ASSIGN_OR_RETURN(const uint64_t key, r.Varint());
    const uint32_t field = key >> 3, type = key & 7;
    if (field == 1 && type == kLengthDelimited) {
      ASSIGN_OR_RETURN(absl::string_view tag, r.Bytes());
      value.tag = std::string(tag);
    } else if (field == 2 && type == kFixed32) {
      ASSIGN_OR_RETURN(value.value, r.Fixed<float>());
    } else {
      RETURN_IF_ERROR(r.Skip(type));
    }
  }
  return value;
}

absl::Status DecodeSummary(absl::string_view data, std::vector<ScalarValue>* out) {
  WireReader r(data);
  while (!r.done()) {
    ASSIGN_OR_RETURN(const uint64_t key, r.Varint());
    const uint32_t field = key >> 3, type = key & 7;
    if (field == 1 && type == kLengthDelimited) {
      ASSIGN_OR_RETURN(absl::string_view bytes, r.Bytes());
      ASSIGN_OR_RETURN(ScalarValue value, DecodeValue(bytes));
      out->push_back(std::move(value));
    } else {
      RETURN_IF_ERROR(r.Skip(type));
    }
  }
  return absl::OkStatus();
}

uint64_t LoadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string EncodeEvent(const TbEvent& event) {
  std::string out;
  if (event.wall_time != 0.0) {
    PutTag(&out, 1, kFixed64);
    PutFixed<double>(&out, event.wall_time);
  }
  if (event.step != 0) {
    PutTag(&out, 2, kVarint);
    PutVarint(&out, static_cast<uint64_t>(event.step));
  }
  if (!event.file_version.empty()) PutBytes(&out, 3, event.file_version);
  if (!event.scalars.empty()) {
    std::string summary;
    for (const ScalarValue& s : event.scalars) {
      std::string value;
      PutBytes(&value, 1, s.tag);
      PutTag(&value, 2, kFixed32);
      PutFixed<float>(&value, s.value);
      PutBytes(&summary, 1, value);
    }
    PutBytes(&out, 5, summary);
  }
  if (event.session_start) {
    std::string session_log;
    PutTag(&session_log, 1, kVarint);
    PutVarint(&session_log, 1);  // SessionLog.START
    PutBytes(&out, 7, session_log);  // Event.session_log (6 is the deprecated log_message)
  }
  return out;
}

absl::StatusOr<TbEvent> DecodeEvent(absl::string_view data) {
  TbEvent event;
  WireReader r(data);
  while (!r.done()) {
    ASSIGN_OR_RETURN(const uint64_t key, r.Varint());
    const uint32_t field = key >> 3, type = key & 7;
    if (field == 1 && type == kFixed64) {
      ASSIGN_OR_RETURN(event.wall_time, r.Fixed<double>());
    } else if (field == 2 && type == kVarint) {
      ASSIGN_OR_RETURN(const uint64_t step, r.Varint());
      event.step = static_cast<int64_t>(step);
    } else if (field == 3 && type == kLengthDelimited) {
      ASSIGN_OR_RETURN(absl::string_view v, r.Bytes());
      event.file_version = std::string(v);
    } else if (field == 5 && type == kLengthDelimited) {
      ASSIGN_OR_RETURN(absl::string_view summary, r.Bytes());
      RETURN_IF_ERROR(DecodeSummary(summary, &event.scalars));
    } else if (field == 7 && type == kLengthDelimited) {
      ASSIGN_OR_RETURN(absl::string_view session_log, r.Bytes());
      WireReader log(session_log);
      while (!log.done()) {
        ASSIGN_OR_RETURN(const uint64_t log_key, log.Varint());
        if ((log_key >> 3) == 1 && (log_key & 7) == kVarint) {
          ASSIGN_OR_RETURN(const uint64_t status, log.Varint());
          event.session_start = status == 1;
        } else {
          RETURN_IF_ERROR(log.Skip(log_key & 7));
        }
      }
    } else {
      RETURN_IF_ERROR(r.Skip(type));
    }
  }
  return event;
}

std::string FrameRecord(absl::string_view data) {
  std::string out;
  const uint64_t length = data.size();
  PutFixed<uint64_t>(&out, length);
  PutFixed<uint32_t>(&out, MaskCrc(Crc32c(out)));
  out.append(data.data(), data.size());
  PutFixed<uint32_t>(&out, MaskCrc(Crc32c(data)));
  return out;
}

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& log_dir,
                                                                 double wall_time) {
  char host[256] = "localhost";
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof(host) - 1] = '\0';
  static std::atomic<int> writers{0};
  const std::string path =
      absl::StrCat(log_dir, "/events.out.tfevents.", static_cast<int64_t>(std::floor(wall_time)),
                   ".", host, ".", static_cast<int64_t>(getpid()), ".", writers++);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    const int err = errno;
    const std::string message =
        absl::StrCat("tensorboard: cannot create '", path, "': ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::InternalError(message);
  }
  std::unique_ptr<EventWriter> writer(new EventWriter(path, file));
  TbEvent first;
  first.wall_time = wall_time;
  first.file_version = "brain.Event:2";
  RETURN_IF_ERROR(writer->WriteRecord(EncodeEvent(first)));
  RETURN_IF_ERROR(writer->Flush());
  return writer;
}

EventWriter::~EventWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status EventWriter::WriteRecord(absl::string_view data) {
  const std::string record = FrameRecord(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    return absl::InternalError(absl::StrCat("tensorboard: write to '", path_, "' failed"));
  }
  return absl::OkStatus();
}

absl::Status EventWriter::AddScalar(absl::string_view tag, int64_t step, float value,
                                    double wall_time) {
  TbEvent event;
  event.wall_time = wall_time;
  event.step = step;
  event.scalars.push_back({std::string(tag), value});
  return WriteRecord(EncodeEvent(event));
}

absl::Status EventWriter::AddSessionStart(int64_t step, double wall_time) {
  TbEvent event;
  event.wall_time = wall_time;
  event.step = step;
  event.session_start = true;
  return WriteRecord(EncodeEvent(event));
}

absl::Status EventWriter::Flush() {
  if (std::fflush(file_) != 0) {
    return absl::InternalError(absl::StrCat("tensorboard: flush of '", path_, "' failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TbEvent>> ReadEventFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("tensorboard: cannot open '", path, "'"));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseEventRecords(bytes, path);
}

absl::StatusOr<std::vector<TbEvent>> ParseEventRecords(absl::string_view bytes,
                                                       absl::string_view path) {
  std::vector<TbEvent> events;
  size_t pos = 0;
  for (int index = 0; pos < bytes.size(); ++index) {
    const std::string where = absl::StrCat(path, ": record ", index, " at offset ", pos);
    if (bytes.size() - pos < 12) {
      return absl::DataLossError(absl::StrCat(where, ": truncated header, ", bytes.size() - pos,
                                              " bytes left, expected 12"));
    }
    const uint64_t length = LoadU64(bytes.data() + pos);
    const uint32_t length_crc = LoadU32(bytes.data() + pos + 8);
    const uint32_t want_length_crc = MaskCrc(Crc32c(absl::string_view(bytes.data() + pos, 8)));
    if (length_crc != want_length_crc) {
      return absl::DataLossError(absl::StrFormat("%s: length crc 0x%08x does not match stored 0x%08x",
                                                 where, want_length_crc, length_crc));
    }
    if (length > bytes.size() - pos - 12 || bytes.size() - pos - 12 - length < 4) {
      return absl::DataLossError(absl::StrCat(where, ": truncated, record of ", length,
                                              " bytes needs ", length + 16, ", file has ",
                                              bytes.size() - pos, " left"));
    }
    const absl::string_view data(bytes.data() + pos + 12, length);
    const uint32_t data_crc = LoadU32(bytes.data() + pos + 12 + length);
    const uint32_t want_data_crc = MaskCrc(Crc32c(data));
    if (data_crc != want_data_crc) {
      return absl::DataLossError(absl::StrFormat("%s: data crc 0x%08x does not match stored 0x%08x",
                                                 where, want_data_crc, data_crc));
    }
    absl::StatusOr<TbEvent> event = DecodeEvent(data);
    if (!event.ok()) {
      return absl::DataLossError(absl::StrCat(where, ": ", event.status().message()));
    }
    events.push_back(*std::move(event));
    pos += 16 + length;
  }
  return events;
}

}  // namespace orthoshard::integration
