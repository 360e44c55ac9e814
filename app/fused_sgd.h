// FusedSgd: torch::optim::SGD whose step() makes one pass over each CPU fp32 parameter.
//
// LibTorch's SGD runs five tensor operations per parameter (weight decay, the momentum buffer's
// scale and add, Nesterov's look-ahead, the update) with two temporaries: about 14 reads and
// writes of every element. FusedSgd reads the weight, gradient and momentum buffer once and
// writes the weight and buffer once, with the same operations in the same order (each a fused
// multiply-add where ATen's vectorized kernels use one), so results agree with SGD to the last
// bit or two. Same options, same per-parameter state (momentum_buffer under SGD's keys): LR
// changes through param_groups, checkpoints and resume are unchanged.
//
// On a GPU the same five operations run over all of a group's parameters at once, through ATen's
// multi-tensor (_foreach_) kernels: a handful of launches per group instead of five per
// parameter (ResNet-50 has 161 parameters: about 800 launches of tiny kernels, which leave the
// GPU waiting on the host for several milliseconds a step). This is what PyTorch's Python SGD does
// by default on CUDA (foreach=True).
//
// Which path a step takes: every parameter with a gradient a dense contiguous fp32 CPU tensor on
// a CPU with AVX2/FMA: the fused loop; every one on the same CUDA device with one dtype: the
// multi-tensor one; anything else (channels-last CPU weights, mixed devices): SGD::step unchanged.
#pragma once

#include <torch/optim/sgd.h>

namespace aiacc::app {

class FusedSgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Steps taken by the fused CPU path and by the multi-tensor path (the rest went to
  // SGD::step): for tests and the log.
  int64_t fusedSteps() const { return fused_steps_; }
  int64_t multiTensorSteps() const { return multi_tensor_steps_; }

 private:
  int64_t fused_steps_ = 0;
  int64_t multi_tensor_steps_ = 0;
};

// One step of `opt` (SGD's arithmetic, SGD's state) with the _foreach_ operations, one group at
// a time, whatever the parameters' device: FusedSgd's GPU path, callable on the CPU by tests
// (there ATen's _foreach_ operations run the same per-tensor kernels as SGD::step, so the
// result is SGD's to the bit).
void multiTensorSgdStep(torch::optim::SGD& opt);

}  // namespace aiacc::app
