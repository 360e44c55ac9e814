// A resnet18 checkpoint's tensors, read as Python would (torch.save's format, app/checkpoint.h),
// for tests that compare two runs exactly: the model state by name, then the momentum buffers by
// position. The rest of a checkpoint (clocks, the report's timers) may differ between runs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "models/resnet.h"
#include "models/torch_format.h"
#include "models/torch_unpickler.h"
#include "models/torch_values.h"
#include "models/weights.h"

namespace aiacc::test {

inline std::vector<std::pair<std::string, at::Tensor>> checkpointTensors(const std::string& path, int64_t classes) {
  models::ResNetOptions o;
  o.arch = "resnet18";
  o.num_classes = classes;
  models::ResNet m(o);
  const c10::impl::GenericDict root = models::readTorchSave(path).value.toGenericDict();
  const c10::impl::GenericDict state = root.at("model").toGenericDict();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : models::stateDictOf(*m)) out.emplace_back(name, state.at(name).toTensor());
  const auto groups = root.at("optimizer").toGenericDict().at("groups").toList();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto buffers = groups.get(g).toGenericDict().at("momentum_buffers").toList();
    for (size_t j = 0; j < buffers.size(); ++j) {
      if (buffers.get(j).isTensor()) out.emplace_back(strCat("momentum/", g, "/", j), buffers.get(j).toTensor());
    }
  }
  return out;
}

inline void expectSameTensors(const std::string& a, const std::string& b, int64_t classes) {
  const auto ta = checkpointTensors(a, classes), tb = checkpointTensors(b, classes);
  ASSERT_EQ(ta.size(), tb.size());
  ASSERT_GT(ta.size(), 100u) << "parameters, buffers and momentum";
  for (size_t i = 0; i < ta.size(); ++i) {
    ASSERT_EQ(ta[i].first, tb[i].first);
    EXPECT_TRUE(ta[i].second.equal(tb[i].second)) << ta[i].first << " differs";
  }
}

// The largest absolute difference over every tensor of two checkpoints (0: the same bits, NaN
// aside), as a double.
inline double largestDifference(const std::string& a, const std::string& b, int64_t classes) {
  const auto ta = checkpointTensors(a, classes), tb = checkpointTensors(b, classes);
  double d = 0;
  for (size_t i = 0; i < std::min(ta.size(), tb.size()); ++i) {
    const at::Tensor x = ta[i].second.to(at::kDouble), y = tb[i].second.to(at::kDouble);
    if (x.numel() > 0) d = std::max(d, (x - y).abs().max().item<double>());
  }
  return d;
}

}  // namespace aiacc::test
