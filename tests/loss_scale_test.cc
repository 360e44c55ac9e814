// The AMP loss scaler and fp16 transfer hold one scale between them: the trainer hands
// GradScaler's scale to the gradient sync (GradientSync::shareLossScale), the sync divides the
// reduced gradients by it, and a step it skips moves the scale the loss scaler multiplies by.
// This is the trainer's protocol (app/trainer.cc, trainStep) on CPU, with closed-form gradients.
#include <gtest/gtest.h>

#include <vector>

#include "app/amp.h"
#include "comm/data_parallel.h"
#include "tests/comm_test_util.h"

namespace aiacc {
namespace {

TEST(LossScale, GradScalerSharedWithFp16TransferScalesOnce) {
  const int W = 2;
  // Rank r's loss is c_r . w, so its gradient is c_r; x 2000 at step 1, which S = 65536 makes
  // overflow fp16 on the wire (and only there: the fp32 gradients themselves are finite).
  const auto c = [](int r, int step) {
    return at::tensor({0.01f * static_cast<float>(r + 1), -0.005f, 0.0f}) * (step == 1 ? 2000.0 : 1.0);
  };
  std::vector<std::vector<bool>> applied(W);
  std::vector<std::vector<double>> scales(W);
  std::vector<at::Tensor> last_grad(W);
  std::vector<int64_t> skipped(W);
  comm::test::expectNoErrors(comm::test::runRanks(W, [&](int r, std::shared_ptr<comm::Transport> t) {
    auto net = std::make_shared<torch::nn::Module>();
    at::Tensor w = net->register_parameter("w", at::zeros({3}));
    comm::DataParallelOptions o;
    o.transfer = comm::TransferDtype::kFloat16;
    comm::DataParallel dp(net, t, comm::WorldInfo{r, W, r, W}, o);
    app::GradScaler scaler;  // 65536, as PyTorch's
    ASSERT_TRUE(dp.shareLossScale(scaler.shared()));
    for (int step = 0; step < 3; ++step) {
      w.mutable_grad() = at::Tensor();
      scaler.scaleLoss((w * c(r, step)).sum()).backward();
      const bool ok = dp.finishBackward();  // the sync unscaled, checked and moved the scale
      applied[r].push_back(ok);
      scales[r].push_back(scaler.scale());
      if (ok) last_grad[r] = w.grad().clone();
    }
    skipped[r] = scaler.skippedSteps();
  }));
  const at::Tensor mean = (c(0, 0) + c(1, 0)) / 2;
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(applied[r], (std::vector<bool>{true, false, true})) << "rank " << r;
    EXPECT_EQ(scales[r], (std::vector<double>{65536, 32768, 32768})) << "rank " << r;
    EXPECT_EQ(skipped[r], 1);
    EXPECT_TRUE(at::allclose(last_grad[r], mean, 2e-3, 1e-7)) << last_grad[r] << " vs " << mean;
  }
}

}  // namespace
}  // namespace aiacc
