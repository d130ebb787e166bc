// The bytes LibTorch's CPU allocator has handed out: a counting wrapper around the CPU allocator,
// installed once per process, that keeps the live total and its peak.
//
// This is the allocator's own count of tensor memory (every CPU tensor's storage, params,
// activations, gradients, optimizer state, communication buffers made of tensors), as opposed to
// the process's resident memory (getrusage's ru_maxrss: MaxRssBytes in run_metrics.h), which also
// holds LibTorch's and Gloo's code and static data, the C allocator's slack and whatever the kernel
// has not taken back. The two differ by a roughly constant base plus the heap's slack; a peak of
// this count is what a memory plan (params + grads + state + transients + activations) predicts.
//
// GPU tensors do not pass through it (a CUDA run's device memory is the caching allocator's to
// count); host tensors of a GPU run do.
#ifndef ORTHOSHARD_INTEGRATION_METRICS_ALLOCATOR_STATS_H_
#define ORTHOSHARD_INTEGRATION_METRICS_ALLOCATOR_STATS_H_

#include <cstdint>

namespace orthoshard::integration {

// Makes LibTorch's CPU allocations go through the counter (c10::SetCPUAllocator over the allocator
// in place now). Storage allocated before the call is not counted, neither when allocated nor when
// freed. Idempotent and thread-safe; the counter lives until the process ends. Where the allocator
// in place has no raw deleter (not LibTorch's own CPU allocator) nothing is installed and
// CpuAllocatorStats says so.
void InstallCountingCpuAllocator();

struct AllocatorStats {
  bool installed = false;    // InstallCountingCpuAllocator ran (else both counts are 0)
  int64_t live_bytes = 0;    // allocated through the counter and not freed yet
  int64_t peak_bytes = 0;    // the most live_bytes were since install or the last ResetPeak
};
AllocatorStats CpuAllocatorStats();

// Sets the peak to the live bytes now (e.g. at the start of a measured phase).
void ResetCpuAllocatorPeak();

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_METRICS_ALLOCATOR_STATS_H_
