#include "models/torch_format.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <vector>

#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "models/torch_unpickler.h"

namespace aiacc::models {
namespace {

constexpr char kZipMagic[4] = {'P', 'K', '\x03', '\x04'};
constexpr char kAiaccMagic[8] = {'A', 'I', 'A', 'C', 'C', 'W', '0', '1'};
// The legacy torch.save format: pickle protocol 2, then LONG1 of torch's magic number.
constexpr unsigned char kLegacyMagic[14] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                            0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

std::string resaveHint(const std::string& path) {
  return strCat("re-save it as a plain dict of tensors: python3 -c \"import torch; sd = torch.load('", path,
                "', weights_only=True); sd = sd.get('state_dict', sd.get('model', sd)); "
                "torch.save({k.removeprefix('module.'): v for k, v in sd.items()}, 'OUT.pt')\"");
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The dict of tensors inside `value`: itself, or under "state_dict" / "model" (a training
// checkpoint's layout).
c10::impl::GenericDict tensorDict(const Unpickled& file, const std::string& path) {
  AIACC_CHECK_INPUT(file.value.isGenericDict(), "'", path, "' holds a ", file.value.tagKind(),
                    ", not a dict of tensors; ", resaveHint(path));
  c10::impl::GenericDict dict = file.value.toGenericDict();
  for (const char* key : {"state_dict", "model"}) {
    const auto it = dict.find(c10::IValue(std::string(key)));
    if (it != dict.end() && it->value().isGenericDict()) return it->value().toGenericDict();
  }
  return dict;
}

}  // namespace

NamedTensors stateDictOf(const torch::nn::Module& module) {
  NamedTensors out;
  auto add = [&](const std::string& prefix, const torch::nn::Module& m) {
    const std::string dot = prefix.empty() ? "" : prefix + ".";
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      out.emplace_back(dot + p.key(), p.value().detach().cpu().contiguous());
    }
    for (const auto& b : m.named_buffers(/*recurse=*/false)) {
      out.emplace_back(dot + b.key(), b.value().detach().cpu().contiguous());
    }
  };
  add("", module);
  for (const auto& child : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    add(child.key(), *child.value());
  }
  return out;
}

std::string encodeTorchSave(const c10::IValue& value) {
  std::vector<char> pickle;
  // tag_aggregates=false: no torch.jit._pickle.restore_type_tag around dicts and lists, which
  // torch.load(weights_only=True) refuses; tensors go to records data/0, data/1, ... as
  // torch.save writes them.
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.insert(pickle.end(), data, data + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string bytes;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return bytes;
}

void writeTorchStateDict(const std::string& path, const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) {
    AIACC_CHECK(!dict.contains(name), "two tensors named '", name, "'");
    dict.insert(name, t.detach().cpu().contiguous());
  }
  writeFileAtomic(path, encodeTorchSave(c10::IValue(dict)));
}

NamedTensors readTorchStateDict(const std::string& path) {
  const Unpickled file = readTorchSave(path);
  NamedTensors out;
  for (const auto& kv : tensorDict(file, path)) {
    AIACC_CHECK_INPUT(kv.key().isString(), "'", path, "' has a key that is not a string");
    const std::string name = kv.key().toStringRef();
    if (!kv.value().isTensor()) {
      std::string objects;
      for (const auto& type : file.opaque_types) objects += (objects.empty() ? "" : ", ") + type;
      AIACC_THROW(InputError, "'", path, "': '", name, "' is a ", kv.value().tagKind(), ", not a tensor",
                  objects.empty() ? "" : strCat(" (the file holds objects aiacc does not read: ", objects, ")"));
    }
    at::Tensor t = kv.value().toTensor();
    if (t.is_floating_point()) t = t.to(at::kFloat);
    out.emplace_back(name, t);
  }
  const bool ddp = !out.empty() && std::all_of(out.begin(), out.end(),
                                               [](const auto& kv) { return kv.first.rfind("module.", 0) == 0; });
  if (ddp) {
    for (auto& kv : out) kv.first.erase(0, std::strlen("module."));
  }
  return out;
}

NamedTensors readWeightsFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) AIACC_THROW(IoError, "cannot open weights file '", path, "'");
  char head[sizeof(kLegacyMagic)] = {};
  f.read(head, sizeof(head));
  const auto n = static_cast<size_t>(f.gcount());
  if (n >= sizeof(kAiaccMagic) && std::memcmp(head, kAiaccMagic, sizeof(kAiaccMagic)) == 0)
    return readNamedTensors(path);
  if (n >= sizeof(kZipMagic) && std::memcmp(head, kZipMagic, sizeof(kZipMagic)) == 0) return readTorchStateDict(path);
  if (n == sizeof(kLegacyMagic) && std::memcmp(head, kLegacyMagic, sizeof(kLegacyMagic)) == 0) {
    AIACC_THROW(InputError, "'", path, "' is in torch.save's legacy (pre-1.6, non-zip) format; ", resaveHint(path));
  }
  AIACC_THROW(InputError, "'", path,
              "' is neither a torch.save file (zip) nor an aiacc weights file (AIACCW01); --init-weights reads those");
}

void writeWeightsFile(const std::string& path, const torch::nn::Module& module) {
  if (endsWith(path, ".pt") || endsWith(path, ".pth")) return writeTorchStateDict(path, stateDictOf(module));
  writeFileAtomicByPath(path, [&](const std::string& tmp) { writeNamedTensors(tmp, stateOf(module)); });
}

size_t convertWeightsFile(const std::string& in, const std::string& out) {
  const NamedTensors tensors = readWeightsFile(in);
  if (endsWith(out, ".pt") || endsWith(out, ".pth")) {
    writeTorchStateDict(out, tensors);
  } else {
    for (const auto& [name, t] : tensors) {
      AIACC_CHECK_INPUT(t.scalar_type() == at::kFloat || t.scalar_type() == at::kLong, "'", name, "' in '", in, "' is ",
                        t.scalar_type(), ": aiacc's named-tensor format holds float32 and int64; write a .pt");
    }
    writeFileAtomicByPath(out, [&](const std::string& tmp) { writeNamedTensors(tmp, tensors); });
  }
  return tensors.size();
}

}  // namespace aiacc::models
