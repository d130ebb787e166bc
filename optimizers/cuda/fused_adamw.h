// Fused AdamW update on CUDA: one pass over fp32 main params, moments and gradients, optionally writing
// the updated value into a bf16 model-param copy. Same math and op order per element as
// torch.optim.AdamW(foreach=False) (see optimizers/adamw.h), with the gradient multiplied by
// `grad_scale` first (clipping / loss-scale un-scaling folded in).
//
// Built by nvcc only under --config=cuda (the declarations are always visible; calling the launcher
// in a build without ORTHOSHARD_CUDA is a link error by design). Pointers are device pointers; the
// kernel runs on `stream` and returns without synchronising.
#ifndef ORTHOSHARD_OPTIMIZERS_CUDA_FUSED_ADAMW_H_
#define ORTHOSHARD_OPTIMIZERS_CUDA_FUSED_ADAMW_H_

#include <cstdint>

namespace orthoshard::optimizers::cuda {

struct FusedAdamWArgs {
  float* param = nullptr;             // [n] fp32 main params, updated in place
  float* exp_avg = nullptr;           // [n] first moment
  float* exp_avg_sq = nullptr;        // [n] second moment
  const float* grad_f32 = nullptr;    // [n] gradient in fp32, or
  const uint16_t* grad_bf16 = nullptr;  // [n] gradient in bf16 (exactly one of the two is set)
  uint16_t* model_param_bf16 = nullptr;  // [n] optional bf16 copy of the updated param
  int64_t n = 0;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  float grad_scale = 1.0f;
  int64_t step = 1;  // the step count after this update (1 on the first step)
};

// Launches the update. Returns the cudaError_t of the launch as an int (0 = success).
int LaunchFusedAdamW(const FusedAdamWArgs& args, void* stream);

}  // namespace orthoshard::optimizers::cuda

#endif  // ORTHOSHARD_OPTIMIZERS_CUDA_FUSED_ADAMW_H_
