#include "common/heap.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace orthoshard {
namespace {

// Runs in its own test binary: the policy is process-wide. mallinfo2 describes the main arena,
// which serves the main thread (gtest's).
TEST(RetainFreedHeapMemoryTest, LargeFreedBlocksStayInTheHeapForReuse) {
  ASSERT_TRUE(RetainFreedHeapMemory().ok());
  // 24 MiB: above glibc's default mmap threshold (128 KiB; dynamic up to 32 MiB only after a
  // block of that size was mmap'd and freed, which has not happened in this process).
  constexpr size_t kBytes = size_t{24} << 20;
  const struct mallinfo2 before = mallinfo2();
  void* block = std::malloc(kBytes);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  const struct mallinfo2 held = mallinfo2();
  // Served from the heap (arena), not by mmap.
  EXPECT_EQ(held.hblkhd, before.hblkhd);
  EXPECT_GE(held.arena, before.arena + kBytes);
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  // Not trimmed: the freed block is still the process's, free for the next allocation.
  EXPECT_GE(after.fordblks, kBytes);
  EXPECT_EQ(after.arena, held.arena);
  void* again = std::malloc(kBytes);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(mallinfo2().arena, held.arena);  // reused: the heap did not grow
  std::free(again);
}

}  // namespace
}  // namespace orthoshard
