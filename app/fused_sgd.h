// FusedSgd: torch::optim::SGD whose step() makes one pass over each CPU fp32 parameter.
//
// LibTorch's SGD runs five tensor operations per parameter (weight decay, the momentum buffer's
// scale and add, Nesterov's look-ahead, the update) with two temporaries: about 14 reads and
// writes of every element. FusedSgd reads the weight, gradient and momentum buffer once and
// writes the weight and buffer once, with the same operations in the same order (each a fused
// multiply-add where ATen's vectorized kernels use one), so results agree with SGD to the last
// bit or two. Same options, same per-parameter state (momentum_buffer under SGD's keys): LR
// changes through param_groups, checkpoints and resume are unchanged. Parameters that are not
// dense contiguous fp32 on the CPU (CUDA, channels-last, other dtypes), or a CPU without
// AVX2/FMA, go through SGD::step unchanged.
#pragma once

#include <torch/optim/sgd.h>

namespace aiacc::app {

class FusedSgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Steps taken by the fused path (the rest went to SGD::step): for tests and the log.
  int64_t fusedSteps() const { return fused_steps_; }

 private:
  int64_t fused_steps_ = 0;
};

}  // namespace aiacc::app
