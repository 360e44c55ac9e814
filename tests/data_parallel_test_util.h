// Shared by the DataParallel tests: a small conv net, its inputs and targets, and one backward
// of it on N rank-threads against the single-process backward on the concatenated batch.
#pragma once

#include <torch/optim/sgd.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "aiacc/comm/data_parallel.h"
#include "tests/comm_test_util.h"

namespace aiacc::comm::test {

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int hidden = 8) {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, hidden, 3).padding(1)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(hidden, 16, 3).stride(2)));
    fc = register_module("fc", torch::nn::Linear(16, 5));
    unused = register_module("unused", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra = false) {
    x = torch::relu(c2(torch::relu(c1(x))));
    x = fc(x.mean({2, 3}));
    if (use_extra) x = x * unused(torch::ones({1, 4})).sum();  // (a shift would have zero gradient)
    return x;
  }
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear fc{nullptr}, unused{nullptr};
};
TORCH_MODULE(Net);

// Copies parameter values (rank threads must not draw initial weights from the global generator:
// it is shared between threads, so concurrent construction interleaves its draws).
inline std::vector<at::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}
inline void restore(torch::nn::Module& m, const std::vector<at::Tensor>& values) {
  at::NoGradGuard no_grad;
  auto params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values[i]);
}

inline at::Tensor inputs(int n, uint64_t seed) {
  return at::randn({n, 3, 12, 12}, at::detail::createCPUGenerator(seed), at::kFloat);
}
inline at::Tensor targets(int n, uint64_t seed) {
  return at::randint(0, 5, {n}, at::detail::createCPUGenerator(seed), at::kLong);
}

// `steps` SGD steps (lr 0.05, momentum 0.9) of `ref` on one process, on W x b images a step
// (step s: inputs(W * b, 10 + s), targets(W * b, 50 + s)); the N-rank runs split each batch.
// Returns ref's initial parameters.
inline std::vector<at::Tensor> oneProcessSgd(Net& ref, int W, int b, int steps) {
  const auto init = snapshot(*ref);
  torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(ref->forward(inputs(W * b, 10 + s)), targets(W * b, 50 + s)).backward();
    opt.step();
  }
  return init;
}

// One backward of Net on W ranks with batch b each, through the sync make_sync builds, and
// the single-process backward on the concatenated batch into ref. Only rank 0 starts from ref's
// weights: DataParallel must broadcast them. Returns each rank's gradients (undefined where a
// parameter has none).
using MakeSync = std::function<std::unique_ptr<GradientSync>(std::shared_ptr<torch::nn::Module>,
                                                             std::shared_ptr<Transport>, const WorldInfo&)>;
inline std::vector<std::vector<at::Tensor>> rankGradients(Net& ref, int W, int b, const MakeSync& make_sync,
                                                          int ranks_per_node = 0, bool shm = false,
                                                          bool channels_last = false) {
  const at::Tensor x = inputs(W * b, 1), y = targets(W * b, 2);
  torch::manual_seed(7);
  ref = Net();
  const auto init = snapshot(*ref);
  torch::nn::functional::cross_entropy(ref->forward(x), y).backward();
  std::vector<std::vector<at::Tensor>> grads(W);
  expectNoErrors(runRanks(
      W,
      [&](int r, std::shared_ptr<Transport> t) {
    Net net;  // arbitrary init on ranks > 0
    if (r == 0) restore(*net, init);
    at::Tensor xr = x.narrow(0, r * b, b);
    if (channels_last) {  // conv weights and input channels-last: the weights' gradients come out so too
      at::NoGradGuard no_grad;
      for (auto* conv : {&net->c1, &net->c2}) {
        (*conv)->weight.set_data((*conv)->weight.data().contiguous(at::MemoryFormat::ChannelsLast));
      }
      xr = xr.contiguous(at::MemoryFormat::ChannelsLast);
    }
    const std::unique_ptr<GradientSync> sync = make_sync(net.ptr(), t, WorldInfo{r, W, r, W});
    torch::nn::functional::cross_entropy(net->forward(xr), y.narrow(0, r * b, b)).backward();
    ASSERT_TRUE(sync->finishBackward());
    for (auto& p : net->parameters()) grads[r].push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
      },
      1, std::chrono::seconds(30), ranks_per_node, shm));
  return grads;
}
// The same through DataParallel with options o.
inline std::vector<std::vector<at::Tensor>> rankGradients(Net& ref, int W, int b, const DataParallelOptions& o,
                                                          int ranks_per_node = 0, bool shm = false,
                                                          bool channels_last = false) {
  const MakeSync dp = [o](std::shared_ptr<torch::nn::Module> m, std::shared_ptr<Transport> t, const WorldInfo& w) {
    return std::make_unique<DataParallel>(std::move(m), std::move(t), w, o);
  };
  return rankGradients(ref, W, b, dp, ranks_per_node, shm, channels_last);
}

}  // namespace aiacc::comm::test
