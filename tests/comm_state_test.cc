// What a data-parallel set-up hands a checkpoint (comm::CommState) and takes back from one: fp16
// transfer's own scale, the tuner's choice, striping's channel shares and the rebuilt bucket order.
// A set-up made afresh with the stopped one's state continues as if never stopped; without it, it
// starts over (scale, tuning, plan).
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "aiacc/comm/autotune.h"
#include "aiacc/comm/data_parallel.h"
#include "tests/comm_test_util.h"
#include "tests/data_parallel_test_util.h"

namespace aiacc::comm {
namespace {

using test::Net;

// A state holding only a transfer scale and its clean steps.
CommState scaleState(double scale, int64_t good_steps) {
  CommState s;
  s.transfer_scale = scale;
  s.transfer_good_steps = good_steps;
  return s;
}

// A state holding only the given parts.
CommState partsState(std::optional<TuneConfig> tuned, std::vector<double> weights, std::vector<int64_t> order) {
  CommState s;
  s.tuned = tuned;
  s.channel_weights = std::move(weights);
  s.bucket_order = std::move(order);
  return s;
}

// Training state of a 2-rank job with fp16 transfer: the scale after every step, the final
// parameters of rank 0. At step `stop` (when given) the set-up is made afresh, as a resumed job
// makes it, with the stopped one's CommState restored or not.
struct ScaleRun {
  std::vector<double> scales;
  std::vector<at::Tensor> params;
};
enum class Resume { kNone, kWithState, kWithoutState };

// Net's weights drawn once from `seed`, before the rank threads start (they must not draw from
// the global generator concurrently).
std::vector<at::Tensor> initialWeights(uint64_t seed) {
  torch::manual_seed(seed);
  Net net;
  return test::snapshot(*net);
}
ScaleRun fp16Run(Resume resume, int stop) {
  const int W = 2, b = 4, steps = 8;
  const auto init = initialWeights(3);
  std::vector<ScaleRun> out(W);
  test::expectNoErrors(test::runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    test::restore(*net, init);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    DataParallelOptions o;
    o.codec.dtype = TransferDtype::kFloat16;
    o.codec.scale_growth_steps = 2;  // the scale doubles after steps 2, 4, 6 and 8
    auto dp = std::make_unique<DataParallel>(net.ptr(), t, WorldInfo{r, W, r, W}, o);
    for (int s = 0; s < steps; ++s) {
      if (s == stop && resume != Resume::kNone) {
        const CommState state = dp->commState();
        dp.reset();
        dp = std::make_unique<DataParallel>(net.ptr(), t, WorldInfo{r, W, r, W}, o);
        if (resume == Resume::kWithState) {
          EXPECT_TRUE(dp->restoreCommState(state).empty());
        }
      }
      opt.zero_grad();
      const uint64_t seed = 100 * static_cast<uint64_t>(s) + static_cast<uint64_t>(r);
      torch::nn::functional::cross_entropy(net->forward(test::inputs(b, seed)), test::targets(b, seed + 50)).backward();
      if (dp->finishBackward()) opt.step();
      out[r].scales.push_back(dp->gradScale());
    }
    out[r].params = test::snapshot(*net);
  }));
  return out[0];
}

// fp16 transfer's own scale is state a checkpoint carries (CommState): a set-up made afresh after
// 5 steps with the stopped one's state continues to the bit as the uninterrupted one (the scale
// and its count of clean steps, hence every later step's rounding); made afresh without it, the
// scale starts over at its initial value.
TEST(DataParallel, Fp16TransferScaleContinuesFromItsCommState) {
  const ScaleRun whole = fp16Run(Resume::kNone, -1);
  ASSERT_EQ(whole.scales, (std::vector<double>{1024, 2048, 2048, 4096, 4096, 8192, 8192, 16384}))
      << "no overflow: the scale doubles every 2 clean steps";
  const ScaleRun resumed = fp16Run(Resume::kWithState, 5);
  EXPECT_EQ(resumed.scales, whole.scales);
  for (size_t i = 0; i < whole.params.size(); ++i) {
    EXPECT_TRUE(resumed.params[i].equal(whole.params[i])) << "parameter " << i;
  }
  const ScaleRun fresh = fp16Run(Resume::kWithoutState, 5);
  EXPECT_EQ(fresh.scales[5], 1024) << "without the state the scale starts over after the stop";
  EXPECT_EQ(fresh.scales.back(), 2048);
}

// What each set-up's CommState holds, and what restoreCommState does with a state it cannot use.
TEST(DataParallel, CommStateHoldsOnlyAScaleOfTheTransfersOwn) {
  test::expectNoErrors(test::runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
    Net net;  // rank 0's weights are broadcast
    DataParallelOptions o;
    o.codec.dtype = TransferDtype::kFloat16;
    DataParallel fp16(net.ptr(), t, WorldInfo{r, 2, r, 2}, o);
    EXPECT_EQ(fp16.commState().transfer_scale, 1024);
    EXPECT_THROW(fp16.restoreCommState(scaleState(-1, 0)), InputError);
    EXPECT_TRUE(fp16.restoreCommState(CommState{}).empty());  // a checkpoint without a scale: the initial one stays
    EXPECT_EQ(fp16.gradScale(), 1024);
    ASSERT_TRUE(fp16.shareLossScale(std::make_shared<GradScale>()));
    EXPECT_EQ(fp16.commState().transfer_scale, 0) << "the AMP loss scale is its owner's to save";
  }));
  test::expectNoErrors(test::runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    DataParallel fp32(net.ptr(), t, WorldInfo{r, 2, r, 2}, DataParallelOptions{});
    EXPECT_EQ(fp32.commState().transfer_scale, 0);
    EXPECT_EQ(fp32.restoreCommState(scaleState(2048, 1)),
              std::vector<std::string>{
                  "the transfer scale (2048) is not used: this set-up's transfer has no scale of its own"});
    EXPECT_TRUE(fp32.restoreCommState(CommState{}).empty());
  }));
  EXPECT_EQ(LocalSync().restoreCommState(scaleState(2048, 1)).size(), 1u);
  EXPECT_THROW(LocalSync().restoreCommState(scaleState(-1, 0)), InputError);
}

// A 3-rank job (a sum of three depends on its order, so a bucket's layout and where a split
// bucket is cut reach the bits) over two channels of fixed speeds, 4:1 (RatedTransport: striping's
// shares follow them, step by step), tuned on an injected clock that charges 1 ms per bucket and 2
// ms more on one channel: from one tensor per bucket on one channel the tuner moves to 25 MiB
// buckets, then to two channels, and freezes after 22 steps. At step `stop` (when given) the
// set-up is made afresh, with the stopped one's state restored or not.
struct TunedRun {
  std::optional<TuneConfig> tuned;  // at the end
  std::vector<std::vector<size_t>> plan;
  std::vector<double> weights;
  std::vector<at::Tensor> params;
  CommState saved;  // at the stop
  bool tuning_after_stop = false;
  std::vector<std::vector<size_t>> plan_after_stop;
  std::vector<double> weights_after_stop;
  std::vector<std::string> unused;
};
TunedRun tunedRun(Resume resume, int stop) {
  const int W = 3, b = 2, steps = 30;
  const auto init = initialWeights(5);
  std::vector<TunedRun> out(W);
  test::expectNoErrors(test::runRanks(
      W,
      [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    test::restore(*net, init);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    // Rates that are powers of two: a channel's measured rate (bytes over bytes / rate) is then
    // exact whatever it carried, so the shares' moving average is the same sequence of doubles
    // in both runs (the restored set-up's first measurement also counts its construction's
    // broadcast).
    auto rated = std::make_shared<test::RatedTransport>(t, std::vector<double>{0x1p28, 0x1p26});
    DataParallelOptions o;
    o.reducer.bucket_mb = 1e-4;  // ~100 bytes: one tensor per bucket
    o.reducer.first_bucket_mb = 1e-4;
    o.striping.min_split_bytes = 256;
    o.striping.channels = 1;
    o.autotune = true;
    o.tune.bucket_mb = {1e-4, 25};
    o.tune.channels = {1, 2};
    double now = 0;
    o.clock = [&now] { return now; };
    auto dp = std::make_unique<DataParallel>(net.ptr(), rated, WorldInfo{r, W, r, W}, o);
    TunedRun& mine = out[static_cast<size_t>(r)];
    for (int s = 0; s < steps; ++s) {
      if (s == stop && resume != Resume::kNone) {
        mine.saved = dp->commState();
        dp.reset();
        dp = std::make_unique<DataParallel>(net.ptr(), rated, WorldInfo{r, W, r, W}, o);
        if (resume == Resume::kWithState) mine.unused = dp->restoreCommState(mine.saved);
        mine.tuning_after_stop = dp->tuning();
        mine.plan_after_stop = dp->plan().buckets;
        mine.weights_after_stop = dp->channelWeights();
      }
      opt.zero_grad();
      const uint64_t seed = 100 * static_cast<uint64_t>(s) + static_cast<uint64_t>(r);
      torch::nn::functional::cross_entropy(net->forward(test::inputs(b, seed)), test::targets(b, seed + 50)).backward();
      now += 1e-3 * static_cast<double>(dp->plan().buckets.size()) + (dp->channelWeights().size() == 1 ? 2e-3 : 0);
      if (dp->finishBackward()) opt.step();
    }
    if (dp->tuner()->frozen()) mine.tuned = dp->tuner()->current();
    mine.plan = dp->plan().buckets;
    mine.weights = dp->channelWeights();
    mine.params = test::snapshot(*net);
      },
      /*channels=*/2));
  for (int r = 1; r < W; ++r) {
    EXPECT_EQ(out[static_cast<size_t>(r)].tuned, out[0].tuned) << "every rank decides alike";
    EXPECT_EQ(out[static_cast<size_t>(r)].weights, out[0].weights) << "every rank splits alike";
  }
  return out[0];
}

// The tuner's choice, the channel shares and the bucket order travel in CommState: a set-up made
// afresh after 24 steps (the tuner froze after 22) with the stopped one's state neither tunes nor
// replans, and ends with the uninterrupted run's parameters to the bit; made afresh without it,
// it tunes again from one tensor per bucket on one channel.
TEST(DataParallel, TunedSetUpContinuesFromItsCommState) {
  const TunedRun whole = tunedRun(Resume::kNone, -1);
  ASSERT_TRUE(whole.tuned.has_value()) << "the tuner froze within 30 steps";
  EXPECT_EQ(*whole.tuned, (TuneConfig{25, 2, false})) << "fused buckets, then both channels";
  ASSERT_EQ(whole.weights.size(), 2u);
  EXPECT_GT(whole.weights[0], 0.7) << "the 4x faster channel takes most of a split bucket";

  const TunedRun resumed = tunedRun(Resume::kWithState, 24);
  ASSERT_TRUE(resumed.saved.tuned.has_value());
  EXPECT_EQ(*resumed.saved.tuned, *whole.tuned);
  EXPECT_EQ(resumed.saved.bucket_order.size(), whole.params.size()) << "rebuilt after the first step";
  EXPECT_TRUE(resumed.unused.empty()) << resumed.unused.front();
  EXPECT_FALSE(resumed.tuning_after_stop) << "the choice is restored, not tuned again";
  EXPECT_EQ(resumed.plan_after_stop, whole.plan) << "the rebuilt buckets at once, before any step";
  EXPECT_EQ(resumed.weights_after_stop, resumed.saved.channel_weights) << "the shares to the bit";
  EXPECT_EQ(resumed.tuned, whole.tuned);
  EXPECT_EQ(resumed.weights, whole.weights);
  for (size_t i = 0; i < whole.params.size(); ++i) {
    EXPECT_TRUE(resumed.params[i].equal(whole.params[i])) << "parameter " << i;
  }

  const TunedRun fresh = tunedRun(Resume::kWithoutState, 24);
  EXPECT_TRUE(fresh.tuning_after_stop) << "without the state the set-up tunes again";
  EXPECT_NE(fresh.plan_after_stop, whole.plan) << "and starts from one tensor per bucket";
  EXPECT_EQ(fresh.weights_after_stop, (std::vector<double>{1})) << "on one channel";
}

// A state a set-up cannot use is set aside, one line per part, and the rest applied; a state no
// set-up could have written is an InputError.
TEST(DataParallel, CommStateAppliesWhatTheSetUpCanUse) {
  test::expectNoErrors(test::runRanks(
      2,
      [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    const size_t n = net->parameters().size();
    std::vector<int64_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<int64_t>(i);  // registration order
    DataParallelOptions plain;                                          // no tuner, both channels
    {
      DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2}, plain);
      CommState s;
      s.tuned = TuneConfig{8, 2, false};
      s.channel_weights = {0.25, 0.75};
      s.bucket_order = order;
      EXPECT_EQ(dp.restoreCommState(s),
                std::vector<std::string>{"the tuner's choice (bucket 8 MiB, 2 channels, flat) is not used: this "
                                         "set-up does not tune"});
      EXPECT_EQ(dp.channelWeights(), (std::vector<double>{0.25, 0.75}));
      EXPECT_EQ(dp.commState().bucket_order, order) << "the order restored counts as rebuilt";
      s.channel_weights = {0.5, 0.25, 0.25};
      s.tuned.reset();
      EXPECT_EQ(dp.restoreCommState(s), std::vector<std::string>{"the channel shares (3 channels) are not used: "
                                                                 "this set-up splits over 2"});
      for (const CommState& bad :
           {scaleState(std::numeric_limits<double>::infinity(), 0), scaleState(0, -1),
            partsState(TuneConfig{0, 1, false}, {}, {}), partsState(std::nullopt, {0.5, -0.5}, {}),
            partsState(std::nullopt, {0.5, 0.25}, {}), partsState(std::nullopt, {}, {0}),
            partsState(std::nullopt, {}, std::vector<int64_t>(n, 0))}) {
        EXPECT_THROW(dp.restoreCommState(bad), InputError);
      }
    }
    DataParallelOptions tuned = plain;
    tuned.autotune = true;
    DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2}, tuned);
    CommState s;
    s.tuned = TuneConfig{8, 4, false};
    EXPECT_EQ(dp.restoreCommState(s),
              std::vector<std::string>{"the tuner's choice (bucket 8 MiB, 4 channels, flat) is not used: its "
                                       "transport has 2 channels"});
    EXPECT_TRUE(dp.tuning()) << "a choice set aside: the set-up tunes";
    s.tuned = TuneConfig{8, 1, true};
    EXPECT_EQ(dp.restoreCommState(s).size(), 1u) << "no two-level transport";
    s.tuned = TuneConfig{8, 1, false};
    EXPECT_TRUE(dp.restoreCommState(s).empty());
    EXPECT_FALSE(dp.tuning());
    EXPECT_EQ(dp.commState().tuned, s.tuned);
    EXPECT_EQ(dp.tuner()->current(), *s.tuned);
      },
      /*channels=*/2));
  CommState all;
  all.tuned = TuneConfig{8, 2, false};
  all.channel_weights = {0.5, 0.5};
  all.bucket_order = {1, 0};
  EXPECT_EQ(LocalSync().restoreCommState(all).size(), 3u) << "a single process uses none of it";
}

}  // namespace
}  // namespace aiacc::comm
