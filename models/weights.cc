#include "models/weights.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include "aiacc/common/error.h"

namespace aiacc::models {
namespace {
constexpr char kMagic[8] = {'A', 'I', 'A', 'C', 'C', 'W', '0', '1'};

template <typename T>
void put(std::ofstream& f, T v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T get(std::ifstream& f, const std::string& path) {
  T v;
  if (!f.read(reinterpret_cast<char*>(&v), sizeof(T))) {
    AIACC_THROW(IoError, "weights file '", path, "' is truncated");
  }
  return v;
}
}  // namespace

NamedTensors readNamedTensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) AIACC_THROW(IoError, "cannot open weights file '", path, "'");
  f.seekg(0, std::ios::end);
  const uint64_t file_bytes = static_cast<uint64_t>(std::max<std::streamoff>(0, f.tellg()));
  f.seekg(0);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) {
    AIACC_THROW(IoError, "'", path, "' is not an aiacc weights file (bad magic)");
  }
  const auto count = get<uint64_t>(f, path);
  AIACC_CHECK_INPUT(count < 100000, "weights file '", path, "' claims ", count, " tensors");
  NamedTensors out;
  for (uint64_t i = 0; i < count; ++i) {
    const auto len = get<uint32_t>(f, path);
    AIACC_CHECK_INPUT(len < 4096, "weights file '", path, "' is corrupt (name length)");
    std::string name(len, '\0');
    if (!f.read(name.data(), len)) AIACC_THROW(IoError, "weights file '", path, "' is truncated");
    const auto dtype = get<uint32_t>(f, path);
    const auto ndim = get<uint32_t>(f, path);
    AIACC_CHECK_INPUT(dtype <= 1 && ndim <= 8, "weights file '", path, "' is corrupt at '", name, "'");
    std::vector<int64_t> dims(ndim);
    // The tensor's bytes, checked against what the file holds before anything is allocated.
    uint64_t need = dtype == 0 ? 4 : 8;
    for (auto& d : dims) {
      d = get<int64_t>(f, path);
      AIACC_CHECK_INPUT(d >= 0 && !__builtin_mul_overflow(need, static_cast<uint64_t>(d), &need) && need <= file_bytes,
                        "weights file '", path, "' is corrupt at '", name, "' (a shape larger than the file)");
    }
    at::Tensor t = at::empty(dims, dtype == 0 ? at::kFloat : at::kLong);
    const auto bytes = static_cast<std::streamsize>(t.nbytes());
    if (!f.read(static_cast<char*>(t.data_ptr()), bytes)) {
      AIACC_THROW(IoError, "weights file '", path, "' is truncated at '", name, "'");
    }
    out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

void writeNamedTensors(const std::string& path, const NamedTensors& tensors) {
  std::ofstream f(path, std::ios::binary);
  if (!f) AIACC_THROW(IoError, "cannot create '", path, "'");
  f.write(kMagic, 8);
  put<uint64_t>(f, tensors.size());
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().cpu().contiguous();
    AIACC_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kLong, "unsupported dtype for '", name, "'");
    put<uint32_t>(f, static_cast<uint32_t>(name.size()));
    f.write(name.data(), static_cast<std::streamsize>(name.size()));
    put<uint32_t>(f, t.scalar_type() == at::kFloat ? 0u : 1u);
    put<uint32_t>(f, static_cast<uint32_t>(t.dim()));
    for (int64_t d : t.sizes()) put<int64_t>(f, d);
    f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  }
  if (!f.flush()) AIACC_THROW(IoError, "cannot write '", path, "' (disk full?)");
}

NamedTensors stateOf(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& p : module.named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

void loadStateInto(torch::nn::Module& module, const NamedTensors& tensors) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  at::NoGradGuard no_grad;
  size_t used = 0;
  for (auto& [name, dst] : stateOf(module)) {
    auto it = by_name.find(name);
    AIACC_CHECK_INPUT(it != by_name.end(), "weights lack '", name, "'");
    AIACC_CHECK_INPUT(it->second.sizes() == dst.sizes(), "shape of '", name, "' is ", it->second.sizes(),
                      " in the file but ", dst.sizes(), " in the model");
    dst.copy_(it->second);
    ++used;
  }
  if (used != by_name.size()) {
    std::map<std::string, bool> known;
    for (auto& [name, t] : stateOf(module)) known[name] = true;
    for (auto& [name, t] : by_name) {
      AIACC_CHECK_INPUT(known.count(name), "weights hold '", name, "', which the model lacks");
    }
  }
}

int64_t loadPretrainedInto(torch::nn::Module& module, const NamedTensors& tensors, const std::string& classifier) {
  const std::string weight = classifier + ".weight", bias = classifier + ".bias";
  const NamedTensors own = stateOf(module);
  auto find = [](const NamedTensors& ts, const std::string& name) -> const at::Tensor* {
    for (const auto& [n, t] : ts) {
      if (n == name) return &t;
    }
    return nullptr;
  };
  const at::Tensor *fw = find(tensors, weight), *fb = find(tensors, bias);
  const at::Tensor *mw = find(own, weight), *mb = find(own, bias);
  const bool other_classes = fw && fb && mw && mb && fw->dim() == 2 && mw->dim() == 2 && fw->size(1) == mw->size(1) &&
                             fw->size(0) != mw->size(0) && fb->dim() == 1 && fb->size(0) == fw->size(0);
  if (!other_classes) {
    loadStateInto(module, tensors);
    return 0;
  }
  NamedTensors kept;
  for (const auto& [name, t] : tensors) {
    if (name == weight) {
      kept.emplace_back(name, *mw);
    } else if (name == bias) {
      kept.emplace_back(name, *mb);
    } else {
      kept.emplace_back(name, t);
    }
  }
  loadStateInto(module, kept);
  return fw->size(0);
}

}  // namespace aiacc::models
