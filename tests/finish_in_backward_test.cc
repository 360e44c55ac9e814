// DataParallelOptions::finish_in_backward (the default): `loss.backward(); opt.step();` is the
// whole step, as with PyTorch's DDP. Checked against a one-process run, a skipped fp16 step
// (every .grad undefined, so the optimizer leaves the parameters alone, and lastStepSkipped()
// says so), and a lost peer (backward() throws the CommError).
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <stdexcept>

#include "aiacc/comm/data_parallel.h"
#include "tests/comm_test_util.h"
#include "tests/data_parallel_test_util.h"

namespace aiacc::comm {
namespace {

using namespace test;  // runRanks, expectNoErrors, the test net and its data

// 10 steps of backward() and step() only, the model given as its holder: every rank ends with
// the parameters of one process on the whole batch (within fp32 rounding of the sums' order).
TEST(FinishInBackward, BackwardAndStepAloneEqualOneProcess) {
  const int W = 2, b = 3, steps = 10;
  torch::manual_seed(5);
  Net ref;
  const auto init = oneProcessSgd(ref, W, b, steps);
  std::vector<std::vector<at::Tensor>> finals(W);
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    restore(*net, init);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    DataParallel dp(net, t, WorldInfo{r, W, r, W});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::nn::functional::cross_entropy(net->forward(inputs(W * b, 10 + s).narrow(0, r * b, b)),
                                           targets(W * b, 50 + s).narrow(0, r * b, b))
          .backward();
      opt.step();
    }
    EXPECT_FALSE(dp.lastStepSkipped());
    EXPECT_TRUE(dp.finishBackward()) << "after a finished backward: its result, nothing more";
    for (auto& p : net->parameters()) finals[r].push_back(p.detach().clone());
  }));
  auto rp = ref->parameters();
  for (size_t i = 0; i < rp.size(); ++i) {
    EXPECT_TRUE(finals[0][i].equal(finals[1][i])) << "ranks diverged at parameter " << i;
    EXPECT_TRUE(at::allclose(finals[0][i], rp[i], 1e-4, 1e-6)) << "parameter " << i;
  }
}

// fp16 transfer: a gradient past fp16's range is skipped by every rank. The step leaves every
// .grad undefined, so SGD (momentum, weight decay) changes nothing; the next step trains.
TEST(FinishInBackward, ASkippedStepLeavesTheParametersAlone) {
  const int W = 2;
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    auto net = std::make_shared<torch::nn::Module>();
    at::Tensor w = net->register_parameter("w", at::ones({4}));
    DataParallelOptions o;
    o.codec.dtype = TransferDtype::kFloat16;
    DataParallel dp(net, t, WorldInfo{r, W, r, W}, o);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
    const at::Tensor before = w.detach().clone();
    opt.zero_grad();
    (w * 1e6 * (r + 1)).sum().backward();  // x the transfer's scale: past 65504 in fp16
    opt.step();
    EXPECT_TRUE(dp.lastStepSkipped());
    EXPECT_EQ(dp.skippedSteps(), 1);
    EXPECT_FALSE(w.grad().defined());
    EXPECT_TRUE(w.detach().equal(before)) << "a skipped step moved the parameters";
    opt.zero_grad();
    (w * std::ldexp(1.0, -10) * (r + 1)).sum().backward();  // 2^-10 and 2^-9: exact in fp16, at any scale 2^k
    opt.step();
    EXPECT_FALSE(dp.lastStepSkipped());
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad()[0].item<double>(), 1.5 * std::ldexp(1.0, -10)) << "their average, exactly";
    EXPECT_FALSE(w.detach().equal(before));
  }));
}

// A peer lost before its step: the survivor's backward() throws the CommError naming it.
TEST(FinishInBackward, ALostPeerFailsBackward) {
  std::vector<char> threw(2, 0);
  const auto errors = runRanks(
      2,
      [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    DataParallel dp(net, t, WorldInfo{r, 2, r, 2});
    if (r == 1) throw std::runtime_error("rank 1 dies before its first step");
    try {
      torch::nn::functional::cross_entropy(net->forward(inputs(2, 0)), targets(2, 0)).backward();
    } catch (const CommError&) {
      threw[r] = 1;
      throw;
    }
      },
      1, std::chrono::seconds(3));
  EXPECT_TRUE(threw[0]) << "backward() did not throw a CommError: " << errors[0];
  EXPECT_FALSE(errors[0].empty());
}

}  // namespace
}  // namespace aiacc::comm
