// --elastic-batch keep-global (app/config.h ElasticBatch): a global batch that the world does not
// divide is shared unevenly (data::rankBatch), and each rank's mean loss is weighted by
// app::meanLossWeight so that every image weighs 1 / global batch in the gradient the sync
// averages: two ranks with 3 and 2 images give the single process's gradient on all 5.
#include <gtest/gtest.h>

#include <torch/nn/functional/loss.h>

#include <vector>

#include "app/config.h"
#include "data/sampler.h"
#include "tests/data_parallel_test_util.h"

namespace aiacc {
namespace {

using comm::test::Net;

// One backward on 2 rank-threads over DataParallel: rank r's images are `shares[r]` (positions
// [begin, end) of x); each rank's mean loss times meanLossWeight(its images, global, 2) when
// `weighted`. Returns rank 0's averaged gradients; `ref` gets the initial weights.
std::vector<at::Tensor> twoRankGradients(const at::Tensor& x, const at::Tensor& y,
                                         const std::vector<std::pair<int64_t, int64_t>>& shares, int64_t global,
                                         bool weighted, Net& ref) {
  torch::manual_seed(3);
  ref = Net();
  const auto init = comm::test::snapshot(*ref);
  std::vector<at::Tensor> grads;
  comm::test::expectNoErrors(comm::test::runRanks(2, [&](int r, std::shared_ptr<comm::Transport> t) {
    Net net;
    comm::test::restore(*net, init);
    comm::DataParallel dp(net.ptr(), t, comm::WorldInfo{r, 2, r, 2}, comm::DataParallelOptions{});
    const auto [begin, end] = shares[static_cast<size_t>(r)];
    at::Tensor loss = torch::nn::functional::cross_entropy(net->forward(x.slice(0, begin, end)),
                                                           y.slice(0, begin, end));
    if (weighted) loss = loss * app::meanLossWeight(end - begin, global, 2);
    loss.backward();
    ASSERT_TRUE(dp.finishBackward());
    if (r == 0) {
      for (auto& p : net->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    }
  }));
  return grads;
}

// The reference: the mean loss over the `images` rows of x (all, or those decoded) over `global`.
std::vector<at::Tensor> singleProcess(Net& ref, const at::Tensor& x, const at::Tensor& y, int64_t global) {
  const at::Tensor sum = torch::nn::functional::cross_entropy(
      ref->forward(x), y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  (sum / static_cast<double>(global)).backward();
  std::vector<at::Tensor> grads;
  for (auto& p : ref->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return grads;
}

void expectSameGradients(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, bool same) {
  ASSERT_EQ(got.size(), want.size());
  bool all_close = true;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!want[i].defined()) continue;  // the net's unused layer
    all_close = all_close && got[i].allclose(want[i], 1e-5, 1e-6);
  }
  EXPECT_EQ(all_close, same);
}

TEST(ElasticBatch, UnevenSharesOfAGlobalBatchWeighEachImageOnce) {
  const int64_t G = 5;
  ASSERT_EQ(data::rankBatch(G, 0, 2), 3);
  ASSERT_EQ(data::rankBatch(G, 1, 2), 2);
  EXPECT_DOUBLE_EQ(app::meanLossWeight(3, G, 2), 1.2);
  EXPECT_DOUBLE_EQ(app::meanLossWeight(2, G, 2), 0.8);
  EXPECT_DOUBLE_EQ(app::meanLossWeight(4, 8, 2), 1.0);  // an even split's full batch: the plain mean
  const at::Tensor x = comm::test::inputs(G, 11), y = comm::test::targets(G, 12);
  Net ref;
  const std::vector<at::Tensor> weighted = twoRankGradients(x, y, {{0, 3}, {3, 5}}, G, true, ref);
  expectSameGradients(weighted, singleProcess(ref, x, y, G), true);
  // The plain average of the two means weighs rank 1's images 1/4 and rank 0's 1/6: not the same.
  const std::vector<at::Tensor> plain = twoRankGradients(x, y, {{0, 3}, {3, 5}}, G, false, ref);
  expectSameGradients(plain, singleProcess(ref, x, y, G), false);
}

// One of rank 1's two images did not decode: the other four keep their weight 1 / 5 (the step's
// gradient is the 4 images' summed loss over the global batch, not over the images decoded).
TEST(ElasticBatch, AnUndecodedImageOfAnUnevenShareCountsAsZero) {
  const int64_t G = 5;
  const at::Tensor x = comm::test::inputs(G, 21), y = comm::test::targets(G, 22);
  Net ref;
  const std::vector<at::Tensor> got = twoRankGradients(x, y, {{0, 3}, {3, 4}}, G, true, ref);
  expectSameGradients(got, singleProcess(ref, x.slice(0, 0, 4), y.slice(0, 0, 4), G), true);
}

}  // namespace
}  // namespace aiacc
