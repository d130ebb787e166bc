// TensorBoard event files, written and read without TensorFlow or a protobuf dependency.
//
// A file `events.out.tfevents.<unix seconds>.<host>` is a sequence of TFRecords:
//   u64 LE length | u32 LE masked crc32c(length bytes) | data | u32 LE masked crc32c(data)
// with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 and crc32c the Castagnoli CRC. Each record's
// data is a serialized `tensorflow.Event`; only the fields below are produced or understood
// (field numbers as in tensorflow/core/util/event.proto and summary.proto):
//   Event      { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//                SessionLog session_log = 7; }   (6 is the deprecated log_message)
//   Summary    { repeated Value value = 1; }
//   Value      { string tag = 1; float simple_value = 2; }
//   SessionLog { SessionStatus status = 1; }   START = 1
// The first record is Event{wall_time, file_version: "brain.Event:2"}; each scalar is its own Event.
// A run resumed from a checkpoint writes Event{step, session_log: START} first: TensorBoard then
// purges what earlier files logged at that step and later (the steps a crashed run logged after its
// last checkpoint, which the resumed run logs again), so a curve has each step once.
// The protobuf wire format is encoded by hand (a few varints and fixed-width fields).
#ifndef ORTHOSHARD_INTEGRATION_METRICS_TENSORBOARD_H_
#define ORTHOSHARD_INTEGRATION_METRICS_TENSORBOARD_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orthoshard::integration {

// The TFRecord mask applied to stored CRCs (Castagnoli CRC-32, common/crc32c.h).
uint32_t MaskCrc(uint32_t crc);

// One decoded scalar of an Event's summary.
struct ScalarValue {
  std::string tag;
  float value = 0.0f;
};

// One decoded Event record.
struct TbEvent {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;          // set only in the first record
  std::vector<ScalarValue> scalars;  // the summary's simple values, in order
  bool session_start = false;        // session_log {status: START}: a restart at `step`
};

// Serialized `Event` bytes for the message above (fields left at their default are omitted).
std::string EncodeEvent(const TbEvent& event);

// Appends scalar events to a new event file. Not thread-safe.
class EventWriter {
 public:
  // Creates `log_dir/events.out.tfevents.<seconds>.<host>.<pid>.<n>` (TensorFlow's naming; n counts
  // the writers of this process, so two runs started in the same second, or two writers of one
  // process, never share a file; log_dir must exist) and writes the file_version record.
  // `wall_time` is seconds since the epoch for that first record.
  // Errors: kNotFound / kPermissionDenied / kInternal when the file cannot be created
  // ("tensorboard: cannot create '<path>': <strerror>").
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(const std::string& log_dir,
                                                             double wall_time);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // Writes Event{wall_time, step, Summary{Value{tag, simple_value}}}. Errors: kInternal on a
  // failed write, naming the file.
  absl::Status AddScalar(absl::string_view tag, int64_t step, float value, double wall_time);

  // Writes Event{wall_time, step, session_log: START}: a run restarted at `step` (see the file
  // comment). Errors: as AddScalar.
  absl::Status AddSessionStart(int64_t step, double wall_time);

  // Flushes buffered records to the OS. Errors: kInternal naming the file.
  absl::Status Flush();

  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status WriteRecord(absl::string_view data);

  std::string path_;
  std::FILE* file_;
};

// Frames `data` as one TFRecord (length, masked crcs).
std::string FrameRecord(absl::string_view data);

// Reads every record of an event file, verifying both crcs of each, and decodes the Events.
// Errors: kNotFound for a missing file; kDataLoss for a truncated record or a crc mismatch
// ("<path>: record 3 at offset 120: data crc 0x... does not match stored 0x..."), or an Event
// the decoder cannot parse.
absl::StatusOr<std::vector<TbEvent>> ReadEventFile(const std::string& path);

// ReadEventFile on bytes already in memory; `path` only names them in messages. Errors: kDataLoss.
absl::StatusOr<std::vector<TbEvent>> ParseEventRecords(absl::string_view bytes,
                                                       absl::string_view path);

// Decodes one serialized Event. Unknown fields are skipped. Errors: kDataLoss for malformed bytes.
absl::StatusOr<TbEvent> DecodeEvent(absl::string_view data);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_METRICS_TENSORBOARD_H_
