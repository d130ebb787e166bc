#include "integration/metrics/step_profiler.h"

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "torch/csrc/autograd/profiler_kineto.h"

namespace orthoshard::integration {
namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

}  // namespace

absl::StatusOr<std::unique_ptr<StepProfiler>> StepProfiler::Create(const std::string& dir,
                                                                   int64_t first, int64_t last,
                                                                   int rank, bool cuda) {
  if (first <= 0) return std::unique_ptr<StepProfiler>(new StepProfiler("", 0, 0, false));
  if (last < first) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile steps [", first, ", ", last, "]: the last step precedes the first"));
  }
  if (dir.empty()) {
    return absl::InvalidArgumentError("profiling needs a directory for the traces (--profile_dir)");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile_dir '", dir, "': cannot create: ", ec.message()));
  }
  return std::unique_ptr<StepProfiler>(new StepProfiler(
      absl::StrCat(dir, "/rank", rank, ".steps", first, "-", last, ".pt.trace.json"), first,
      last, cuda));
}

StepProfiler::StepProfiler(std::string path, int64_t first, int64_t last, bool cuda)
    : path_(std::move(path)), first_(first), last_(last), cuda_(cuda) {}

StepProfiler::~StepProfiler() {
  // A run that failed mid-profile: stop the profiler, drop the partial trace (the failure may have
  // left collectives in flight, see StopsAfter: this is best effort on a failing run).
  if (recording_) prof::disableProfiler();
}

void StepProfiler::BeforeStep(int64_t step) {
  if (first_ <= 0 || step != first_ || recording_) return;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (cuda_) activities.insert(impl::ActivityType::CUDA);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  recording_ = true;
}

absl::Status StepProfiler::AfterStep(int64_t step, bool final) {
  if (!StopsAfter(step, final)) return absl::OkStatus();
  recording_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  const std::string tmp = path_ + ".tmp";
  std::string error;
  try {
    result->save(tmp);  // throws c10::Error when the file cannot be written
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (error.empty() && std::rename(tmp.c_str(), path_.c_str()) != 0) error = "rename failed";
  if (!error.empty()) {
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("profile trace '", path_, "': cannot write it: ", error));
  }
  return absl::OkStatus();
}

}  // namespace orthoshard::integration
