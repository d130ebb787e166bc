// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of checkpoint records,
// TensorBoard event records and the loader's data fingerprint.
//
// Table-driven slicing-by-8 in portable C++ (Debian's abseil has no absl/crc); on x86-64 CPUs with
// SSE4.2 the CRC32 instruction is used instead (checked once at run time), which computes the same
// polynomial several times faster. Same value as iSCSI / ext4 / Google's crc32c library:
// Crc32c("123456789") == 0xE3069283.
#ifndef ORTHOSHARD_COMMON_CRC32C_H_
#define ORTHOSHARD_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace orthoshard {

// Extends `crc` (the CRC of the bytes seen so far; 0 for none) by `size` bytes at `data`.
// Crc32cExtend(Crc32cExtend(0, a), b) == CRC of a followed by b.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

// The portable table-driven implementation, whatever the CPU (the reference for tests).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);

// True if Crc32cExtend uses the CPU's CRC32 instruction.
bool Crc32cIsHardwareAccelerated();

// CRC-32C of one buffer.
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

}  // namespace orthoshard

#endif  // ORTHOSHARD_COMMON_CRC32C_H_
