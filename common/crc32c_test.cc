#include "common/crc32c.h"

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace orthoshard {
namespace {

// Reference: bit-at-a-time CRC-32C, straight from the definition.
uint32_t BitwiseCrc32c(const std::string& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the common check value.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  std::string ones(32, '\xFF');
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
}

TEST(Crc32cTest, MatchesBitwiseReferenceAtEveryLengthAndAlignment) {
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(static_cast<char>((i * 131 + 7) & 0xFF));
  for (size_t start = 0; start < 9; ++start) {
    for (size_t len = 0; start + len <= data.size(); len += 7) {
      std::string piece = data.substr(start, len);
      ASSERT_EQ(Crc32c(data.data() + start, len), BitwiseCrc32c(piece))
          << "start " << start << " len " << len;
    }
  }
}

TEST(Crc32cTest, PortableAndDispatchedAgreeOnRandomInputs) {
  std::cout << "hardware CRC32 instruction: " << (Crc32cIsHardwareAccelerated() ? "yes" : "no")
            << "\n";
  std::string data;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 5000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    data.push_back(static_cast<char>(x));
  }
  for (size_t start = 0; start < 16; ++start) {
    for (size_t len : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63},
                       size_t{4096}, data.size() - start}) {
      if (start + len > data.size()) continue;
      uint32_t seed = static_cast<uint32_t>(start * 2654435761u);
      ASSERT_EQ(Crc32cExtend(seed, data.data() + start, len),
                Crc32cExtendPortable(seed, data.data() + start, len))
          << "start " << start << " len " << len;
    }
  }
  EXPECT_EQ(Crc32cExtendPortable(0, "123456789", 9), 0xE3069283u);
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  std::string data = "The quick brown fox jumps over the lazy dog, twice over and again.";
  for (size_t split = 0; split <= data.size(); ++split) {
    uint32_t crc = Crc32cExtend(0, data.data(), split);
    crc = Crc32cExtend(crc, data.data() + split, data.size() - split);
    ASSERT_EQ(crc, Crc32c(data.data(), data.size())) << "split " << split;
  }
}

}  // namespace
}  // namespace orthoshard
