// A user's CommHook (comm/comm_hook.h) through DataParallel: what it is handed, when, and that
// what it leaves in the bucket is what every rank's .grad holds, checked in closed form.
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aiacc/comm/data_parallel.h"
#include "tests/comm_test_util.h"

namespace aiacc::comm {
namespace {

// Gradients known in closed form: loss = sum_i (w_i * c_i).sum(), so dloss/dw_i = c_i.
struct Linearly : torch::nn::Module {
  explicit Linearly(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i)
      w.push_back(register_parameter("w" + std::to_string(i), at::ones({sizes[i]})));
  }
  at::Tensor loss(const std::vector<at::Tensor>& c, size_t skip = SIZE_MAX) {
    at::Tensor l = at::zeros({});
    for (size_t i = 0; i < w.size(); ++i) {
      if (i != skip) l = l + (w[i] * c[i]).sum();
    }
    return l;
  }
  std::vector<at::Tensor> w;
};

// Rank r's gradient of parameter i: values that a grid of 1/4 does not hold exactly.
at::Tensor gradOf(int r, size_t i, int64_t n) {
  return at::arange(n, at::kFloat).mul(0.37).add(0.11 * (r + 1) + 0.5 * static_cast<double>(i)).sin();
}

// The compression under test: each value rounded to a multiple of 1/4 before the sum; the sum
// divided by the world after it. It records what it was handed.
class QuarterHook : public CommHook {
 public:
  std::shared_ptr<Work> launch(GradBucket& b, Transport& t) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      launched.push_back(static_cast<int>(b.index));
      lasts.push_back(b.last);
    }
    b.state = b.buffer.mul(4).round_().div_(4);
    return t.allreduce(b.state);
  }
  bool finish(GradBucket& b) override {
    b.buffer.copy_(b.state).div_(b.world);
    ++finished;
    return skip_at != finished;
  }
  std::string name() const override { return "quarter"; }

  std::mutex mu;
  std::vector<int> launched;
  std::vector<bool> lasts;
  int finished = 0;
  int skip_at = -1;  // the finish() call (1-based) that says "skip the step"
};

at::Tensor quarter(const at::Tensor& g) { return g.mul(4).round().div(4); }

const std::vector<int64_t> kSizes = {300, 7, 1000, 40};

DataParallelOptions smallBuckets(std::shared_ptr<CommHook> hook) {
  DataParallelOptions o;
  o.reducer.bucket_mb = 600.0 * 4 / (1 << 20);  // a cap of 600 floats: [w3] [w2] [w1 w0]
  o.reducer.first_bucket_mb = o.reducer.bucket_mb;
  o.reducer.hook = std::move(hook);
  return o;
}

TEST(CommHook, EveryRankHoldsTheClosedFormAverageOfTheCompressedGradients) {
  const int W = 2;
  std::vector<std::vector<at::Tensor>> grads(W);
  std::vector<std::shared_ptr<QuarterHook>> hooks(W);
  std::vector<std::string> described(W);
  test::expectNoErrors(test::runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    hooks[r] = std::make_shared<QuarterHook>();
    auto m = std::make_shared<Linearly>(kSizes);
    DataParallel dp(m, t, WorldInfo{r, W, r, W}, smallBuckets(hooks[r]));
    described[r] = dp.describe();
    std::vector<at::Tensor> c;
    for (size_t i = 0; i < kSizes.size(); ++i) c.push_back(gradOf(r, i, kSizes[i]));
    for (int step = 0; step < 2; ++step) {  // step 2 runs the buckets rebuilt from step 1's order
      for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
      m->loss(c).backward();
      ASSERT_TRUE(dp.finishBackward());
    }
    for (auto& p : m->parameters()) grads[r].push_back(p.grad().clone());
    EXPECT_EQ(dp.plan().buckets.size(), 3u);
  }));
  for (size_t i = 0; i < kSizes.size(); ++i) {
    at::Tensor want = (quarter(gradOf(0, i, kSizes[i])) + quarter(gradOf(1, i, kSizes[i]))) / W;
    // The unhooked average differs: the test can tell whether the hook ran.
    ASSERT_FALSE(want.equal((gradOf(0, i, kSizes[i]) + gradOf(1, i, kSizes[i])) / W));
    for (int r = 0; r < W; ++r) EXPECT_TRUE(grads[r][i].equal(want)) << "rank " << r << " parameter " << i;
  }
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(hooks[r]->launched, (std::vector<int>{0, 1, 2, 0, 1, 2})) << "rank " << r;
    EXPECT_EQ(hooks[r]->lasts, (std::vector<bool>{false, false, true, false, false, true}));
    EXPECT_EQ(hooks[r]->finished, 6);
    EXPECT_NE(described[r].find("comm hook quarter"), std::string::npos) << described[r];
  }
}

TEST(CommHook, AccumulationUnusedParametersAndASkippedStep) {
  const int W = 2;
  std::vector<std::string> log(W);
  test::expectNoErrors(test::runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    auto hook = std::make_shared<QuarterHook>();
    hook->skip_at = 6;  // the third bucket of the second synchronized step
    DataParallelOptions o = smallBuckets(hook);
    o.reducer.detect_unused = true;
    auto m = std::make_shared<Linearly>(kSizes);
    DataParallel dp(m, t, WorldInfo{r, W, r, W}, o);
    std::vector<at::Tensor> c;
    for (size_t i = 0; i < kSizes.size(); ++i) c.push_back(gradOf(r, i, kSizes[i]));
    // Two micro-batches accumulated locally, then reduced once: the hook sees the sum; w1 unused.
    dp.setSync(false);
    m->loss(c, /*skip=*/1).backward();
    EXPECT_TRUE(hook->launched.empty()) << "the hook ran while sync was off";
    dp.setSync(true);
    m->loss(c, /*skip=*/1).backward();
    ASSERT_TRUE(dp.finishBackward());
    EXPECT_EQ(hook->launched.size(), 3u);
    for (size_t i : {size_t{0}, size_t{2}, size_t{3}}) {
      const at::Tensor want = (quarter(2 * gradOf(0, i, kSizes[i])) + quarter(2 * gradOf(1, i, kSizes[i]))) / W;
      EXPECT_TRUE(m->w[i].grad().equal(want)) << "rank " << r << " parameter " << i;
    }
    EXPECT_FALSE(m->w[1].grad().defined()) << "an unused parameter got a gradient through the hook";
    // The hook says "skip" at its sixth finish(): every rank skips that step.
    for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
    m->loss(c).backward();
    EXPECT_FALSE(dp.finishBackward()) << "rank " << r;
    EXPECT_EQ(dp.skippedSteps(), 1);
    // The next step runs as usual.
    for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
    m->loss(c).backward();
    EXPECT_TRUE(dp.finishBackward()) << "rank " << r;
    EXPECT_TRUE(m->w[1].grad().equal((quarter(gradOf(0, 1, kSizes[1])) + quarter(gradOf(1, 1, kSizes[1]))) / W));
  }));
}

TEST(CommHook, RefusedWithAReducedPrecisionTransfer) {
  auto t = std::make_shared<test::ImmediateTransport>(1);
  DataParallelOptions o = smallBuckets(std::make_shared<QuarterHook>());
  o.codec.dtype = TransferDtype::kFloat16;
  try {
    DataParallel dp(std::make_shared<Linearly>(kSizes), t, WorldInfo{}, o);
    ADD_FAILURE() << "a hook with fp16 transfer was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a comm hook (quarter) decides what travels: leave the transfer at fp32"),
              std::string::npos)
        << e.what();
  }
}

// A Work that records when it is waited for, and fails if told to.
class Recorded : public Work {
 public:
  Recorded(std::vector<std::string>& log, std::string name, Transport& t, bool fail)
      : log_(log), name_(std::move(name)), t_(t), fail_(fail) {}
  void wait() override {
    // Whether the transport was aborted by then: an aborted one fails what it is given.
    bool aborted = false;
    try {
      t_.allreduce(at::zeros({1}))->wait();
    } catch (const CommError&) {
      aborted = true;
    }
    log_.push_back(name_ + (aborted ? " after abort" : ""));
    if (fail_) throw CommError(name_ + " failed");
  }

 private:
  std::vector<std::string>& log_;
  std::string name_;
  Transport& t_;
  bool fail_;
};

TEST(CommHook, AllOfWaitsForEveryWorkAndAbortsAtTheFirstFailure) {
  test::ImmediateTransport one(1);
  Transport& t = one;
  std::vector<std::string> log;
  auto work = [&](const char* name, bool fail) { return std::make_shared<Recorded>(log, name, t, fail); };
  allOf({work("a", false), work("b", false)}, t)->wait();
  EXPECT_EQ(log, (std::vector<std::string>{"a", "b"}));
  log.clear();
  try {
    allOf({work("a", false), work("b", true), work("c", true)}, t)->wait();
    ADD_FAILURE() << "a failed work was not rethrown";
  } catch (const CommError& e) {
    EXPECT_EQ(std::string(e.what()), "b failed");  // the first failure, not c's
  }
  EXPECT_EQ(log, (std::vector<std::string>{"a", "b", "c after abort"}));
  EXPECT_THROW(allOf({nullptr}, t), InputError);
}

// A hook that returns no Work, or that replaces the bucket's buffer: a one-line error, and the
// next step runs (world 1: nothing waits on a peer).
class Misbehaving : public CommHook {
 public:
  std::shared_ptr<Work> launch(GradBucket& b, Transport& t) override {
    if (mode == 1) return nullptr;
    return t.allreduce(b.buffer);
  }
  bool finish(GradBucket& b) override {
    if (mode == 2) b.buffer = b.buffer.clone();
    return true;
  }
  std::string name() const override { return "misbehaving"; }
  int mode = 0;
};

TEST(CommHook, AHookThatBreaksTheContractIsOneLineAndTheNextStepRuns) {
  auto hook = std::make_shared<Misbehaving>();
  auto m = std::make_shared<Linearly>(kSizes);
  DataParallel dp(m, std::make_shared<test::ImmediateTransport>(1), WorldInfo{}, smallBuckets(hook));
  std::vector<at::Tensor> c;
  for (size_t i = 0; i < kSizes.size(); ++i) c.push_back(gradOf(0, i, kSizes[i]));
  auto step = [&] {
    for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
    m->loss(c).backward();
    return dp.finishBackward();
  };
  hook->mode = 2;
  try {
    step();
    ADD_FAILURE() << "a replaced bucket.buffer was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the comm hook 'misbehaving' replaced bucket.buffer"), std::string::npos)
        << e.what();
  }
  hook->mode = 0;
  EXPECT_TRUE(step());
  for (size_t i = 0; i < kSizes.size(); ++i) EXPECT_TRUE(m->w[i].grad().equal(c[i])) << "parameter " << i;
  hook->mode = 1;
  try {
    step();
    ADD_FAILURE() << "a hook without a Work was accepted";
  } catch (const std::exception& e) {  // from backward(): autograd may wrap it
    EXPECT_NE(std::string(e.what()).find("the comm hook 'misbehaving' returned no Work"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace aiacc::comm
