// comm/ DataParallel: equivalence with one process, failure modes, BN statistics, bucketing,
// striping and the autotuner driven by injected channel statistics and step times, never by the
// machine's clock (the tuner's search logic: autotune_test.cc; reduced-precision
// transfer: reduced_precision_test.cc). Ranks are
// threads sharing one in-memory store (real Gloo over TCP on loopback).
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <thread>

#include "aiacc/config.h"
#include "aiacc/comm/autotune.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/factory.h"
#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/hierarchical.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/half.h"
#include "aiacc/comm/store.h"
#include "tests/comm_test_util.h"
#include "tests/data_parallel_test_util.h"

namespace aiacc::comm {
namespace {

using namespace test;  // runRanks, expectNoErrors, the test net and its data

TEST(BucketPlan, PureFunctionOfTheParameterList) {
  std::vector<ParamInfo> params;
  for (int i = 0; i < 6; ++i) {
    ParamInfo p;
    p.name = "p" + std::to_string(i);
    p.numel = i == 2 ? 1000 : 100;  // 400 bytes each, p2: 4000 bytes
    p.shape = {p.numel};
    p.dtype = i == 0 ? 1 : 0;  // p0: another dtype
    params.push_back(p);
  }
  const BucketPlan plan = planBuckets(params, reverseOrder(6), /*first=*/400, /*cap=*/1000);
  // Reverse order; the first bucket is capped at 400 bytes, later ones at 1000; p2 exceeds the
  // cap and stands alone; p0's dtype cannot join p1.
  const std::vector<std::vector<size_t>> want = {{5}, {4, 3}, {2}, {1}, {0}};
  EXPECT_EQ(plan.buckets, want);
  EXPECT_EQ(planFingerprint(params, plan), planFingerprint(params, planBuckets(params, reverseOrder(6), 400, 1000)));
  EXPECT_NE(planFingerprint(params, plan), planFingerprint(params, planBuckets(params, reverseOrder(6), 400, 5000)));
  ParamInfo renamed = params[3];
  renamed.name = "other";
  EXPECT_NE(paramFingerprint(renamed), paramFingerprint(params[3]));
}

struct Caps {
  double first_mb, mb;
  const char* name;
  int ranks_per_node = 0;  // > 0: two-level reduction
  bool shm = false;        // shared memory (inside the node, with two-level)
};

class Equivalence : public ::testing::TestWithParam<Caps> {};

// After one backward on N ranks with batch b each, every rank's averaged gradient equals the
// single-process gradient on the N*b concatenated batch.
TEST_P(Equivalence, GradientEqualsSingleProcessOnConcatenatedBatch) {
  if (GetParam().ranks_per_node > 0) AIACC_SKIP_WITHOUT_GLOO();
  const int W = 3, b = 4;
  DataParallelOptions o;
  o.reducer.first_bucket_mb = GetParam().first_mb;
  o.reducer.bucket_mb = GetParam().mb;
  Net ref{nullptr};  // built by rankGradients
  const auto grads = rankGradients(ref, W, b, o, GetParam().ranks_per_node, GetParam().shm);
  auto rp = ref->named_parameters();
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(grads[r].size(), rp.size());
    for (size_t i = 0; i < rp.size(); ++i) {
      const at::Tensor want = rp[i].value().grad().defined() ? rp[i].value().grad() : at::zeros_like(rp[i].value());
      EXPECT_TRUE(at::allclose(grads[r][i], want, 1e-5, 1e-7))
          << GetParam().name << " rank " << r << " " << rp[i].key() << " max diff "
          << (grads[r][i] - want).abs().max().item<float>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BucketCaps, Equivalence,
                         ::testing::Values(Caps{1e-9, 1e-9, "one_param_per_bucket"}, Caps{1, 25, "default"},
                                           Caps{1000, 1000, "one_bucket"}, Caps{1, 25, "hierarchical_1x3", 3},
                                           Caps{1e-9, 1e-9, "hierarchical_3x1_per_param", 1},
                                           Caps{1, 25, "shm", 0, true},
                                           Caps{1e-9, 1e-9, "hierarchical_1x3_shm_per_param", 3, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// 20 SGD steps on N ranks leave identical parameters everywhere, equal to a single-process run
// on the concatenated batches.
TEST(DataParallel, TwentyStepsMatchSingleProcess) {
  const int W = 2, b = 3, steps = 20;
  torch::manual_seed(3);
  Net ref;
  const auto init = oneProcessSgd(ref, W, b, steps);
  std::vector<std::vector<at::Tensor>> finals(W);
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    restore(*net, init);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    DataParallel dp(net.ptr(), t, WorldInfo{r, W, r, W});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      dp.beforeForward();
      torch::nn::functional::cross_entropy(net->forward(inputs(W * b, 10 + s).narrow(0, r * b, b)),
                                           targets(W * b, 50 + s).narrow(0, r * b, b))
          .backward();
      ASSERT_TRUE(dp.finishBackward());
      opt.step();
    }
    for (auto& p : net->parameters()) finals[r].push_back(p.detach().clone());
  }));
  auto rp = ref->parameters();
  for (size_t i = 0; i < rp.size(); ++i) {
    EXPECT_TRUE(finals[0][i].equal(finals[1][i])) << "ranks diverged at parameter " << i;
    EXPECT_TRUE(at::allclose(finals[0][i], rp[i], 1e-4, 1e-6)) << "parameter " << i;
  }
}

// Gradients of Net's mean loss on rank r's batch of 4, from the weights w.
std::vector<at::Tensor> gradsOf(const std::vector<at::Tensor>& w, int r) {
  test::Net m;
  test::restore(*m, w);
  torch::nn::functional::cross_entropy(m->forward(test::inputs(4, r)), test::targets(4, r)).backward();
  std::vector<at::Tensor> g;
  for (auto& p : m->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  return g;
}

// A rank with an empty batch (aiacc_train: every file skipped) calls finishBackward() without a
// backward. 3 ranks, rank 2 runs no backward at all: every rank ends with (g0 + g1 + 0) / 3, the closed
// form, on every parameter.
TEST(DataParallel, RankWithoutBackwardContributesZeros) {
  test::Net ref;
  const std::vector<at::Tensor> w0 = test::snapshot(*ref);
  const std::vector<at::Tensor> g0 = gradsOf(w0, 0), g1 = gradsOf(w0, 1);
  std::vector<std::vector<at::Tensor>> got(3);
  const auto errors = test::runRanks(3, [&](int r, std::shared_ptr<Transport> t) {
    test::Net m;
    if (r == 0) test::restore(*m, w0);  // DataParallel broadcasts rank 0's weights
    WorldInfo w;
    w.rank = r;
    w.world = 3;
    DataParallel dp(m.ptr(), t, w);
    for (int step = 0; step < 2; ++step) {  // the first step rebuilds the buckets: run a second
      dp.beforeForward();
      for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
      if (r < 2) torch::nn::functional::cross_entropy(m->forward(test::inputs(4, r)), test::targets(4, r)).backward();
      ASSERT_TRUE(dp.finishBackward());
    }
    for (auto& p : m->parameters()) got[r].push_back(p.grad().clone());
  });
  test::expectNoErrors(errors);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(got[r].size(), g0.size());
    for (size_t i = 0; i < g0.size(); ++i) {
      const at::Tensor expected = (g0[i] + g1[i]) / 3;
      EXPECT_TRUE(at::allclose(got[r][i], expected, 1e-5, 1e-7)) << "rank " << r << " parameter " << i;
    }
  }
}

TEST(DataParallel, ModelMismatchIsNamedNotHung) {
  const auto errors = runRanks(
      2,
      [&](int r, std::shared_ptr<Transport> t) {
    Net net(r == 0 ? 8 : 6);  // rank 1 has a different c1
    DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2});
      },
      1, std::chrono::seconds(10));
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("model mismatch: parameter #0 ('c1.weight'"), std::string::npos) << errors[r];
  }
}

TEST(DataParallel, UnusedParametersOnOneRankDoNotHang) {
  std::vector<at::Tensor> unused_grad(2);
  expectNoErrors(runRanks(
      2,
      [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2});
    for (int s = 0; s < 3; ++s) {
      for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
      // Only rank 0 uses the extra layer, on even steps.
      auto out = net->forward(inputs(2, s), /*use_extra=*/r == 0 && s % 2 == 0);
      torch::nn::functional::cross_entropy(out, targets(2, s)).backward();
      dp.finishBackward();
    }
    unused_grad[r] = net->unused->weight.grad().clone();
      },
      1, std::chrono::seconds(20)));
  // Last step (s = 2): rank 0 used it, rank 1 did not: both hold rank 0's gradient / 2.
  EXPECT_TRUE(unused_grad[0].equal(unused_grad[1]));
  EXPECT_GT(unused_grad[0].abs().sum().item<float>(), 0.0f);
}

// Agreement rides on the last bucket (no collective of its own), in every transfer dtype: a
// parameter unused everywhere keeps no gradient; one used on a single rank gets the average.
TEST(DataParallel, DetectUnusedLeavesNeverUsedParametersWithoutGradient) {
  for (TransferDtype dtype : {TransferDtype::kFloat32, TransferDtype::kFloat16, TransferDtype::kBFloat16}) {
    bool defined[2] = {false, false}, used_once[2] = {false, false};  // not vector<bool>: one word for both ranks
    expectNoErrors(runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
      Net net;
      DataParallelOptions o;
      o.reducer.detect_unused = true;
      o.codec.dtype = dtype;
      DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2}, o);
      torch::nn::functional::cross_entropy(net->forward(inputs(2, r)), targets(2, r)).backward();
      dp.finishBackward();
      defined[r] = net->unused->weight.grad().defined();
      ASSERT_TRUE(net->fc->weight.grad().defined());
      // Second step: only rank 1 uses the extra layer; both must get its (averaged) gradient.
      for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
      torch::nn::functional::cross_entropy(net->forward(inputs(2, r), r == 1), targets(2, r)).backward();
      dp.finishBackward();
      used_once[r] = net->unused->weight.grad().defined();
    }));
    EXPECT_FALSE(defined[0]);
    EXPECT_FALSE(defined[1]);
    EXPECT_TRUE(used_once[0]);
    EXPECT_TRUE(used_once[1]);
  }
}

TEST(DataParallel, BatchNormBuffersBroadcastOrAveraged) {
  for (BufferSync mode : {BufferSync::kBroadcast, BufferSync::kAverage}) {
    std::vector<float> mean(3);
    expectNoErrors(runRanks(3, [&](int r, std::shared_ptr<Transport> t) {
      auto seq = torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
      DataParallelOptions o;
      o.buffers = mode;
      DataParallel dp(seq.ptr(), t, WorldInfo{r, 3, r, 3}, o);
      auto bn = seq->named_buffers()["1.running_mean"];
      bn.fill_(static_cast<float>(r));  // each rank's statistics differ
      dp.beforeForward();
      mean[r] = bn[0].item<float>();
    }));
    for (int r = 0; r < 3; ++r) EXPECT_FLOAT_EQ(mean[r], mode == BufferSync::kBroadcast ? 0.0f : 1.0f);
  }
}

// kAverageWhenRead exchanges nothing per step, yet after syncBuffers() every rank holds exactly
// what averaging before every forward (kAverage) gives: the running statistics' updates are
// linear. kBroadcast's syncBuffers() leaves every rank with rank 0's.
TEST(DataParallel, BatchNormBuffersAveragedWhenReadEqualAveragedEveryStep) {
  const int W = 3, steps = 4;
  auto train = [&](BufferSync mode, std::vector<std::vector<float>>& before, std::vector<std::vector<float>>& after) {
    before.assign(W, {});
    after.assign(W, {});
    expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
      auto seq = torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
      {  // the same weights in every run and on every rank: not from the global generator, which
         // the rank threads share (so its draws would depend on their interleaving)
        at::NoGradGuard no_grad;
        for (auto& p : seq->parameters()) p.copy_(at::randn(p.sizes(), at::detail::createCPUGenerator(3), at::kFloat));
      }
      DataParallelOptions o;
      o.buffers = mode;
      DataParallel dp(seq.ptr(), t, WorldInfo{r, W, r, W}, o);
      torch::NoGradGuard no_grad;
      for (int s = 0; s < steps; ++s) {
        dp.beforeForward();
        // Each rank's batches differ, in mean and in spread.
        seq->forward(at::randn({8, 4}, at::detail::createCPUGenerator(100 * s + r), at::kFloat) * (1.0 + r) + r);
      }
      auto stats = [&] {
        auto b = seq->named_buffers();
        at::Tensor both = at::cat({b["1.running_mean"], b["1.running_var"]});
        return std::vector<float>(both.data_ptr<float>(), both.data_ptr<float>() + both.numel());
      };
      before[r] = stats();
      dp.syncBuffers();
      after[r] = stats();
      dp.syncBuffers();  // nothing changed since: no collective, the same values
      EXPECT_EQ(stats(), after[r]);
    }));
  };
  std::vector<std::vector<float>> every_before, every, lazy_before, lazy, bc_before, bc;
  train(BufferSync::kAverage, every_before, every);
  train(BufferSync::kAverageWhenRead, lazy_before, lazy);
  train(BufferSync::kBroadcast, bc_before, bc);
  EXPECT_NE(lazy_before[0], lazy_before[1]);  // nothing was exchanged before syncBuffers()
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(lazy[r].size(), 8u);
    for (size_t i = 0; i < 8; ++i) {
      EXPECT_NEAR(lazy[r][i], every[0][i], 1e-5 * (1 + std::abs(every[0][i]))) << "rank " << r << " value " << i;
      EXPECT_EQ(every[r][i], every[0][i]);
      EXPECT_EQ(bc[r][i], bc_before[0][i]);  // rank 0's, as they were after its last forward
    }
  }
}

// A loop that never calls beforeForward(): finishBackward() marks the buffers, and syncBuffers()
// still averages them (the default mode), so every rank evaluates with the same statistics.
TEST(DataParallel, SyncBuffersAveragesWithoutBeforeForward) {
  const int W = 2;
  std::vector<std::vector<float>> before(W), after(W);
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    auto seq = torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
    DataParallel dp(seq.ptr(), t, WorldInfo{r, W, r, W});
    for (int s = 0; s < 3; ++s) {
      seq->forward(at::randn({8, 4}, at::detail::createCPUGenerator(10 * s + r), at::kFloat) * (1.0 + r) + r)
          .sum()
          .backward();
      ASSERT_TRUE(dp.finishBackward());
    }
    const at::Tensor mean = seq->named_buffers()["1.running_mean"];
    before[r].assign(mean.data_ptr<float>(), mean.data_ptr<float>() + mean.numel());
    dp.syncBuffers();
    after[r].assign(mean.data_ptr<float>(), mean.data_ptr<float>() + mean.numel());
  }));
  ASSERT_NE(before[0], before[1]) << "the ranks' batches should give different statistics";
  EXPECT_EQ(after[0], after[1]);
  for (size_t i = 0; i < after[0].size(); ++i) EXPECT_FLOAT_EQ(after[0][i], (before[0][i] + before[1][i]) / 2);
}

TEST(DataParallel, GradientAccumulationEqualsOneLargeBatch) {
  const int W = 2, b = 2, micro = 3;
  const at::Tensor x = inputs(W * b * micro, 5), y = targets(W * b * micro, 6);
  torch::manual_seed(9);
  Net ref;
  const auto init = snapshot(*ref);
  // Mean over micro-batches of per-micro-batch means == mean over the whole batch (equal sizes).
  for (int m = 0; m < micro; ++m) {
    for (int r = 0; r < W; ++r) {
      const int64_t off = (m * W + r) * b;
      (torch::nn::functional::cross_entropy(ref->forward(x.narrow(0, off, b)), y.narrow(0, off, b)) / (micro * W))
          .backward();
    }
  }
  std::vector<std::vector<at::Tensor>> grads(W);
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    restore(*net, init);
    DataParallel dp(net.ptr(), t, WorldInfo{r, W, r, W});
    for (int m = 0; m < micro; ++m) {
      dp.setSync(m == micro - 1);  // communicate only on the last micro-batch
      const int64_t off = (m * W + r) * b;
      (torch::nn::functional::cross_entropy(net->forward(x.narrow(0, off, b)), y.narrow(0, off, b)) / micro).backward();
    }
    dp.finishBackward();
    for (auto& p : net->parameters()) grads[r].push_back(p.grad().clone());
  }));
  auto rp = ref->parameters();
  for (int r = 0; r < W; ++r) {
    for (size_t i = 0; i < rp.size() - 2; ++i) {  // the unused layer has no gradient
      EXPECT_TRUE(at::allclose(grads[r][i], rp[i].grad(), 1e-5, 1e-7)) << "rank " << r << " param " << i;
    }
  }
}

// A second backward before finishBackward() is an error naming a parameter (its gradient would
// otherwise be dropped: the bucket may already be on the wire), as in PyTorch's DDP; with sync
// off (gradient accumulation) it is what is asked for.
TEST(DataParallel, GradientReadyTwiceIsAnErrorNamingTheParameter) {
  const auto errors = runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    DataParallelOptions o;
    o.finish_in_backward = false;  // finishBackward() called after backward, as aiacc_train does
    DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2}, o);
    torch::nn::functional::cross_entropy(net->forward(inputs(2, r)), targets(2, r)).backward();
    dp.finishBackward();
    torch::nn::functional::cross_entropy(net->forward(inputs(2, r)), targets(2, r)).backward();
    try {
      torch::nn::functional::cross_entropy(net->forward(inputs(2, r)), targets(2, r)).backward();
      ADD_FAILURE() << "rank " << r << ": a second backward before finishBackward() was accepted";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("became ready twice before finishBackward()"), std::string::npos) << what;
      EXPECT_NE(what.find("gradient of 'fc."), std::string::npos) << "names the parameter: " << what;
    }
    dp.finishBackward();  // the first backward's buckets complete; the step is still usable
  });
  expectNoErrors(errors);
}

TEST(DataParallel, DeadRankFailsTheOthersWithinTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = runRanks(
      2,
      [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2});
    if (r == 1) throw std::runtime_error("rank 1 dies before its first step");
    torch::nn::functional::cross_entropy(net->forward(inputs(2, 0)), targets(2, 0)).backward();
    dp.finishBackward();
      },
      1, std::chrono::seconds(3));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#if AIACC_WITH_GLOO  // Gloo's words, with the peer named
  EXPECT_NE(errors[0].find("collective failed on rank 0"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find(" (rank 1)"), std::string::npos) << errors[0];
#else  // shared memory, the CPU transport of builds without Gloo, names the rank that left
  EXPECT_NE(errors[0].find("shm: rank 1 closed its transport"), std::string::npos) << errors[0];
#endif
  EXPECT_LT(s, 30.0) << "no hang";
}

// A net with one large fused bucket, so buckets are split across channels.
struct WideImpl : torch::nn::Module {
  WideImpl() { fc = register_module("fc", torch::nn::Linear(512, 1024)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Wide);

// The split follows the channels' statistics, identically on every rank, and the gradients stay
// exact. The statistics are injected (test::RatedTransport), not measured: channel 0 runs at
// 2^28 bytes/s on rank 0 and 2^29 on rank 1, channel 1 at 2^27 on both, so the rates summed over
// ranks are 3:1 (each rank alone would say 2:1 or 4:1) and every rebalance (balance_alpha 0.5)
// moves the weights halfway to 0.75 / 0.25: after j steps channel 0's share is 0.75 - 0.25 / 2^j.
// Powers of two keep every division exact, so each step's pieces are exactly floor(n x share)
// elements on channel 0 and the rest on channel 1 (StripedTransport's rounding).
TEST(DataParallel, SplitFollowsChannelStatistics) {
  const int W = 2, kSteps = 6;
  const int64_t n = 512 * 1024 + 1024;  // the one bucket: fc's weight and bias
  const auto share = [](int j) { return 0.75 - 0.25 * std::ldexp(1.0, -j); };
  std::vector<std::vector<double>> weights(W);
  std::vector<std::vector<RatedTransport::Allreduce>> pieces(W);
  std::vector<at::Tensor> grads(W);
  torch::manual_seed(4);
  Wide ref;
  const auto init = snapshot(*ref);
  const at::Tensor x = at::randn({2 * W, 512}, at::detail::createCPUGenerator(8), at::kFloat);
  ref->forward(x).pow(2).mean().backward();
  expectNoErrors(runRanks(
      W,
      [&](int r, std::shared_ptr<Transport> gloo) {
    auto rated = std::make_shared<RatedTransport>(gloo, std::vector<double>{std::ldexp(1.0, r == 0 ? 28 : 29),
                                                                            std::ldexp(1.0, 27)});
    Wide net;
    restore(*net, init);
    DataParallelOptions o;
    o.reducer.first_bucket_mb = 100;  // one bucket of 2 MiB
    DataParallel dp(net.ptr(), rated, WorldInfo{r, W, r, W}, o);
    for (int step = 0; step < kSteps; ++step) {
      for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
      net->forward(x.narrow(0, r * 2, 2)).pow(2).mean().backward();
      ASSERT_TRUE(dp.finishBackward());
    }
    weights[r] = dp.channelWeights();
    pieces[r] = rated->allreduces(at::kFloat);  // the bucket's pieces: nothing else is float
    grads[r] = net->fc->weight.grad().clone();
      },
      /*channels=*/2));
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(pieces[r].size(), 2u * kSteps) << "rank " << r << ": every step splits the bucket in two";
    for (int s = 0; s < kSteps; ++s) {
      const auto& a = pieces[r][2 * static_cast<size_t>(s)];
      const auto& b = pieces[r][2 * static_cast<size_t>(s) + 1];
      const int64_t first = static_cast<int64_t>(static_cast<double>(n) * share(s));  // before step s + 1
      EXPECT_EQ(a.channel, 0);
      EXPECT_EQ(b.channel, 1);
      EXPECT_EQ(a.numel, first) << "rank " << r << ", step " << s + 1;
      EXPECT_EQ(b.numel, n - first) << "rank " << r << ", step " << s + 1;
    }
    ASSERT_EQ(weights[r].size(), 2u);
    EXPECT_DOUBLE_EQ(weights[r][0], share(kSteps)) << "rank " << r;
    EXPECT_DOUBLE_EQ(weights[r][1], 1 - share(kSteps)) << "rank " << r;
    // Each rank's loss is the mean over its own half: the average of the two equals the full-batch
    // gradient of the mean over all rows.
    EXPECT_TRUE(at::allclose(grads[r], ref->fc->weight.grad(), 1e-5, 1e-7)) << "rank " << r;
  }
  EXPECT_EQ(weights[1], weights[0]) << "every rank splits identically";
}

// Offered a two-level transport as the alternative, the tuner starts on it (flat must then win
// by more than noise), and the trial of flat still reduces correctly: every rank ends each step
// with the same gradients. An injected clock makes every step 10 ms, so the path is fixed: two-level
// (steps 2-4), flat (5-7), a tie that keeps two-level, frozen.
TEST(Autotune, StartsOnTwoLevelWhenOffered) {
  AIACC_SKIP_WITHOUT_GLOO();
#if AIACC_WITH_GLOO
  const int W = 4;  // 2 "nodes" x 2 ranks
  auto store = makeHashStore();
  std::vector<int> started_two_level(W, -1);
  std::vector<std::string> described(W);
  std::vector<std::vector<float>> step_sums(W);
  std::vector<double> flat_score(W, 0);
  std::vector<int> frozen_two_level(W, -1);
  expectNoErrors(test::runThreads(W, [&](int r) {
    GlooOptions flat_o = test::glooOptions(r, W, 1);
    GlooOptions two_o = flat_o;
    two_o.name = "gloo2";
    two_o.row_base = 1;
    auto flat = std::make_shared<GlooTransport>(store, flat_o);
    Net net;  // arbitrary weights: DataParallel broadcasts rank 0's
    DataParallelOptions o;
    o.autotune = true;
    o.tune.try_two_level = true;
    o.two_level = makeGlooHierarchical(store, two_o, /*ranks_per_node=*/2, /*min_shard_bytes=*/1, /*shm=*/false);
    double now = 0;
    o.clock = [&now] { return now; };
    DataParallel dp(net.ptr(), flat, WorldInfo{r, W, r % 2, 2}, o);
    started_two_level[r] = dp.tuner()->current().two_level ? 1 : 0;
    described[r] = dp.describe();
    for (int step = 0; step < 8; ++step) {
      for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
      torch::nn::functional::cross_entropy(net->forward(inputs(2, 10 * step + r)), targets(2, 10 * step + r))
          .backward();
      now += 0.01;
      ASSERT_TRUE(dp.finishBackward());
      float sum = 0;  // every parameter's gradient, this step
      for (auto& p : net->parameters()) sum += p.grad().abs().sum().item<float>();
      step_sums[r].push_back(sum);
    }
    flat_score[r] = dp.tuner()->score(TuneConfig{o.reducer.bucket_mb, 1, false});
    frozen_two_level[r] = dp.tuner()->frozen() && dp.tuner()->current().two_level ? 1 : 0;
  }));
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(started_two_level[r], 1) << described[r];
    EXPECT_EQ(step_sums[r], step_sums[0]) << "rank " << r;
    EXPECT_NEAR(flat_score[r], 0.01, 1e-12) << "flat had its trial";
    EXPECT_EQ(frozen_two_level[r], 1) << "a tie keeps the start";
  }
#endif
}

// Many small tensors, one bucket each at the start: fusing them into one bucket is much faster,
// and the tuner picks it, identically on every rank. Everything the tuner reads comes from an
// injected clock that charges 1 ms per bucket between backward and finishBackward(): step times
// of 240 and 2 ms, and no exposed communication (the clock stands still while finishBackward()
// waits), so the machine's speed cannot reach the decision (a real step's time on a loaded 2-core
// box can invert the order, and the exposed wait, a tie-break, was read from the real clock).
TEST(Autotune, ManySmallTensorsFusionWins) {
  const int W = 2;
  struct Many : torch::nn::Module {
    Many() {
      for (int i = 0; i < 120; ++i) layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(4, 4)));
    }
    torch::Tensor forward(torch::Tensor x) {
      for (auto& l : layers) x = l(x);
      return x;
    }
    std::vector<torch::nn::Linear> layers;
  };
  std::vector<TuneConfig> chosen(W);
  std::vector<std::string> summaries(W);
  std::vector<std::string> logged;  // rank 1's notices; rank 0 has no log: it writes nothing anywhere
  testing::internal::CaptureStderr();
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    auto net = std::make_shared<Many>();
    DataParallelOptions o;
    o.reducer.bucket_mb = 1e-6;  // one tensor per bucket: 240 allreduces a step
    o.reducer.first_bucket_mb = 1e-6;
    o.autotune = true;
    if (r == 1) o.log = [&logged](const std::string& line) { logged.push_back(line); };
    o.tune.bucket_mb = {1e-6, 25};
    double now = 0;
    o.clock = [&now] { return now; };
    DataParallel dp(net, t, WorldInfo{r, W, r, W}, o);
    const at::Tensor x = at::ones({2, 4});
    for (int step = 0; step < 40 && dp.tuning(); ++step) {
      dp.beforeForward();
      net->forward(x).sum().backward();
      now += 1e-3 * static_cast<double>(dp.plan().buckets.size());
      dp.finishBackward();
    }
    ASSERT_FALSE(dp.tuning()) << "not frozen after 40 steps";
    const Autotuner& tuner = *dp.tuner();
    chosen[r] = tuner.current();
    summaries[r] = tuner.summary();
    for (double mb : {1e-6, 25.0}) {
      const TuneConfig c{mb, 1, false};
      EXPECT_NEAR(tuner.score(c), mb == 25 ? 2e-3 : 240e-3, 1e-12) << summaries[r];
      EXPECT_EQ(tuner.exposed(c), 0) << summaries[r];
    }
    EXPECT_EQ(tuner.margin(), o.tune.min_gain) << "no step-to-step spread: " << summaries[r];
    EXPECT_EQ(tuner.stepsRecorded(), 12) << summaries[r];     // 3 steps each: 1e-6, 25, then both re-timed
    ASSERT_EQ(dp.plan().buckets.size(), 2u) << summaries[r];  // the small first bucket, then all the rest
  }));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("autotune"), std::string::npos) << "the library wrote to stderr: " << err;
  EXPECT_EQ(chosen[0], chosen[1]);
  EXPECT_EQ(chosen[0].bucket_mb, 25) << summaries[0];
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_EQ(logged[0], "autotune: " + summaries[1]);
}

}  // namespace
}  // namespace aiacc::comm
