#include "collectives/internal/failure_reports.h"

#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace orthoshard::collectives::internal_collectives {
namespace {

constexpr char kGaveUpCountKey[] = "gave_up";

// The integer at `key`, 0 if it is absent or not one.
int64_t ReadInt(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return 0;
  const std::vector<uint8_t> value = store.get(key);
  int64_t n = 0;
  return absl::SimpleAtoi(std::string(value.begin(), value.end()), &n) ? n : 0;
}

}  // namespace

std::string ProgressKey(int rank) { return absl::StrCat("progress/", rank); }

GroupState::GroupState(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                       GroupNaming naming, absl::Duration timeout)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      naming_(std::move(naming)),
      timeout_(timeout) {}

std::string GroupState::FailedKey(int r) { return absl::StrCat("failed/", r); }
std::string GroupState::GaveUpKey(int r) { return absl::StrCat("gave_up/", r); }

std::string GroupState::Diagnose(int64_t seq, absl::Duration wait, bool gave_up) const {
  struct Peer {
    int64_t launched = 0;  // last launched collective, 0 if none
    int64_t failed = 0;    // the collective it reported failing in, 0 if none
  };
  std::vector<Peer> peers(size_);
  auto read_int = [this](const std::string& key) { return ReadInt(*store_, key); };
  std::vector<int64_t> launched_at_failure(size_, 0);  // "not launched by" is as of the failure
  try {
    store_->setTimeout(std::chrono::milliseconds(2000));
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) launched_at_failure[r] = read_int(ProgressKey(r));
    }
    store_->set(FailedKey(rank_), std::to_string(seq));
    if (gave_up) {
      // The key first, then the count that PeerGaveUp reads first.
      store_->set(GaveUpKey(rank_), std::to_string(seq));
      store_->add(kGaveUpCountKey, 1);
    }
    const absl::Time deadline = absl::Now() + wait;
    while (true) {
      bool waiting = false;  // for a peer that may still report
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        peers[r].launched = read_int(ProgressKey(r));
        peers[r].failed = read_int(FailedKey(r));
        waiting |= peers[r].failed == 0;
      }
      if (!waiting || absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
  } catch (const std::exception& e) {
    return absl::StrCat("; the store is unreachable, so the missing rank is unknown (", WhatOf(e),
                        ")");
  }
  // silent: no failure reported, at or behind #seq (the likely lost ones);
  // ahead: no failure reported but a later collective launched, so alive at
  // that point (Gloo launches are asynchronous: a rank may launch #seq+1 and
  // then hang before sending #seq's data).
  std::vector<std::string> missing, reported, silent, ahead;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Peer& p = peers[r];
    const int64_t launched = launched_at_failure[r];
    if (launched < seq) {
      missing.push_back(launched == 0
                            ? NameRank(naming_, r, "no collective launched")
                            : NameRank(naming_, r, absl::StrCat("last launched #", launched)));
    }
    if (p.failed != 0) {
      reported.push_back(absl::StrCat(NameRank(naming_, r), " in #", p.failed));
    } else if (p.launched <= seq) {
      silent.push_back(NameRank(naming_, r));
    } else {
      ahead.push_back(NameRank(naming_, r, absl::StrCat("launched #", p.launched)));
    }
  }
  std::string out = missing.empty()
                        ? "; every rank launched it"
                        : absl::StrCat("; not launched by ", absl::StrJoin(missing, ", "));
  if (!reported.empty()) {
    absl::StrAppend(&out, "; failures reported by ", absl::StrJoin(reported, ", "));
  }
  const std::string within = absl::StrCat(" within ", absl::FormatDuration(wait));
  if (!silent.empty()) {
    absl::StrAppend(&out, "; ", absl::StrJoin(silent, ", "), " reported no failure", within,
                    " (lost?)");
    if (!ahead.empty()) absl::StrAppend(&out, "; nor did ", absl::StrJoin(ahead, ", "));
  } else if (!ahead.empty()) {
    absl::StrAppend(&out, "; ", absl::StrJoin(ahead, ", "), " reported no failure", within,
                    " (lost?)");
  }
  return out;
}

std::string GroupState::PeerGaveUp(int64_t seq) {
  if (store_silent_) return "";
  try {
    // A store whose host hangs (rank 0 hosting it under SIGSTOP) must not hold
    // the caller's Wait.
    c10d::StoreTimeoutGuard guard(*store_, std::chrono::seconds(1));
    if (store_->add(kGaveUpCountKey, 0) == 0) return "";
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const int64_t on = ReadInt(*store_, GaveUpKey(r));
      if (on > 0 && on <= seq) return NameRank(naming_, r, absl::StrCat("gave up on #", on));
    }
  } catch (const std::exception&) {
    store_silent_ = true;
  }
  return "";
}

void GroupState::RecordFailure(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!failed_) {
    first_failure_ = absl::Status(status.code(), absl::StripPrefix(status.message(), Prefix()));
  }
  failed_ = true;
}

absl::Status GroupState::FirstFailure() const {
  absl::MutexLock lock(&mu_);
  return first_failure_;
}

}  // namespace orthoshard::collectives::internal_collectives
