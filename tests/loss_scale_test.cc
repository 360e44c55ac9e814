// The AMP loss scaler and the gradient sync, through the trainer's own step code
// (app::finishStep, which app/trainer.cc's trainStep calls): on CPU, 2 ranks over the in-process
// transport, closed-form gradients.
//   - fp16 transfer: GradScaler's scale is the transfer's scale too (GradientSync::shareLossScale);
//     the sync divides the reduced gradients by it, and a step it skips moves the scale;
//   - fp32 and bf16 transfer: the sync does not take the scale; an overflow of the scaled
//     gradients skips the step and backs the scale off whether the trainer's unscale finds it
//     (fp32) or the sync's check of its bf16 wire does (bf16).
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <vector>

#include "app/amp.h"
#include "aiacc/comm/data_parallel.h"
#include "tests/comm_test_util.h"

namespace aiacc {
namespace {

struct RankRun {
  std::vector<bool> applied;
  std::vector<double> scales;
  at::Tensor last_grad, weight;
  int64_t skipped = 0;
  bool sync_unscales = false;
};

// Three steps of the loss c(r, step) . w on each of 2 ranks, with the trainer's scaler protocol
// (finishStep) and plain SGD at lr 1 as the optimizer step.
std::vector<RankRun> runSteps(comm::TransferDtype transfer, const std::function<at::Tensor(int, int)>& c) {
  const int W = 2;
  std::vector<RankRun> runs(W);
  comm::test::expectNoErrors(comm::test::runRanks(W, [&](int r, std::shared_ptr<comm::Transport> t) {
    RankRun& run = runs[r];
    auto net = std::make_shared<torch::nn::Module>();
    at::Tensor w = net->register_parameter("w", at::zeros({3}));
    comm::DataParallelOptions o;
    o.codec.dtype = transfer;
    comm::DataParallel dp(net, t, comm::WorldInfo{r, W, r, W}, o);
    app::GradScaler scaler;  // 65536, as PyTorch's
    run.sync_unscales = dp.shareLossScale(scaler.shared());
    for (int step = 0; step < 3; ++step) {
      w.mutable_grad() = at::Tensor();
      scaler.scaleLoss((w * c(r, step)).sum()).backward();
      const bool ok = app::finishStep(dp, scaler, run.sync_unscales, {w}, [&] {
        torch::NoGradGuard no_grad;
        w.sub_(w.grad());
      });
      run.applied.push_back(ok);
      run.scales.push_back(scaler.scale());
      if (ok) run.last_grad = w.grad().clone();
    }
    run.skipped = scaler.skippedSteps();
    run.weight = w.detach().clone();
  }));
  return runs;
}

at::Tensor base(int r) { return at::tensor({0.01f * static_cast<float>(r + 1), -0.005f, 0.0f}); }

TEST(LossScale, GradScalerSharedWithFp16TransferScalesOnce) {
  // Rank r's gradient is c_r; x 2000 at step 1, which S = 65536 makes overflow fp16 on the wire
  // (and only there: the fp32 gradients themselves are finite).
  const auto c = [](int r, int step) { return base(r) * (step == 1 ? 2000.0 : 1.0); };
  const std::vector<RankRun> runs = runSteps(comm::TransferDtype::kFloat16, c);
  const at::Tensor mean = (base(0) + base(1)) / 2;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(runs[r].sync_unscales) << "fp16 transfer takes the loss scale";
    EXPECT_EQ(runs[r].applied, (std::vector<bool>{true, false, true})) << "rank " << r;
    EXPECT_EQ(runs[r].scales, (std::vector<double>{65536, 32768, 32768})) << "rank " << r;
    EXPECT_EQ(runs[r].skipped, 1);
    EXPECT_TRUE(at::allclose(runs[r].last_grad, mean, 2e-3, 1e-7)) << runs[r].last_grad << " vs " << mean;
    // Two applied steps of SGD at lr 1 on the mean gradient (fp16 on the wire: ~3 digits).
    EXPECT_TRUE(at::allclose(runs[r].weight, -2 * mean, 2e-3, 1e-7)) << runs[r].weight;
  }
}

// At step 1 the gradient x 1e38 is finite, x 65536 it is not even in fp32: the scaled
// gradients overflow before any transfer, as fp16 activations' gradients do.
class LossScaleOverflow : public ::testing::TestWithParam<comm::TransferDtype> {};

TEST_P(LossScaleOverflow, SkipsTheStepAndBacksTheScaleOff) {
  const auto c = [](int r, int step) { return base(r) * (step == 1 ? 1e38 : 1.0); };
  const std::vector<RankRun> runs = runSteps(GetParam(), c);
  const at::Tensor mean = (base(0) + base(1)) / 2;
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(runs[r].sync_unscales) << "only fp16 transfer takes the loss scale";
    EXPECT_EQ(runs[r].applied, (std::vector<bool>{true, false, true})) << "rank " << r;
    EXPECT_EQ(runs[r].scales, (std::vector<double>{65536, 32768, 32768}))
        << "rank " << r << ": the overflow must back the scale off";
    EXPECT_EQ(runs[r].skipped, 1);
    EXPECT_TRUE(at::allclose(runs[r].last_grad, mean, 1e-2, 1e-7)) << runs[r].last_grad << " vs " << mean;
    EXPECT_TRUE(at::allclose(runs[r].weight, -2 * mean, 1e-2, 1e-7)) << runs[r].weight;
  }
}

INSTANTIATE_TEST_SUITE_P(Transfer, LossScaleOverflow,
                         ::testing::Values(comm::TransferDtype::kFloat32, comm::TransferDtype::kBFloat16),
                         [](const auto& info) { return std::string(comm::transferDtypeName(info.param)); });

// The scaler disabled (fp32 training, bf16 autocast): the sync's verdict alone, the scale
// never consulted.
TEST(LossScale, DisabledScalerLeavesTheStepToTheSync) {
  comm::LocalSync sync;
  app::GradScalerOptions so;
  so.enabled = false;
  app::GradScaler scaler(so);
  at::Tensor w = torch::zeros({2}, torch::requires_grad());
  (w * at::tensor({1.0f, std::numeric_limits<float>::infinity()})).sum().backward();
  int steps = 0;
  EXPECT_TRUE(app::finishStep(sync, scaler, false, {w}, [&] { ++steps; }));
  EXPECT_EQ(steps, 1) << "without a scaler nothing checks the gradients";
  EXPECT_EQ(scaler.skippedSteps(), 0);
}

}  // namespace
}  // namespace aiacc
