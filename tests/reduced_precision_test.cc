// comm/ DataParallel with fp16 and bf16 transfer: closeness to fp32, channels-last gradients,
// training to the same accuracy, and a non-finite gradient skipping the step on every rank.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <limits>
#include <string>
#include <vector>

#include "aiacc/comm/data_parallel.h"
#include "tests/comm_test_util.h"
#include "tests/data_parallel_test_util.h"

namespace aiacc::comm {
namespace {

using namespace test;  // runRanks, expectNoErrors, the test net and its data

struct Precision {
  TransferDtype dtype;
  double bound;  // relative to the largest gradient value of each parameter
  const char* name;
};

class ReducedPrecision : public ::testing::TestWithParam<Precision> {};

// fp16 and bf16 transfer stay within their precision of the fp32 result on realistic gradients,
// identically on every rank.
TEST_P(ReducedPrecision, TransferIsCloseToFp32) {
  const int W = 3, b = 4;
  DataParallelOptions o;
  o.codec.dtype = GetParam().dtype;
  Net ref{nullptr};  // built by rankGradients
  const auto grads = rankGradients(ref, W, b, o);
  auto rp = ref->parameters();
  for (size_t i = 0; i + 2 < rp.size(); ++i) {  // the last two: the unused layer (zeros)
    const at::Tensor& want = rp[i].grad();
    // fp16 keeps 11 significant bits (relative error ~5e-4 per rounding), bf16 8 (~4e-3); a few
    // roundings along the ring; values far below the scale's reach flush toward zero, hence the
    // absolute term.
    const double bound = GetParam().bound * want.abs().max().item<double>() + 1e-6;
    EXPECT_LE((grads[0][i] - want).abs().max().item<double>(), bound) << "param " << i;
    EXPECT_TRUE(grads[0][i].equal(grads[W - 1][i])) << "identical on every rank";
  }
}

// Channels-last gradients (not contiguous) take the same fp16 path: converted to the wire and
// back into .grad in their own memory format, equal to what contiguous gradients give.
TEST(DataParallel, Fp16TransferOfChannelsLastGradients) {
  const int W = 2, b = 3;
  DataParallelOptions o;
  o.codec.dtype = TransferDtype::kFloat16;
  Net ref{nullptr};
  const auto plain = rankGradients(ref, W, b, o);
  const auto last = rankGradients(ref, W, b, o, 0, false, /*channels_last=*/true);
  ASSERT_FALSE(last[0][0].is_contiguous()) << "c1.weight's gradient should be channels-last";
  ASSERT_TRUE(last[0][0].is_contiguous(at::MemoryFormat::ChannelsLast));
  for (size_t i = 0; i + 2 < plain[0].size(); ++i) {
    // Same values up to the summation order of two convolution kernels, then one fp16 rounding.
    const double bound = 2e-3 * plain[0][i].abs().max().item<double>() + 1e-6;
    EXPECT_LE((last[0][i] - plain[0][i]).abs().max().item<double>(), bound) << "param " << i;
    EXPECT_TRUE(last[0][i].equal(last[W - 1][i])) << "identical on every rank";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReducedPrecision,
                         ::testing::Values(Precision{TransferDtype::kFloat16, 3e-3, "fp16"},
                                           Precision{TransferDtype::kBFloat16, 2e-2, "bf16"}),
                         [](const auto& info) { return std::string(info.param.name); });

// 200 training steps on 2 ranks end with the same held-out accuracy whether gradients travel as
// fp32, fp16 or bf16 (a 4-class problem of Gaussian clusters that an MLP learns to ~95%).
TEST(DataParallel, TwoHundredStepsReachTheSameAccuracyInEveryTransferDtype) {
  const int W = 2, b = 16, steps = 200, D = 8, C = 4;
  const at::Tensor centers = at::randn({C, D}, at::detail::createCPUGenerator(5), at::kFloat) * 1.5;
  auto sample = [&](int n, uint64_t seed, at::Tensor* labels) {
    auto gen = at::detail::createCPUGenerator(seed);
    *labels = at::randint(0, C, {n}, gen, at::kLong);
    return centers.index_select(0, *labels) + at::randn({n, D}, gen, at::kFloat);
  };
  at::Tensor test_y;
  const at::Tensor test_x = sample(2000, 99, &test_y);
  torch::manual_seed(11);
  torch::nn::Sequential init_net(torch::nn::Linear(D, 32), torch::nn::ReLU(), torch::nn::Linear(32, C));
  const auto init = snapshot(*init_net);
  auto accuracy = [&](TransferDtype dtype) {
    std::vector<double> acc(W);
    expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
      torch::nn::Sequential net(torch::nn::Linear(D, 32), torch::nn::ReLU(), torch::nn::Linear(32, C));
      restore(*net, init);
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      DataParallelOptions o;
      o.codec.dtype = dtype;
      DataParallel dp(net.ptr(), t, WorldInfo{r, W, r, W}, o);
      for (int s = 0; s < steps; ++s) {
        at::Tensor y;
        const at::Tensor x = sample(b, 1000 * s + r, &y);
        opt.zero_grad();
        torch::nn::functional::cross_entropy(net->forward(x), y).backward();
        if (dp.finishBackward()) opt.step();
      }
      at::NoGradGuard no_grad;
      acc[r] = net->forward(test_x).argmax(1).eq(test_y).to(at::kDouble).mean().item<double>();
    }));
    EXPECT_EQ(acc[0], acc[1]) << "ranks hold the same model";
    return acc[0];
  };
  const double fp32 = accuracy(TransferDtype::kFloat32), fp16 = accuracy(TransferDtype::kFloat16),
               bf16 = accuracy(TransferDtype::kBFloat16);
  EXPECT_GT(fp32, 0.85) << "the problem is learnable in 200 steps";
  EXPECT_NEAR(fp16, fp32, 0.01) << "fp16 " << fp16 << " fp32 " << fp32;
  EXPECT_NEAR(bf16, fp32, 0.01) << "bf16 " << bf16 << " fp32 " << fp32;
}

// A planted inf is caught on every rank: all skip the same step and halve the scale; training
// continues with the next step.
TEST(DataParallel, Fp16OverflowSkipsTheStepEverywhere) {
  const int W = 2;
  std::vector<std::vector<bool>> stepped(W);
  std::vector<double> scales(W);
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    DataParallelOptions o;
    o.codec.dtype = TransferDtype::kFloat16;
    o.codec.grad_scale = 256;
    DataParallel dp(net.ptr(), t, WorldInfo{r, W, r, W}, o);
    for (int s = 0; s < 3; ++s) {
      for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
      at::Tensor in = inputs(2, 10 + s);
      if (s == 1 && r == 1) in[0][0][0][0] = std::numeric_limits<float>::infinity();  // only rank 1
      torch::nn::functional::cross_entropy(net->forward(in), targets(2, s)).backward();
      stepped[r].push_back(dp.finishBackward());
    }
    scales[r] = dp.gradScale();
  }));
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(stepped[r], (std::vector<bool>{true, false, true})) << "rank " << r;
    EXPECT_DOUBLE_EQ(scales[r], 128.0);
  }
}

// AMP fp16 with fp16 transfer: the gradients arrive multiplied by the loss scale. Shared with
// DataParallel, that one scale is also the transfer's: the wire carries S x g / world (not
// S x 1024 x g / world, which overflows fp16 for |g| above 1e-3 at S = 65536), the reduced
// gradient is divided by S once, and an overflow skips the step on every rank and halves the one
// scale that the loss scaler reads.
TEST(DataParallel, Fp16TransferSharesTheLossScale) {
  const int W = 2;
  const double S = 65536;
  // Rank r's gradient of w is the closed form g_r = c_r (the loss is c_r . w), times S.
  const auto grad = [](int r, int step) {
    const double m = step == 1 ? 100.0 : 1.0;  // step 1: S x g overflows fp16 (65504)
    return at::tensor({0.01 * (r + 1), -0.02 * (r + 1), 0.003 * (r + 2), 0.0}, at::kFloat) * m;
  };
  std::vector<std::vector<bool>> stepped(W);
  std::vector<std::vector<double>> scales(W);
  std::vector<std::vector<at::Tensor>> grads(W);
  std::vector<int64_t> skipped(W);
  std::vector<char> shared(W, 0), unshared_ok(W, 0);  // not vector<bool>: ranks write their own byte
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    auto net = std::make_shared<torch::nn::Module>();
    at::Tensor w = net->register_parameter("w", at::zeros({4}));
    DataParallelOptions o;
    o.codec.dtype = TransferDtype::kFloat16;
    o.finish_in_backward = false;  // finishBackward() called after backward, as aiacc_train does
    DataParallel dp(net, t, WorldInfo{r, W, r, W}, o);
    auto scale = std::make_shared<GradScale>();
    shared[r] = dp.shareLossScale(scale);
    for (int step = 0; step < 3; ++step) {
      w.mutable_grad() = at::Tensor();
      ((w * grad(r, step)).sum() * scale->value()).backward();
      stepped[r].push_back(dp.finishBackward());
      scales[r].push_back(scale->value());
      grads[r].push_back(w.grad().clone());
    }
    skipped[r] = scale->skippedSteps();
    // The same scaled gradient through a DataParallel that keeps its own transfer scale (1024):
    // the two scales multiply and fp16 overflows. This is what sharing prevents.
    auto net2 = std::make_shared<torch::nn::Module>();
    at::Tensor w2 = net2->register_parameter("w", at::zeros({4}));
    DataParallel own(net2, t, WorldInfo{r, W, r, W}, o);
    ((w2 * grad(r, 0)).sum() * S).backward();
    unshared_ok[r] = own.finishBackward();
  }));
  const at::Tensor mean0 = (grad(0, 0) + grad(1, 0)) / 2;
  for (int r = 0; r < W; ++r) {
    EXPECT_TRUE(shared[r]);
    EXPECT_EQ(stepped[r], (std::vector<bool>{true, false, true})) << "rank " << r;
    EXPECT_EQ(scales[r], (std::vector<double>{S, S / 2, S / 2})) << "rank " << r;
    EXPECT_EQ(skipped[r], 1) << "the skipped step is counted where the loss scaler reads it";
    // fp16 keeps 11 significant bits: 2^-11 relative, plus the rounding of the sum.
    for (int step : {0, 2}) {
      EXPECT_TRUE(at::allclose(grads[r][static_cast<size_t>(step)], mean0, 2e-3, 1e-7))
          << "step " << step << " rank " << r << ": " << grads[r][static_cast<size_t>(step)] << " vs " << mean0;
    }
    EXPECT_FALSE(unshared_ok[r]) << "two scales compound: S x 1024 x g overflows fp16";
  }
}

// fp32 and bf16 transfer have no use for a scale: the loss scaler keeps unscaling after the sync.
TEST(DataParallel, OnlyFp16TransferTakesTheLossScale) {
  for (TransferDtype d : {TransferDtype::kFloat32, TransferDtype::kBFloat16}) {
    expectNoErrors(runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
      auto net = std::make_shared<torch::nn::Module>();
      net->register_parameter("w", at::zeros({4}));
      DataParallelOptions o;
      o.codec.dtype = d;
      DataParallel dp(net, t, WorldInfo{r, 2, r, 2}, o);
      EXPECT_FALSE(dp.shareLossScale(std::make_shared<GradScale>())) << transferDtypeName(d);
    }));
  }
}

}  // namespace
}  // namespace aiacc::comm
