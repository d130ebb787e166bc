// SwiGLU's first half over a fused gate/up weight, as one autograd function (swiglu.cc says why).
#ifndef ORTHOSHARD_MODEL_SWIGLU_H_
#define ORTHOSHARD_MODEL_SWIGLU_H_

#include <ATen/core/Tensor.h>

namespace orthoshard::model {

// SiLU(m Wg^T) * (m Wu^T) for fc1 = [Wg; Wu] ([2F, C], gate rows then up rows) and m [..., C]:
// [..., F], differentiable in m and fc1. m may have 0 rows.
at::Tensor SwiGluIn(const at::Tensor& m, const at::Tensor& fc1);

}  // namespace orthoshard::model

#endif  // ORTHOSHARD_MODEL_SWIGLU_H_
