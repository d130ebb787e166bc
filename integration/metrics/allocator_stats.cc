#include "integration/metrics/allocator_stats.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <utility>

namespace orthoshard::integration {
namespace {

// Forwards to the allocator it wraps. Each allocation's DataPtr carries a small context that owns
// the wrapped DataPtr and its size, so the free is counted whichever thread drops the last
// reference, and the memory goes back through the wrapped allocator's own deleter.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    const c10::Device device = inner.device();
    void* data = inner.get();
    auto* context = new Context{std::move(inner), static_cast<int64_t>(n), this};
    Add(context->bytes);
    return c10::DataPtr(data, context, &Free, device);
  }

  // Allocations made through the counter are its own: they can be copied plainly.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  AllocatorStats stats() const {
    return {true, live_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed)};
  }
  void ResetPeak() { peak_.store(live_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

 private:
  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
    CountingAllocator* owner;
  };

  static void Free(void* ctx) {
    auto* context = static_cast<Context*>(ctx);
    context->owner->live_.fetch_sub(context->bytes, std::memory_order_relaxed);
    delete context;  // frees the memory through the wrapped allocator's deleter
  }

  void Add(int64_t bytes) {
    const int64_t live = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
  }

  c10::Allocator* base_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

std::once_flag install_once;
CountingAllocator* counter = nullptr;  // set once, never freed (storage may outlive main)

}  // namespace

void InstallCountingCpuAllocator() {
  std::call_once(install_once, [] {
    counter = new CountingAllocator(c10::GetCPUAllocator());
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
