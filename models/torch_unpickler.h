// Reading what torch.save wrote, without Python and without LibTorch's TorchScript unpickler
// (which reads no collections.OrderedDict, pytorch/pytorch#100741, and so no
// `torch.save(model.state_dict())`).
//
// A restricted pickle machine, in the spirit of torch.load(weights_only=True): it runs no code and
// knows a closed set of globals. Values come back as IValues: None, bool, int (up to 64 bits),
// float, str, tuple, list, dict (an OrderedDict is a dict; insertion order is kept) and tensors
// (torch._utils._rebuild_tensor_v2 / _rebuild_parameter / _rebuild_from_type_v2 over the archive's
// storages, on the CPU whatever the saved location; views of one storage share it). Any other
// object (argparse.Namespace, numpy arrays, bytes, torch.device, ...) is read as None and its type
// named in `opaque_types`, so a checkpoint that also holds such values still gives its tensors.
// State given to BUILD (an OrderedDict's _metadata, an object's __dict__) is dropped.
//
// Opcodes: those of protocols 2 to 5 that build the values above (no PERSID text form, no
// EXT codes, no out-of-band buffers); anything else is an InputError naming the opcode and its
// byte offset. Every read is bounds-checked and every tensor view checked against its storage.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <vector>

namespace aiacc::models {

// Loads a storage record: the archive's data/<key>, as a 1-D tensor of `numel` elements of
// `dtype`. Throws when the record is missing or too short.
using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

struct Unpickled {
  c10::IValue value;
  // Qualified names of the objects read as None ("argparse.Namespace"), each once, in order.
  std::vector<std::string> opaque_types;
};

// Runs the pickle in `bytes`. InputError (one line) on a malformed or unsupported pickle.
Unpickled unpickleTorch(const std::string& bytes, const StorageLoader& load_storage);

// Reads a torch.save zip archive (its data.pkl and data/<key> records; little-endian only).
// IoError when the file cannot be read; InputError when it is not a torch.save archive (a
// TorchScript archive, another zip) or its pickle is refused. Messages name `path`.
Unpickled readTorchSave(const std::string& path);

// The same for an archive in memory; `name` is what messages call it.
Unpickled readTorchSaveBytes(const std::string& bytes, const std::string& name);

// Whether `bytes` are a zip archive holding TorchScript's constants.pkl (torch.jit.save, or
// LibTorch's torch::serialize::OutputArchive) rather than a torch.save pickle.
bool isTorchScriptArchive(const std::string& bytes);

}  // namespace aiacc::models
