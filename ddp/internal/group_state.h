// The per-group and per-communicator state of DistributedDataParallel, shared by its two source
// files (distributed_data_parallel.cc: construction, grad sync, kFull param sync;
// distributed_data_parallel_sharded.cc: kSharded gathers and releases). Not an API.
#ifndef ORTHOSHARD_DDP_INTERNAL_GROUP_STATE_H_
#define ORTHOSHARD_DDP_INTERNAL_GROUP_STATE_H_

#include <memory>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "ddp/distributed_data_parallel.h"

namespace orthoshard::ddp {

// State of one bucket group of one buffer.
struct DistributedDataParallel::Group {
  int buffer = 0;
  int group = 0;
  int sequence = 0;         // index into sequences_
  int position = 0;         // index into Sequence::order (backprop order)
  int expected = 0;         // params in the group
  int ready = 0;            // params whose gradient is ready in the last micro-batch
  int min_param_index = 0;  // forward index of the group's earliest param
  // In-flight reduce-scatter, or (kFull) all-gather.
  std::unique_ptr<collectives::Work> work;
  // kSharded: the gathered params' state, the all-gather in flight, the last forward layer that
  // reads the group (MakeLayerHooks), gradients accumulated in the current backward.
  enum class Params { kReleased, kInFlight, kGathered };
  Params params = Params::kReleased;
  std::unique_ptr<collectives::Work> gather_work;
  int last_reader = -1;
  int accumulated = 0;
};

// The groups of every buffer on one communicator, in launch order.
struct DistributedDataParallel::Sequence {
  collectives::Communicator* comm = nullptr;
  std::vector<std::pair<int, int>> order;  // (buffer, group), backprop order
  int next_grad_launch = 0;                // first position whose reduce-scatter is not launched
  int next_gather_launch =
      0;                     // first FORWARD position (order reversed) whose gather is not launched
  int next_gather_wait = 0;  // first forward position not waited on
};

}  // namespace orthoshard::ddp

#endif  // ORTHOSHARD_DDP_INTERNAL_GROUP_STATE_H_
