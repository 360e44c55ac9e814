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
//
// Bounds, for files made to hurt (torch.save files are a known attack vector): each is an
// InputError of one line, raised before the memory or time it guards is spent.
//   - Nesting: containers (lists, dicts, tuples) nest at most kMaxPickleDepth deep, checked as
//     each value is made, so neither this reader's recursion nor a value's destruction can run
//     out of stack.
//   - Sharing: a value the pickle refers to twice (DUP, the memo) is shared, never copied. A list
//     or dict is frozen once it is an item of another value (nothing is added to it afterwards,
//     which no pickler does), so no value contains itself. A value's size with every shared part
//     counted each time it appears (what a walk over the result visits) is at most the pickle's
//     bytes + kPickleNodeSlack, so 40 nested (x, x) pairs in 322 bytes are refused, not 2^40.
//   - Dict keys are strings, numbers or tensors (what LibTorch can hash). A global's module and
//     name are printable and at most 256 bytes each (every value that refers to one copies it);
//     at most 16 unread types are named in opaque_types.
//   - Tensors: models/torch_storage.h's viewRefusal. A view's extent is computed in
//     overflow-checked arithmetic and must lie inside its storage; views whose elements overlap
//     or interleave (an expanded tensor saved as a view: re-save it with .contiguous()) are
//     refused, so a tensor is never larger than the storage bytes the file holds.
//   - Archives (readTorchSave): checkZipClaims bounds every entry's uncompressed size by the
//     archive's own size before LibTorch's zip reader allocates it, and a storage's size is
//     checked against its record's bytes before it is allocated.
// A hostile pickle of N bytes thus costs time and memory linear in N plus its storages' bytes;
// a hostile archive of N bytes, memory at most a few times N.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace aiacc::models {

// Containers inside containers, at most: torch.save's state dicts nest about 5 deep (an
// optimizer's state: dict, dict, dict, tensor); Python's own pickle stops near 1000.
inline constexpr int kMaxPickleDepth = 100;
// What a value may hold beyond one item per byte of its pickle, shared parts counted each time.
inline constexpr uint64_t kPickleNodeSlack = uint64_t{1} << 20;

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

// InputError naming `name` unless every entry of the zip archive `bytes` claims at most the
// archive's own size uncompressed, with a central directory that is whole (zip64 included):
// what LibTorch's zip reader allocates per entry is what the entry claims.
void checkZipClaims(const std::string& bytes, const std::string& name);

// Whether `bytes` are a zip archive holding TorchScript's constants.pkl (torch.jit.save, or
// LibTorch's torch::serialize::OutputArchive) rather than a torch.save pickle.
bool isTorchScriptArchive(const std::string& bytes);

}  // namespace aiacc::models
