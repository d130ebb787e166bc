#include "integration/metrics/allocator_stats.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstddef>
#include <mutex>

namespace orthoshard::integration {
namespace {

// Forwards to the allocator it wraps, which must have a raw deleter (LibTorch's CPU allocator
// does). Each allocation takes kHeader more bytes from it and keeps its size in front of the data:
// the DataPtr it returns is a plain pointer with a plain deleter (data == context), which
// raw_allocate / raw_deallocate require (kernels take workspace that way), and the free is counted
// whichever thread drops the last reference.
class CountingAllocator final : public c10::Allocator {
 public:
  // The header keeps LibTorch's 64-byte alignment of the data (c10::gAlignment is at most 64).
  static constexpr size_t kHeader = 64;

  explicit CountingAllocator(c10::Allocator* base) : base_(base), base_free_(base->raw_deleter()) {
    self_ = this;
  }

  c10::DataPtr allocate(size_t n) override {
    char* raw = static_cast<char*>(base_->raw_allocate(n + kHeader));
    *reinterpret_cast<int64_t*>(raw) = static_cast<int64_t>(n);
    Add(static_cast<int64_t>(n));
    void* data = raw + kHeader;
    return c10::DataPtr(data, data, &Free, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

  // Allocations made through the counter are its own: they can be copied plainly.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  AllocatorStats stats() const {
    return {true, live_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed)};
  }
  void ResetPeak() { peak_.store(live_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

 private:
  // The one instance (a raw deleter is a plain function).
  static CountingAllocator* self_;

  static void Free(void* data) {
    if (data == nullptr) return;
    char* raw = static_cast<char*>(data) - kHeader;
    self_->live_.fetch_sub(*reinterpret_cast<int64_t*>(raw), std::memory_order_relaxed);
    self_->base_free_(raw);
  }

  void Add(int64_t bytes) {
    const int64_t live = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_free_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

CountingAllocator* CountingAllocator::self_ = nullptr;

std::once_flag install_once;
CountingAllocator* counter = nullptr;  // set once, never freed (storage may outlive main)

}  // namespace

void InstallCountingCpuAllocator() {
  std::call_once(install_once, [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    if (base->raw_deleter() == nullptr) return;  // cannot wrap it: nothing is counted
    counter = new CountingAllocator(base);
    // The priority of the allocator in place (LibTorch's default registers with 0); an equal or
    // higher one replaces it.
    c10::SetCPUAllocator(counter, /*priority=*/1);
  });
}

AllocatorStats CpuAllocatorStats() { return counter == nullptr ? AllocatorStats{} : counter->stats(); }

void ResetCpuAllocatorPeak() {
  if (counter != nullptr) counter->ResetPeak();
}

}  // namespace orthoshard::integration
