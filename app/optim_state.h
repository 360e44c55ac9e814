// SGD's state in a checkpoint, in a layout that every LibTorch version reads the same way.
//
// torch::optim's own serializer names each parameter's state by its TensorImpl address, printed
// differently by each version ("0x7f3a..." by 1.13, decimal digits by 2.x, which parses them back
// with std::stoull: a 1.13 key becomes 0 for every parameter). aiacc writes the state by position
// instead: group g, parameter j, as the optimizer lists them (the model's parameter order, fixed
// by its architecture).
//
// May call: LibTorch (optim). Throws IoError (corrupt or mismatched state).
#pragma once

#include <torch/optim/sgd.h>

namespace aiacc::app {

// The state as one plain value for torch.save's format (checkpoint format 5;
// models/torch_values.h): {"groups": [{"lr", "momentum", "dampening", "weight_decay" (0-dim
// float64 tensors), "nesterov" (bool), "momentum_buffers" (per parameter, in order: a tensor, or
// None before its first step with momentum)}]}.
c10::IValue sgdStateValue(const torch::optim::SGD& sgd);
// Each parameter's momentum buffer, group by group in the optimizer's order (undefined where a
// parameter has none yet).
std::vector<at::Tensor> momentumBuffers(const torch::optim::SGD& sgd);
// Restores options and momentum buffers; the group count and sizes must match the optimizer's.
void restoreSgdState(torch::optim::SGD& sgd, const c10::IValue& value);

}  // namespace aiacc::app
