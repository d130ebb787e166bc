#include "collectives/internal/ring.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collectives/internal/c10d_communicator.h"

namespace orthoshard::collectives::internal_collectives {

// A c10d::Work that the worker thread completes.
class RingEngine::RingWork : public c10d::Work {
 public:
  explicit RingWork(int rank) : c10d::Work(rank) {}
  void Complete(std::exception_ptr error) { finish(std::move(error)); }
};

namespace {

// Messages are matched by (peer, tag). The worker runs one step of one operation at a time, and a
// neighbour can be at most one step ahead (it cannot finish a step before this rank received from
// it), so a tag needs to differ only between consecutive steps and between operations: 1024
// operations (by sequence number) x 2 step parities x 65536 pieces.
int Tag(int64_t op_tag, int step, int64_t piece) {
  return static_cast<int>((((op_tag % 1024) * 2 + step % 2) << 16) + piece % 65536);
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  for (size_t r = 1; r < sizes.size(); ++r) offsets[r] = offsets[r - 1] + sizes[r - 1];
  return offsets;
}

}  // namespace

RingEngine::RingEngine(c10::intrusive_ptr<c10d::Backend> backend, int rank, int size,
                       absl::Duration timeout, int64_t piece_bytes, GroupNaming naming)
    : backend_(std::move(backend)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      piece_bytes_(std::max<int64_t>(piece_bytes, 4096)),
      naming_(std::move(naming)),
      worker_([this] { Loop(); }) {}

RingEngine::~RingEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  // Operations never started fail, so that nobody waits on them forever.
  for (Task& task : queue_) {
    task.work->Complete(std::make_exception_ptr(
        std::runtime_error("the communicator was destroyed before this operation ran")));
  }
}

int64_t RingEngine::ReduceScatterSentElements(const std::vector<int64_t>& sizes, int rank) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  return total - sizes[rank];
}

int64_t RingEngine::AllGatherSentElements(const std::vector<int64_t>& sizes, int rank) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  return total - sizes[(rank + 1) % static_cast<int>(sizes.size())];
}

c10::intrusive_ptr<c10d::Work> RingEngine::ReduceScatter(at::Tensor input,
                                                         std::vector<int64_t> sizes, int64_t tag,
                                                         int64_t divisor) {
  Task task;
  task.reduce = true;
  task.input = std::move(input);
  task.sizes = std::move(sizes);
  task.tag = tag;
  task.divisor = divisor;
  return Enqueue(std::move(task));
}

c10::intrusive_ptr<c10d::Work> RingEngine::AllGather(at::Tensor input, at::Tensor output,
                                                     std::vector<int64_t> sizes, int64_t tag) {
  Task task;
  task.reduce = false;
  task.input = std::move(input);
  task.output = std::move(output);
  task.sizes = std::move(sizes);
  task.tag = tag;
  return Enqueue(std::move(task));
}

c10::intrusive_ptr<c10d::Work> RingEngine::Enqueue(Task task) {
  task.work = c10::make_intrusive<RingWork>(rank_);
  c10::intrusive_ptr<c10d::Work> work = task.work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
  return work;
}

void RingEngine::Loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    Run(task);
  }
}

void RingEngine::Run(Task& task) {
  std::exception_ptr error;
  if (!failure_.empty()) {
    error = std::make_exception_ptr(std::runtime_error(
        absl::StrCat("not run: an earlier ring operation failed (", failure_, ")")));
  } else {
    try {
      task.reduce ? RunReduceScatter(task) : RunAllGather(task);
    } catch (const std::exception& e) {
      failure_ = WhatOf(e);
      error = std::make_exception_ptr(std::runtime_error(failure_));
    }
  }
  // Drop the tensors before completing: a waiter may free or reuse them at once.
  Task done = std::move(task);
  c10::intrusive_ptr<RingWork> work = std::move(done.work);
  done = Task();
  work->Complete(error);
}

template <typename OnPiece>
void RingEngine::Exchange(const at::Tensor& send, const at::Tensor& recv_into, int64_t op_tag,
                          int step, const std::string& what, OnPiece on_piece) {
  const int right = (rank_ + 1) % size_;
  const int left = (rank_ + size_ - 1) % size_;
  const int64_t piece = std::max<int64_t>(1, piece_bytes_ / send.element_size());
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs, sends;
  std::vector<std::pair<int64_t, int64_t>> recv_pieces;  // (offset, count)
  for (int64_t at = 0; at < recv_into.numel(); at += piece) {
    const int64_t count = std::min(piece, recv_into.numel() - at);
    std::vector<at::Tensor> t = {recv_into.narrow(0, at, count)};
    recvs.push_back(backend_->recv(t, left, Tag(op_tag, step, at / piece)));
    recv_pieces.push_back({at, count});
  }
  for (int64_t at = 0; at < send.numel(); at += piece) {
    std::vector<at::Tensor> t = {send.narrow(0, at, std::min(piece, send.numel() - at))};
    sends.push_back(backend_->send(t, right, Tag(op_tag, step, at / piece)));
  }
  const std::chrono::milliseconds timeout = ToChrono(timeout_);
  for (size_t i = 0; i < recvs.size(); ++i) {
    try {
      recvs[i]->wait(timeout);
    } catch (const std::exception& e) {
      throw std::runtime_error(absl::StrCat(what, ": receiving ", recv_pieces[i].second,
                                            " elements from ", NameRank(naming_, left),
                                            " failed: ", WhatOf(e)));
    }
    on_piece(recv_pieces[i].first, recv_pieces[i].second);
  }
  for (c10::intrusive_ptr<c10d::Work>& s : sends) {
    try {
      s->wait(timeout);
    } catch (const std::exception& e) {
      throw std::runtime_error(absl::StrCat(what, ": sending to ", NameRank(naming_, right),
                                            " failed: ", WhatOf(e)));
    }
  }
}

void RingEngine::RunReduceScatter(Task& task) {
  const std::vector<int64_t> offsets = Offsets(task.sizes);
  const int64_t largest = *std::max_element(task.sizes.begin(), task.sizes.end());
  if (!scratch_.defined() || scratch_.numel() < largest ||
      scratch_.scalar_type() != task.input.scalar_type()) {
    scratch_ = at::empty({largest}, task.input.options());
  }
  auto chunk = [&](int c) { return task.input.narrow(0, offsets[c], task.sizes[c]); };
  for (int s = 0; s + 1 < size_; ++s) {
    const int send_c = ((rank_ - s - 1) % size_ + size_) % size_;
    const int recv_c = ((rank_ - s - 2) % size_ + size_) % size_;
    at::Tensor target = chunk(recv_c);
    at::Tensor received = scratch_.narrow(0, 0, task.sizes[recv_c]);
    Exchange(chunk(send_c), received, task.tag, s,
             absl::StrCat("ring reduce-scatter step ", s + 1, " of ", size_ - 1),
             [&](int64_t at, int64_t count) {
               target.narrow(0, at, count).add_(received.narrow(0, at, count));
             });
  }
  if (task.divisor > 1 && task.sizes[rank_] > 0) chunk(rank_).div_(task.divisor);
}

void RingEngine::RunAllGather(Task& task) {
  const std::vector<int64_t> offsets = Offsets(task.sizes);
  auto chunk = [&](int c) { return task.output.narrow(0, offsets[c], task.sizes[c]); };
  at::Tensor own = chunk(rank_);
  if (task.sizes[rank_] > 0 && own.data_ptr() != task.input.data_ptr()) own.copy_(task.input);
  for (int s = 0; s + 1 < size_; ++s) {
    const int send_c = ((rank_ - s) % size_ + size_) % size_;
    const int recv_c = ((rank_ - s - 1) % size_ + size_) % size_;
    Exchange(chunk(send_c), chunk(recv_c), task.tag, s,
             absl::StrCat("ring all-gather step ", s + 1, " of ", size_ - 1),
             [](int64_t, int64_t) {});
  }
}

}  // namespace orthoshard::collectives::internal_collectives
