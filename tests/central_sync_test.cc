// The negotiation benchmark's classic coordinator (app/bench/central_sync.h) computes the same
// averaged gradients as DataParallel, and leaves the parameters no rank used without one.
#include <gtest/gtest.h>

#include "app/bench/central_sync.h"
#include "tests/data_parallel_test_util.h"

namespace aiacc::comm {
namespace {

using namespace test;

TEST(CentralSync, GradientEqualsSingleProcessAndUnusedStayWithout) {
  const int W = 3, b = 4;
  Net ref{nullptr};
  const MakeSync central = [](std::shared_ptr<torch::nn::Module> m, std::shared_ptr<Transport> t, const WorldInfo& w) {
    return std::make_unique<app::CentralSync>(std::move(m), std::move(t), w);
  };
  const auto grads = rankGradients(ref, W, b, central);
  auto rp = ref->named_parameters();
  int without = 0;
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(grads[r].size(), rp.size());
    for (size_t i = 0; i < rp.size(); ++i) {
      if (!rp[i].value().grad().defined()) {  // Net's "unused" layer: agreed unused everywhere
        EXPECT_FALSE(grads[r][i].defined()) << rp[i].key();
        ++without;
        continue;
      }
      ASSERT_TRUE(grads[r][i].defined()) << rp[i].key();
      EXPECT_TRUE(at::allclose(grads[r][i], rp[i].value().grad(), 1e-5, 1e-7)) << "rank " << r << " " << rp[i].key();
    }
  }
  EXPECT_EQ(without, 2 * W) << "the unused layer's weight and bias, on every rank";
}

}  // namespace
}  // namespace aiacc::comm
