// What the ranks of one communicator tell each other about failures through the
// group's store, and what each keeps of its own: launch progress ("progress/R":
// the last collective rank R launched), failure reports ("failed/R": the
// collective R reported failing in; "gave_up/R": the one it gave up on, with
// "gave_up" counting those), the diagnosis that names the ranks to blame from
// them, and the first failure, which every later launch on the communicator
// repeats.
#ifndef ORTHOSHARD_COLLECTIVES_INTERNAL_FAILURE_REPORTS_H_
#define ORTHOSHARD_COLLECTIVES_INTERNAL_FAILURE_REPORTS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collectives/internal/c10d_communicator.h"

namespace orthoshard::collectives::internal_collectives {

// State a Work needs after launch, shared so that a Work may outlive its
// communicator. The store calls are best effort: a store that cannot be reached
// is said so in the diagnosis, and ends the polling for peers' reports.
class GroupState {
 public:
  GroupState(c10::intrusive_ptr<c10d::Store> store, int rank, int size, GroupNaming naming,
             absl::Duration timeout);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const GroupNaming& naming() const { return naming_; }
  absl::Duration timeout() const { return timeout_; }  // the communicator's
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // "" for a world communicator, else "tp group 1 [2, 3]: ", the start of every
  // message.
  std::string Prefix() const { return naming_.label.empty() ? "" : naming_.label + ": "; }

  // Best effort, after collective #seq failed or timed out on this rank: which
  // peers to blame. Reports this rank's failure in the store (`gave_up`: also
  // as given up, so that peers waiting on #seq or later stop waiting:
  // PeerGaveUp), then waits up to `wait` for the others to report one too, and
  // names (1) the peers whose published launch progress is behind #seq ("; not
  // launched by rank 1 (last launched #33)", or "; every rank launched it"),
  // (2) the peers that reported a failure of their own ("; failures reported by
  // rank 2 in #33": casualties, not causes), and (3) the peers at or behind
  // #seq that stayed silent ("; rank 1 reported no failure within 3s (lost?)").
  // A peer that dies or hangs (SIGSTOP) mid-collective has usually launched it
  // already, so only (3) names it; and a survivor whose collective broke
  // because another survivor gave up and exited sees that survivor in (1), so
  // only (2) clears it. A silent peer that launched a later collective is named
  // after the others ("; nor did rank 0 (launched #34)").
  std::string Diagnose(int64_t seq, absl::Duration wait, bool gave_up) const;

  // A peer that gave up on collective #seq or an earlier one, as "rank 2 (gave
  // up on #33)", or "" when none did (or the store did not answer within a
  // second: then "" from now on). One store round trip while no peer gave up.
  std::string PeerGaveUp(int64_t seq);

  // Marks the communicator unusable; the first `status` given is kept for
  // FirstFailure.
  void RecordFailure(const absl::Status& status);
  bool failed() const { return failed_; }
  // The first failure recorded, without this group's Prefix; OK if none.
  absl::Status FirstFailure() const;

 private:
  static std::string FailedKey(int r);
  static std::string GaveUpKey(int r);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_ = 0;
  int size_ = 1;
  GroupNaming naming_;  // how messages name ranks
  absl::Duration timeout_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> store_silent_{false};  // a PeerGaveUp ask timed out; no more are made
  mutable absl::Mutex mu_;
  absl::Status first_failure_ ABSL_GUARDED_BY(mu_);
};

std::string ProgressKey(int rank);  // "progress/R"

}  // namespace orthoshard::collectives::internal_collectives

#endif  // ORTHOSHARD_COLLECTIVES_INTERNAL_FAILURE_REPORTS_H_
