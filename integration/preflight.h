// Checks a run against the machine before any rank starts, so that a run which cannot work exits 2
// with one message instead of aborting out of memory, spawning threads it cannot use, or failing
// late on rank 0. Plain values, no LibTorch: the machine is described by MachineResources, which
// ProbeMachine() reads from this process's CPU affinity, /proc/meminfo and the cgroup limits.
#ifndef ORTHOSHARD_INTEGRATION_PREFLIGHT_H_
#define ORTHOSHARD_INTEGRATION_PREFLIGHT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "integration/config/trainer_config.h"

namespace orthoshard::integration {

struct MachineResources {
  int cores = 1;                // CPUs this process may run on
  int64_t available_bytes = 0;  // memory a new process can use; 0 = unknown (not checked)
};

// This machine: sched_getaffinity's CPU count; the smaller of /proc/meminfo's MemAvailable and
// the cgroup's remaining limit (v2 memory.max - memory.current, or v1 limit_in_bytes -
// usage_in_bytes) where there is one.
MachineResources ProbeMachine();

// The memory a run certainly needs on each rank, in bytes: the model's fp32 params and grads and
// its optimizer state (AdamW 8 bytes per param, Muon 4 per hidden-matrix element), as the --dist
// mode keeps them (replicated: all of it; layerwise and distopt: whole params and grads, 1/dp of
// the state; fsdp: 1/dp of all three; with --tp each rank 1/tp of the params), the logits of one
// micro-batch with their log-softmax (2 x micro-batch x seq_len x vocab x 4), a lower bound on
// the activations a micro-batch keeps for backward (per token and block the norms' inputs and
// outputs, the fused QKV and fc1 outputs and SwiGLU's output; with --recompute=full each block's
// input and one block's worth; preflight.cc's ActivationBytes), the eval batches' token ids
// (eval_batches x micro-batch x seq_len x 16), and the tokens a rank holds in its own memory
// (data::DatasetSpecResidentBytes: the synthetic corpus; files are mapped). The vocabulary is the
// run's (ResolveModel). A lower bound: the rest of the activations, LibTorch itself and allocator
// slack come on top. Precondition: ValidateTrainerConfig(config, world_size).
int64_t MinBytesPerRank(const TrainerConfig& config, int world_size);

// `local_ranks` ranks of a `world_size` job on `machine`. Errors: kInvalidArgument when
// num_threads exceeds the cores ("--num_threads 100000 exceeds the 2 cores this process may use");
// kFailedPrecondition when local_ranks x MinBytesPerRank exceeds the available memory, naming the
// two largest terms and the flags that set them. Precondition: ValidateTrainerConfig(config, world_size).
absl::Status CheckMachine(const TrainerConfig& config, int local_ranks, int world_size,
                          const MachineResources& machine);

// The model as the run resolves it (ResolveModel: a prepared dataset brings its tokenizer's
// vocabulary) splits over --tp (model::ValidateTensorParallel), checked before any rank starts.
// OK at tp 1, and when the data cannot be described (the run reports that itself). Errors:
// kInvalidArgument "--tp 2 for model 'tiny' with the vocabulary of --data=prepared:D: tensor
// parallelism: tp 2 does not divide vocab_size 50257 (...); give a --vocab_size tp divides".
absl::Status CheckResolvedModel(const TrainerConfig& config);

// config.log_dir can take TensorBoard's files (and config.profile_dir the profile traces, when
// profiling): each exists as a directory this process can write, or can be created (its nearest
// existing ancestor is a writable directory). OK when empty. Errors: kFailedPrecondition naming
// the flag and the path.
absl::Status CheckLogDir(const TrainerConfig& config);

}  // namespace orthoshard::integration

#endif  // ORTHOSHARD_INTEGRATION_PREFLIGHT_H_
