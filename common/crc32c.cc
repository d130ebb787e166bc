#include "common/crc32c.h"

#include <array>
#include <cstring>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "slicing-by-8 loads words little-endian");

namespace orthoshard {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reversed.

// kTables[k][b] is the CRC of byte b followed by k zero bytes (slicing-by-8, Intel 2006).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
      t[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
    }
  }
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

#if defined(__x86_64__)
// SSE4.2 CRC32 instruction: the Castagnoli polynomial in hardware, 8 bytes per instruction.
__attribute__((target("sse4.2"))) uint32_t Crc32cExtendSse42(uint32_t crc, const void* data,
                                                             size_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = __builtin_ia32_crc32qi(static_cast<uint32_t>(c), *p++);
    --size;
  }
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = __builtin_ia32_crc32qi(static_cast<uint32_t>(c), *p++);
    --size;
  }
  return ~static_cast<uint32_t>(c);
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

bool Crc32cIsHardwareAccelerated() {
#if defined(__x86_64__)
  return HasSse42();
#else
  return false;
#endif
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (HasSse42()) return Crc32cExtendSse42(crc, data, size);
#endif
  return Crc32cExtendPortable(crc, data, size);
}

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size) {
  const auto& t = GetTables().t;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFFu];
    --size;
  }
  while (size >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFFu];
    --size;
  }
  return ~c;
}

}  // namespace orthoshard
