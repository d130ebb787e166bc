#include "collectives/internal/gloo_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace orthoshard::collectives::internal_collectives {

absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateGlooBackend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& hostname, int threads) {
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
    options->threads = threads;
    c10::intrusive_ptr<c10d::Backend> backend =
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
    return backend;
  } catch (const std::exception& e) {
    const c10::Error* error = dynamic_cast<const c10::Error*>(&e);
    const std::string what = error != nullptr ? error->what_without_backtrace() : e.what();
    const std::string message =
        absl::StrCat("gloo rendezvous of rank ", rank, " of ", size, " failed: ", what);
    if (absl::StrContains(what, "imeout") || absl::StrContains(what, "imed out")) {
      return absl::DeadlineExceededError(message);
    }
    return absl::UnavailableError(message);
  }
}

}  // namespace orthoshard::collectives::internal_collectives
