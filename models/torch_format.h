// Model state in the formats PyTorch users have: the zip archive `torch.save(state_dict)` writes
// and `torch.load(FILE, weights_only=True)` reads, beside aiacc's own named-tensor file
// (models/weights.h). Which format a file is in is decided by its first bytes, never its name.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

#include "models/weights.h"

namespace torch::nn {
class Module;
}

namespace aiacc::models {

// The module's parameters and buffers by torchvision name, in torchvision's order (each module's
// own parameters, then its own buffers, modules in registration order), detached, on the CPU and
// contiguous: what torchvision's `model.state_dict()` holds, key for key.
NamedTensors stateDictOf(const torch::nn::Module& module);

// `value` in torch.save's zip format, in memory: LibTorch's pickler (protocol 2) without
// TorchScript's type tags, so torch.load(weights_only=True) reads it when every value is one
// models/torch_values.h describes. Tensors are written as they are (give them on the CPU,
// detached, contiguous).
std::string encodeTorchSave(const c10::IValue& value);

// Writes `tensors` as a plain dict {name: tensor} in torch.save's zip format (pickle protocol 2,
// no TorchScript type tags), so that `torch.load(path, weights_only=True)` returns a dict under
// torch 1.13 and 2.x and torchvision's `load_state_dict(sd, strict=True)` accepts it. Tensors are
// written from the CPU, without requires_grad. Written atomically; IoError when it cannot be.
void writeTorchStateDict(const std::string& path, const NamedTensors& tensors);

// Reads a torch.save zip archive holding a dict of tensors (models/torch_unpickler.h): what
// writeTorchStateDict writes, Python's `torch.save(model.state_dict(), X)` (an OrderedDict) or a
// plain dict, also one holding it under "state_dict" or "model" (a training checkpoint), with DDP's
// "module." prefix stripped when every name has it. Floating-point tensors come back as float32.
// Anything else (a TorchScript archive, a value that is not a tensor) is an InputError naming the
// Python command that re-saves the file as a plain dict; IoError when it cannot be read.
NamedTensors readTorchStateDict(const std::string& path);

// --init-weights: aiacc's named-tensor file ("AIACCW01") or a torch.save zip archive, told apart
// by their first bytes; the legacy (pre-1.6, non-zip) torch.save format and anything else is an
// InputError saying how to convert it.
NamedTensors readWeightsFile(const std::string& path);

// --save-weights: a name ending in .pt or .pth gets torch.save's format, any other aiacc's
// named-tensor file; written atomically (a crash leaves the previous file or none).
void writeWeightsFile(const std::string& path, const torch::nn::Module& module);

// --convert-weights IN --save-weights OUT: the tensors of IN (whatever readWeightsFile reads)
// written to OUT as writeWeightsFile would name its format, in IN's order; returns their count.
// aiacc's named-tensor format holds float32 and int64 tensors only (InputError otherwise).
size_t convertWeightsFile(const std::string& in, const std::string& out);

}  // namespace aiacc::models
