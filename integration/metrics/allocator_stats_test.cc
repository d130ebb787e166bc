// The counting CPU allocator: every byte a tensor's storage asks for is counted while it lives, the
// peak keeps the most, and memory allocated before the install is left alone.
#include "integration/metrics/allocator_stats.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/mm.h>

#include "gtest/gtest.h"

namespace orthoshard::integration {
namespace {

TEST(AllocatorStatsTest, CountsLiveAndPeakBytesOfCpuTensors) {
  EXPECT_FALSE(CpuAllocatorStats().installed);
  at::Tensor before = at::ones({1000}, at::kFloat);  // allocated by the allocator in place
  InstallCountingCpuAllocator();
  InstallCountingCpuAllocator();  // idempotent
  AllocatorStats start = CpuAllocatorStats();
  ASSERT_TRUE(start.installed);
  {
    at::Tensor a = at::empty({1024, 256}, at::kFloat);  // 1 MiB
    EXPECT_EQ(CpuAllocatorStats().live_bytes, start.live_bytes + (1 << 20));
    at::Tensor b = at::empty({512}, at::kDouble);  // 4 KiB
    EXPECT_EQ(CpuAllocatorStats().live_bytes, start.live_bytes + (1 << 20) + 4096);
    EXPECT_GE(CpuAllocatorStats().peak_bytes, start.live_bytes + (1 << 20) + 4096);
  }
  before = at::Tensor();  // freed through the allocator that made it: not counted
  const AllocatorStats after = CpuAllocatorStats();
  EXPECT_EQ(after.live_bytes, start.live_bytes);
  EXPECT_GE(after.peak_bytes, start.live_bytes + (1 << 20) + 4096);

  ResetCpuAllocatorPeak();
  EXPECT_EQ(CpuAllocatorStats().peak_bytes, after.live_bytes);
  // A kernel's result and its temporaries count too, and the values are unchanged.
  at::Tensor x = at::ones({64, 64}, at::kFloat);
  at::Tensor y = at::mm(x, x);
  EXPECT_EQ(y[3][5].item<float>(), 64.0f);
  EXPECT_GE(CpuAllocatorStats().live_bytes, after.live_bytes + 2 * 64 * 64 * 4);
}

}  // namespace
}  // namespace orthoshard::integration
