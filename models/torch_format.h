// Model state in the formats PyTorch users have: the zip archive `torch.save(state_dict)` writes
// and `torch.load(FILE, weights_only=True)` reads, beside aiacc's own named-tensor file
// (models/weights.h). Which format a file is in is decided by its first bytes, never its name.
#pragma once

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

// Writes `tensors` as a plain dict {name: tensor} in torch.save's zip format (pickle protocol 2,
// no TorchScript type tags), so that `torch.load(path, weights_only=True)` returns a dict under
// torch 1.13 and 2.x and torchvision's `load_state_dict(sd, strict=True)` accepts it. Tensors are
// written from the CPU, without requires_grad. Writes `path` directly (callers wanting an atomic
// replace use writeFileAtomicByPath). Throws IoError when it cannot be written.
void writeTorchStateDict(const std::string& path, const NamedTensors& tensors);

// Reads a torch.save zip archive holding a plain dict of tensors, as writeTorchStateDict writes it
// or Python's `torch.save(dict(model.state_dict()), X)` (a dict of two or more entries holding one
// under "state_dict" or "model" too), with DDP's "module." prefix stripped when every name has it.
// Floating-point tensors come back as float32. LibTorch's unpickler reads no OrderedDict (what
// `model.state_dict()` is) and no one-entry dict (pickle's SETITEM): those, and anything else
// that is not a dict of tensors, are an InputError naming the Python command that re-saves the
// file; IoError when it cannot be read.
NamedTensors readTorchStateDict(const std::string& path);

// --init-weights: aiacc's named-tensor file ("AIACCW01") or a torch.save zip archive, told apart
// by their first bytes; the legacy (pre-1.6, non-zip) torch.save format and anything else is an
// InputError saying how to convert it.
NamedTensors readWeightsFile(const std::string& path);

// --save-weights: a name ending in .pt or .pth gets torch.save's format, any other aiacc's
// named-tensor file; written atomically (a crash leaves the previous file or none).
void writeWeightsFile(const std::string& path, const torch::nn::Module& module);

}  // namespace aiacc::models
