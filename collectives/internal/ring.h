// Reduce-scatter and all-gather as rings over an engine's point-to-point send/recv (c10d Gloo's),
// for engines whose own tensor reduce-scatter is an all-reduce in disguise: each rank sends
// (N - 1)/N of the buffer once, the ideal, instead of an all-reduce's 2 (N - 1)/N.
//
//   reduce-scatter  chunk c (shard c of the input) travels the ring c+1 -> c+2 -> ... -> c, each rank
//                   adding its own chunk c on the way; after N - 1 steps rank r holds chunk r reduced
//                   (in place, in its input; divided by the divisor for an average). The sum of
//                   chunk c is (((x_{c+1} + x_{c+2}) + ...) + x_c): one fixed order, the same on
//                   every run, that depends on an element's chunk index only.
//   all-gather      each rank's shard travels the ring once, N - 1 steps, straight into the output.
//
// Each step's chunks are cut into pieces of at most `piece_bytes`, all sent and received at once,
// so the transfer of one piece overlaps the reduction of the previous ones (and large single
// messages, which Gloo moves slowly, are avoided). Uneven and empty shards are allowed.
//
// One worker thread per RingEngine runs the launched operations in launch order; each returns a
// c10d::Work completed by that thread, so Communicator's Work handles (timeouts, naming the missing
// ranks) treat it as the engine's own. The ring talks only to its two neighbours, with tags derived
// from the collective's sequence number, so engine collectives launched meanwhile by the caller's
// thread (an all-reduce of statistics during a reduce-scatter) neither wait for it nor mix with it.
// A failed send or recv (a dead peer, a timeout) fails that operation naming the peer and the step,
// and every later one at once.
#ifndef ORTHOSHARD_COLLECTIVES_INTERNAL_RING_H_
#define ORTHOSHARD_COLLECTIVES_INTERNAL_RING_H_

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/time/time.h"
#include "collectives/internal/c10d_communicator.h"

namespace orthoshard::collectives::internal_collectives {

class RingEngine {
 public:
  // `backend` provides send/recv among `size` ranks, this one being `rank`; every send and recv
  // waits at most `timeout`. Errors name the neighbours as `naming` says (NameRank).
  RingEngine(c10::intrusive_ptr<c10d::Backend> backend, int rank, int size, absl::Duration timeout,
             int64_t piece_bytes = kDefaultPieceBytes, GroupNaming naming = {});
  // Stops after the operation in progress (which ends within its timeouts).
  ~RingEngine();
  RingEngine(const RingEngine&) = delete;
  RingEngine& operator=(const RingEngine&) = delete;

  // Sums the ranks' `input` (flat, contiguous; shard r = the `sizes[r]` elements after those of
  // ranks < r) into this rank's shard of it, in place, and divides that shard by `divisor` when it
  // is above 1 (an average), before the operation completes: an operation launched after it (an
  // all-gather of the shard) reads the final values. The rest of `input` is left partially
  // reduced. `tag` identifies the collective, the same on every rank and unique among those in
  // flight (Communicator's sequence number). Returns at once.
  c10::intrusive_ptr<c10d::Work> ReduceScatter(at::Tensor input, std::vector<int64_t> sizes,
                                               int64_t tag, int64_t divisor = 1);

  // Gathers every rank's `input` (sizes[rank] elements) into `output` (flat, contiguous, shard r at
  // the offset of ranks < r); `input` may be this rank's shard of `output`. Returns at once.
  c10::intrusive_ptr<c10d::Work> AllGather(at::Tensor input, at::Tensor output,
                                           std::vector<int64_t> sizes, int64_t tag);

  // Bytes this rank sends for each, per element size: (total - sizes[rank]) for a reduce-scatter,
  // (total - sizes[(rank + 1) % size]) for an all-gather.
  static int64_t ReduceScatterSentElements(const std::vector<int64_t>& sizes, int rank);
  static int64_t AllGatherSentElements(const std::vector<int64_t>& sizes, int rank);

  static constexpr int64_t kDefaultPieceBytes = int64_t{4} << 20;

 private:
  class RingWork;
  struct Task {
    bool reduce = true;  // reduce-scatter, else all-gather
    at::Tensor input, output;
    std::vector<int64_t> sizes;
    int64_t tag = 0;
    int64_t divisor = 1;  // reduce-scatter: the reduced shard is divided by it when above 1
    c10::intrusive_ptr<RingWork> work;
  };

  c10::intrusive_ptr<c10d::Work> Enqueue(Task task);
  void Loop();
  void Run(Task& task);
  void RunReduceScatter(Task& task);
  void RunAllGather(Task& task);
  // Step `step` of operation `op_tag`: sends `send` to the right neighbour and receives
  // `recv_into` from the left one, both cut into pieces; calls on_piece(offset, count) as each
  // received piece lands. `what` names the step for errors.
  template <typename OnPiece>
  void Exchange(const at::Tensor& send, const at::Tensor& recv_into, int64_t op_tag, int step,
                const std::string& what, OnPiece on_piece);

  c10::intrusive_ptr<c10d::Backend> backend_;
  const int rank_;
  const int size_;
  const absl::Duration timeout_;
  const int64_t piece_bytes_;
  const GroupNaming naming_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  std::string failure_;     // worker thread only: why an earlier operation failed
  at::Tensor scratch_;      // worker thread only: a reduce-scatter step's received chunk
  std::thread worker_;
};

}  // namespace orthoshard::collectives::internal_collectives

#endif  // ORTHOSHARD_COLLECTIVES_INTERNAL_RING_H_
