// Named-tensor files: a model's parameters and buffers by torchvision name, in a small binary
// format both C++ and Python (scripts/golden_resnet.py) read and write without LibTorch's
// pickler, so weights move between torchvision and aiacc in either direction.
//
// Format (little-endian): "AIACCW01", uint64 count, then per tensor: uint32 name length, name,
// uint32 dtype (0 = float32, 1 = int64), uint32 ndim, int64 dims[ndim], raw data.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace aiacc::models {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

NamedTensors readNamedTensors(const std::string& path);
void writeNamedTensors(const std::string& path, const NamedTensors& tensors);

// Copies tensors into module's parameters and buffers by name. Every name of the module must be
// present with the same shape; names the module lacks are an error too (nothing silently unused).
void loadStateInto(torch::nn::Module& module, const NamedTensors& tensors);

// --init-weights: loadStateInto, except that a classifier `<classifier>.weight` / `.bias` made for
// another number of classes (same input width) is left as the module initialised it. Returns the
// file's class count when that happened, 0 when every tensor was copied.
int64_t loadPretrainedInto(torch::nn::Module& module, const NamedTensors& tensors, const std::string& classifier);

// The module's parameters and buffers by name.
NamedTensors stateOf(const torch::nn::Module& module);

}  // namespace aiacc::models
