#include "integration/metrics/tensorboard.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "integration/metrics/event.pb.h"
#include "integration/metrics/summary.pb.h"

namespace orthoshard::integration {
namespace {

// TFRecord's checksum: the Castagnoli CRC of checkpoint/ (hardware-accelerated where available).
uint32_t Crc32c(absl::string_view data) { return ::orthoshard::Crc32c(data.data(), data.size()); }

template <typename T>
void PutFixed(std::string* out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian host assumed (x86-64, aarch64)
  out->append(bytes, sizeof(T));
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
  tensorboard::Event message;
  message.set_wall_time(event.wall_time);
  message.set_step(event.step);
  if (!event.file_version.empty()) message.set_file_version(event.file_version);
  if (!event.scalars.empty()) {
    tensorboard::Summary* summary = message.mutable_summary();
    for (const ScalarValue& s : event.scalars) {
      tensorboard::Summary::Value* value = summary->add_value();
      value->set_tag(s.tag);
      value->set_simple_value(s.value);
    }
  }
  if (event.session_start) {
    message.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  }
  return message.SerializeAsString();
}

absl::StatusOr<TbEvent> DecodeEvent(absl::string_view data) {
  tensorboard::Event message;
  if (data.size() > INT_MAX ||
      !message.ParseFromArray(data.data(), static_cast<int>(data.size()))) {
    return absl::DataLossError(absl::StrCat("not a serialized tensorboard.Event (", data.size(),
                                            " bytes that protobuf cannot parse as one)"));
  }
  TbEvent event;
  event.wall_time = message.wall_time();
  event.step = message.step();
  event.file_version = message.file_version();
  for (const tensorboard::Summary::Value& value : message.summary().value()) {
    event.scalars.push_back({value.tag(), value.simple_value()});
  }
  event.session_start = message.has_session_log() &&
                        message.session_log().status() == tensorboard::SessionLog::START;
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
