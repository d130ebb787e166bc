// Tensor parallelism of the GPT (Megatron-LM's layout): which tp group a model is split over.
// How each param is split is its ModelParam::tp (common/tp_split.h).
#ifndef ORTHOSHARD_MODEL_TENSOR_PARALLEL_H_
#define ORTHOSHARD_MODEL_TENSOR_PARALLEL_H_

#include "collectives/communicator.h"

namespace orthoshard::model {

struct TensorParallel {
  collectives::Communicator* comm = nullptr;  // the tp group; null: the whole model on this rank

  int rank() const { return comm != nullptr ? comm->rank() : 0; }
  int size() const { return comm != nullptr ? comm->size() : 1; }
};

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_TENSOR_PARALLEL_H_
