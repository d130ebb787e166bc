#include "integration/metrics/tensorboard.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

using ::orthoshard::testing::StatusIs;
using ::testing::HasSubstr;

using ::orthoshard::testing::TempDir;

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
}

// The record checksum (common/crc32c.h, which tensorboard.cc uses).
uint32_t Crc32c(const std::string& data) { return ::orthoshard::Crc32c(data.data(), data.size()); }

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 and the common "123456789" check value.
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(FrameRecord, LayoutAndMask) {
  const std::string record = FrameRecord("abc");
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(record.substr(12, 3), "abc");
  const uint32_t c = Crc32c("abc");
  uint32_t stored;
  std::memcpy(&stored, record.data() + 15, 4);
  EXPECT_EQ(stored, ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(EncodeEvent, MatchesProtobufWireBytes) {
  // Event{step: 3, summary: {value: {tag: "a", simple_value: 1.0}}}, bytes as protoc encodes it.
  TbEvent event;
  event.step = 3;
  event.scalars.push_back({"a", 1.0f});
  EXPECT_EQ(EncodeEvent(event), std::string("\x10\x03\x2a\x0a\x0a\x08\x0a\x01\x61\x15\x00\x00\x80\x3f", 14));
}

TEST(EventWriter, ScalarsRoundTrip) {
  ASSERT_OK_AND_ASSIGN(auto writer, EventWriter::Create(TempDir(), 1700000000.5));
  EXPECT_TRUE(absl::StrContains(writer->path(), "/events.out.tfevents.1700000000."));
  EXPECT_OK(writer->AddScalar("train/loss", 1, 5.5f, 1700000001.0));
  EXPECT_OK(writer->AddScalar("train/lr", 1, 1e-3f, 1700000001.0));
  EXPECT_OK(writer->AddScalar("train/loss", 200, 0.25f, 1700000002.0));
  EXPECT_OK(writer->Flush());

  ASSERT_OK_AND_ASSIGN(std::vector<TbEvent> events, ReadEventFile(writer->path()));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[0].wall_time, 1700000000.5);
  EXPECT_TRUE(events[0].scalars.empty());
  ASSERT_EQ(events[1].scalars.size(), 1u);
  EXPECT_EQ(events[1].scalars[0].tag, "train/loss");
  EXPECT_EQ(events[1].scalars[0].value, 5.5f);
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[2].scalars[0].tag, "train/lr");
  EXPECT_EQ(events[2].scalars[0].value, 1e-3f);
  EXPECT_EQ(events[3].step, 200);
  EXPECT_EQ(events[3].wall_time, 1700000002.0);
  EXPECT_EQ(events[3].scalars[0].value, 0.25f);
}

// SessionLog{status: START} at a step (a resumed run's first record): protobuf bytes as protoc
// encodes Event{step: 5, session_log: {status: START}}, and read back.
TEST(EventWriter, SessionStartRecord) {
  TbEvent event;
  event.step = 5;
  event.session_start = true;
  EXPECT_EQ(EncodeEvent(event), std::string("\x10\x05\x3a\x02\x08\x01", 6));
  ASSERT_OK_AND_ASSIGN(auto writer, EventWriter::Create(TempDir(), 1700000000.0));
  EXPECT_OK(writer->AddSessionStart(5, 1700000001.0));
  EXPECT_OK(writer->Flush());
  ASSERT_OK_AND_ASSIGN(std::vector<TbEvent> events, ReadEventFile(writer->path()));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[0].session_start);
  EXPECT_TRUE(events[1].session_start);
  EXPECT_EQ(events[1].step, 5);
}

// Two writers created in the same second (two runs into one --log_dir, or one process twice) get
// their own files: TensorFlow's name, with the pid and a per-process count.
TEST(EventWriter, FileNamesAreUniquePerWriter) {
  ASSERT_OK_AND_ASSIGN(auto a, EventWriter::Create(TempDir(), 1700000000.0));
  ASSERT_OK_AND_ASSIGN(auto b, EventWriter::Create(TempDir(), 1700000000.0));
  EXPECT_NE(a->path(), b->path());
  EXPECT_TRUE(absl::StrContains(a->path(), absl::StrCat(".", getpid(), "."))) << a->path();
}

TEST(ReadEventFile, DetectsCorruptionAndTruncation) {
  const std::string path = TempDir() + "/events.out.tfevents.corrupt";
  TbEvent event;
  event.step = 7;
  event.scalars.push_back({"loss", 2.0f});
  const std::string first = FrameRecord(EncodeEvent(event));
  const std::string good = first + first;
  WriteAll(path, good);
  ASSERT_OK_AND_ASSIGN(std::vector<TbEvent> events, ReadEventFile(path));
  EXPECT_EQ(events.size(), 2u);

  std::string flipped = good;
  flipped[first.size() + 14] ^= 0x01;  // a data byte of record 1
  WriteAll(path, flipped);
  EXPECT_THAT(ReadEventFile(path),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat(path, ": record 1 at offset ", first.size(),
                                              ": data crc 0x"))));

  std::string bad_length = good;
  bad_length[1] ^= 0x01;
  WriteAll(path, bad_length);
  EXPECT_THAT(ReadEventFile(path), StatusIs(absl::StatusCode::kDataLoss,
                                            HasSubstr("record 0 at offset 0: length crc 0x")));

  WriteAll(path, good.substr(0, good.size() - 2));
  EXPECT_THAT(ReadEventFile(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("record 1 at offset ")));
  WriteAll(path, good.substr(0, first.size() + 5));
  EXPECT_THAT(ReadEventFile(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated header, 5 bytes left")));

  EXPECT_THAT(ReadEventFile(TempDir() + "/missing"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
}

// Seeded random corruption: the reader returns OK or kDataLoss, never crashes.
TEST(ReadEventFile, MutatedFilesNeverCrash) {
  TbEvent event;
  event.step = 12;
  event.wall_time = 3.5;
  event.scalars.push_back({"train/loss", 1.5f});
  event.scalars.push_back({"train/lr", 0.1f});
  const std::string good = FrameRecord(EncodeEvent(event)) + FrameRecord(EncodeEvent(event));
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string bytes = good;
    switch (rng() % 3) {
      case 0: bytes[rng() % bytes.size()] ^= static_cast<char>(1u << (rng() % 8)); break;
      case 1: bytes.resize(rng() % bytes.size()); break;
      case 2: bytes[rng() % bytes.size()] = static_cast<char>(rng()); break;
    }
    absl::StatusOr<std::vector<TbEvent>> events = ParseEventRecords(bytes, "mutated");
    if (!events.ok()) {
      EXPECT_EQ(events.status().code(), absl::StatusCode::kDataLoss) << events.status();
    }
  }
  // Payloads that pass the crc but are not valid protobuf are reported, not misread: a
  // length-delimited field longer than what is left, an unterminated group.
  EXPECT_THAT(DecodeEvent(std::string("\x1a\x05" "ab", 4)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("not a serialized tensorboard.Event (4 bytes")));
  EXPECT_THAT(DecodeEvent(std::string("\x0b", 1)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a serialized tensorboard.Event")));
}

TEST(EventWriter, MissingDirectoryIsNotFound) {
  EXPECT_THAT(EventWriter::Create(TempDir() + "/no/such/dir", 1.0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tensorboard: cannot create '")));
}

}  // namespace
}  // namespace orthoshard::integration
