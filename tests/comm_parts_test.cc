// DataParallel's parts on their own, with closed-form expectations and no peers: the gradient
// scale's arithmetic, the bucket codecs' wire values, and the striping of buffers over channels
// (fed fake channel statistics through a recording transport), and how a background thread's
// error reaches the threads waiting for its work.
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <functional>
#include <thread>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "aiacc/comm/bucket_codec.h"
#include "aiacc/comm/bucket_plan.h"
#include "aiacc/comm/channel_worker.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/failure.h"
#include "aiacc/comm/grad_scale.h"
#include "aiacc/comm/op_timing.h"
#include "aiacc/comm/striped_transport.h"
#include "tests/comm_test_util.h"

namespace aiacc::comm {
namespace {

// ---- Errors crossing threads travel as values ----------------------------------------------

template <typename E>
Failure caught(const E& e) {
  try {
    throw e;
  } catch (...) {
    return Failure::current();
  }
}

TEST(Failure, RaisesTheKindAndMessageItCaught) {
  try {
    caught(CommError("peer gone", CommError::Remedy::kStore)).raise();
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "peer gone");
    EXPECT_EQ(e.remedy(), CommError::Remedy::kStore);
  }
  EXPECT_THROW(caught(InputError("bad flag")).raise(), InputError);
  EXPECT_THROW(caught(IoError("disk full")).raise(), IoError);
  try {  // any other exception: an aiacc::Error with its message
    caught(std::logic_error("something else")).raise();
  } catch (const CommError&) {
    ADD_FAILURE() << "a logic_error came back as a CommError";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "something else");
  }
  EXPECT_FALSE(Failure());
  EXPECT_TRUE(Failure::comm("x"));
}

// Two threads waiting for one failed job each get an exception of their own, alive at the same
// time: none is an object another thread may destroy under it (failure.h says why), and each
// carries the job's error. The job queued behind fails at once with that first error.
TEST(ChannelWorker, EveryWaiterRaisesItsOwnCopyOfTheFirstError) {
  ChannelWorker worker;
  auto failed = worker.submit("fails", 0, [] { throw CommError("injected", CommError::Remedy::kModel); });
  auto behind = worker.submit("behind", 0, [] { ADD_FAILURE() << "a job after a failure ran"; });
  std::exception_ptr held[2];
  auto waiter = [&](int i) {
    try {
      failed->wait();
    } catch (const CommError&) {
      held[i] = std::current_exception();
    }
  };
  std::thread other(waiter, 1);
  waiter(0);
  other.join();
  const CommError* seen[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(held[i]) << "waiter " << i << " saw no CommError";
    try {
      std::rethrow_exception(held[i]);
    } catch (const CommError& e) {
      seen[i] = &e;  // the object held[i] keeps alive
      EXPECT_STREQ(e.what(), "injected");
      EXPECT_EQ(e.remedy(), CommError::Remedy::kModel);
    }
  }
  EXPECT_NE(seen[0], seen[1]) << "two waiters share one exception object";
  try {
    behind->wait();
    ADD_FAILURE() << "the job behind the failure succeeded";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "injected");
  }
}

// Work::failure() never blocks: nothing while the job runs or after it succeeded, its error once
// it failed (the Reducer's early stop in backward reads it).
TEST(ChannelWorker, AWorksFailureIsKnownWithoutWaiting) {
  ChannelWorker worker;
  std::mutex gate;
  std::unique_lock<std::mutex> held(gate);
  auto running = worker.submit("held", 0, [&] { std::lock_guard<std::mutex> lock(gate); });
  auto failing = worker.submit("fails", 0, [] { throw CommError("injected", CommError::Remedy::kModel); });
  EXPECT_FALSE(running->failure());
  EXPECT_FALSE(failing->failure()) << "a queued job has not failed yet";
  held.unlock();
  running->wait();
  EXPECT_FALSE(running->failure()) << "a job that succeeded";
  EXPECT_THROW(failing->wait(), CommError);
  const Failure f = failing->failure();
  ASSERT_TRUE(f);
  EXPECT_EQ(f.what(), "injected");
  EXPECT_TRUE(firstFailure({running, failing}));
  EXPECT_FALSE(firstFailure({running}));
}

TEST(GradScale, BacksOffOnOverflowAndGrowsAfterAnInterval) {
  GradScaleOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  GradScale s(o);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.value(), 1024);
  s.update(false);  // an overflow restarts the interval
  EXPECT_EQ(s.value(), 512);
  EXPECT_EQ(s.skippedSteps(), 1);
  EXPECT_EQ(s.goodSteps(), 0);
  for (int i = 0; i < 3; ++i) s.update(true);
  EXPECT_EQ(s.value(), 1024);
  EXPECT_EQ(s.goodSteps(), 0);
  s.setState(8, 2);
  s.update(true);
  EXPECT_EQ(s.value(), 16);
}

// Options out of range are refused with one line naming the option and its value (a zero
// interval grew the scale every step; a non-positive scale turned every gradient into zeros or
// flipped its sign).
TEST(GradScale, RefusesOptionsOutOfRange) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::function<void(GradScaleOptions&)>, std::string>> cases = {
      {[](GradScaleOptions& o) { o.init_scale = 0; }, "init_scale"},
      {[](GradScaleOptions& o) { o.init_scale = -1024; }, "init_scale"},
      {[&](GradScaleOptions& o) { o.init_scale = inf; }, "init_scale"},
      {[](GradScaleOptions& o) { o.growth = 1; }, "growth"},
      {[](GradScaleOptions& o) { o.backoff = 0; }, "backoff"},
      {[](GradScaleOptions& o) { o.backoff = 1.5; }, "backoff"},
      {[](GradScaleOptions& o) { o.growth_interval = 0; }, "growth_interval"},
  };
  for (const auto& [edit, option] : cases) {
    GradScaleOptions o;
    edit(o);
    try {
      GradScale s(o);
      ADD_FAILURE() << option << ": accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(option + " must"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  GradScale s;
  EXPECT_THROW(s.setState(-1, 0), InputError);
  EXPECT_THROW(s.setState(std::nan(""), 0), InputError);
  // The fp16 codec's own scale goes through the same checks.
  CodecOptions c;
  c.dtype = TransferDtype::kFloat16;
  c.scale_growth_steps = 0;
  EXPECT_THROW(makeCodec(c), InputError);
}

// A bucket is one tensor on its first parameter's device: parameters on two devices are refused
// at plan time, naming both.
TEST(BucketPlan, RefusesParametersOnTwoDevices) {
  std::vector<ParamInfo> params(3);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].name = "p" + std::to_string(i);
    params[i].numel = 4;
    params[i].device = i == 1 ? "cpu" : "cuda:0";
  }
  try {
    planBuckets(params, reverseOrder(params.size()), 1 << 20, 1 << 20);
    ADD_FAILURE() << "a plan over two devices";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'p0' (cuda:0) and 'p1' (cpu) are on different devices"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  params[1].device = "cuda:0";
  EXPECT_EQ(planBuckets(params, reverseOrder(params.size()), 1 << 20, 1 << 20).buckets.size(), 1u);
}

// A sparse gradient (Embedding with sparse=true) is refused by name when its bucket is filled,
// on both paths (fp32 staged, bf16 direct), instead of failing inside reshape().
TEST(DataParallelInput, SparseGradientsAreRefusedByName) {
  for (TransferDtype transfer : {TransferDtype::kFloat32, TransferDtype::kBFloat16}) {
    SCOPED_TRACE(transferDtypeName(transfer));
    torch::nn::Sequential net(torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true)),
                              torch::nn::Linear(4, 2));
    DataParallelOptions o;
    o.codec.dtype = transfer;
    DataParallel dp(net.ptr(), std::make_shared<test::ImmediateTransport>(1), WorldInfo{}, o);
    dp.beforeForward();
    try {
      net->forward(at::tensor({1, 3, 5}, at::kLong)).sum().backward();
      dp.finishBackward();
      ADD_FAILURE() << "a sparse gradient was reduced";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the gradient of '0.weight' is sparse"), std::string::npos) << what;
    }
  }
}

TEST(BucketCodec, Fp32TravelsAsTheBucketDividedByWorldSize) {
  auto c = makeCodec({});
  EXPECT_EQ(c->wireType(), at::kFloat);
  EXPECT_FALSE(c->direct(at::Device(at::kCPU)));
  at::Tensor b = at::tensor({2.0f, -4.0f, 6.0f});
  c->encode(b, b, 2);
  EXPECT_TRUE(at::equal(b, at::tensor({1.0f, -2.0f, 3.0f})));
  EXPECT_TRUE(c->decode(b, b));
  EXPECT_TRUE(c->endStep(true));
  EXPECT_FALSE(c->shareScale(std::make_shared<GradScale>()));
}

// fp16: x scale / world on the way out, / scale on the way back; both paths give the same values.
TEST(BucketCodec, Fp16ScalesOutAndBackOnBothPaths) {
  CodecOptions o;
  o.dtype = TransferDtype::kFloat16;
  o.grad_scale = 256;
  auto c = makeCodec(o);
  EXPECT_EQ(c->wireType(), at::kHalf);
  EXPECT_TRUE(c->direct(at::Device(at::kCPU)));
  const at::Tensor g = at::tensor({0.5f, -0.25f, 1e-3f, 0.0f});
  at::Tensor staged = g.clone(), wire = at::empty({4}, at::kHalf);
  c->encode(staged, wire, 4);  // 256 / 4 = 64
  EXPECT_TRUE(at::equal(wire, (g * 64).to(at::kHalf)));
  at::Tensor direct_wire = at::empty({4}, at::kHalf);
  c->encodeInto(g, direct_wire, 4);
  EXPECT_TRUE(at::equal(direct_wire, wire));
  at::Tensor back = at::empty({4}), direct_back = at::empty({4});
  EXPECT_TRUE(c->decode(wire, back));
  EXPECT_TRUE(c->decodeInto(direct_wire, direct_back));
  EXPECT_TRUE(at::allclose(back, g / 4, 1e-3, 0));
  EXPECT_TRUE(at::equal(back, direct_back));
  wire[1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(c->decode(wire, back));
  EXPECT_FALSE(c->endStep(false));
  EXPECT_EQ(c->scale(), 128);
  EXPECT_EQ(c->skippedSteps(), 1);
}

// Sharing the loss scale: gradients arrive multiplied by it, so only / world goes out, and the
// shared scale is the one that moves.
TEST(BucketCodec, Fp16WithASharedScaleDoesNotScaleAgain) {
  CodecOptions o;
  o.dtype = TransferDtype::kFloat16;
  auto c = makeCodec(o);
  auto s = std::make_shared<GradScale>();  // 65536
  ASSERT_TRUE(c->shareScale(s));
  const at::Tensor scaled = at::tensor({0.01f, -0.02f}) * 65536;  // 655.36, -1310.72
  at::Tensor wire = at::empty({2}, at::kHalf);
  c->encodeInto(scaled, wire, 2);
  EXPECT_TRUE(at::equal(wire, (scaled / 2).to(at::kHalf)));
  at::Tensor back = at::empty({2});
  EXPECT_TRUE(c->decodeInto(wire, back));
  EXPECT_TRUE(at::allclose(back, at::tensor({0.005f, -0.01f}), 1e-3, 0));
  EXPECT_FALSE(c->endStep(false));
  EXPECT_EQ(s->value(), 32768);
  EXPECT_EQ(c->scale(), 32768);
  EXPECT_EQ(s->skippedSteps(), 1);
}

TEST(BucketCodec, Bf16HasNoScaleButStillChecks) {
  CodecOptions o;
  o.dtype = TransferDtype::kBFloat16;
  auto c = makeCodec(o);
  EXPECT_EQ(c->wireType(), at::kBFloat16);
  EXPECT_EQ(c->scale(), 1);
  EXPECT_FALSE(c->shareScale(std::make_shared<GradScale>()));
  at::Tensor wire = at::empty({2}, at::kBFloat16);
  c->encodeInto(at::tensor({3.0f, -1.0f}), wire, 2);
  EXPECT_TRUE(at::equal(wire, at::tensor({1.5f, -0.5f}).to(at::kBFloat16)));
  wire[0] = std::numeric_limits<float>::quiet_NaN();
  at::Tensor back = at::empty({2});
  EXPECT_FALSE(c->decodeInto(wire, back));
  EXPECT_FALSE(c->endStep(false));
  EXPECT_EQ(c->skippedSteps(), 1);
}

class DoneWork : public Work {
 public:
  void wait() override {}
};

// One rank, `k` channels: records each allreduce (channel, offset into the buffer it came from,
// elements) and reports whatever channel statistics the test sets.
class SplitRecordingTransport : public Transport {
 public:
  struct Call {
    int channel;
    int64_t offset, numel;
  };
  explicit SplitRecordingTransport(int k) : stats(static_cast<size_t>(k)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int channels() const override { return static_cast<int>(stats.size()); }
  ChannelStats channelStats(int c) const override { return stats[static_cast<size_t>(c)]; }
  std::string describe() const override { return "recording"; }
  void abort(const std::string&) override {}
  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp, int channel) override {
    const auto* p = static_cast<const char*>(t.data_ptr());
    if (p >= base && p < base + base_bytes) {
      calls.push_back({channel, (p - base) / 4, t.numel()});
    }
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> broadcast(at::Tensor, int, int) override { return std::make_shared<DoneWork>(); }
  std::shared_ptr<Work> allgather(at::Tensor, at::Tensor, int) override { return std::make_shared<DoneWork>(); }
  std::shared_ptr<Work> reduceScatter(at::Tensor, int) override { return std::make_shared<DoneWork>(); }
  std::shared_ptr<Work> allgatherShards(at::Tensor, int) override { return std::make_shared<DoneWork>(); }

  std::vector<ChannelStats> stats;
  std::vector<Call> calls;
  // Calls on this buffer's memory are recorded.
  void watch(const at::Tensor& t) {
    base = static_cast<const char*>(t.data_ptr());
    base_bytes = static_cast<int64_t>(t.nbytes());
  }
  const char* base = nullptr;
  int64_t base_bytes = 0;
};

TEST(StripedTransport, SplitsByWeightAndRebalancesToMeasuredSpeed) {
  auto rec = std::make_shared<SplitRecordingTransport>(2);
  StripingOptions o;
  o.min_split_bytes = 1024;
  StripedTransport st(rec, o);
  ASSERT_EQ(st.activeChannels(), 2);
  at::Tensor buf = at::zeros({1000});
  rec->watch(buf);
  st.allreduce(buf)->wait();
  ASSERT_EQ(rec->calls.size(), 2u);
  EXPECT_EQ(rec->calls[0].channel, 0);
  EXPECT_EQ(rec->calls[0].numel, 500);
  EXPECT_EQ(rec->calls[1].channel, 1);
  EXPECT_EQ(rec->calls[1].offset, 500);
  EXPECT_EQ(rec->calls[1].numel, 500);
  // Channel 0 moved 3 bytes per second for every 1 of channel 1: the weights move halfway
  // (balance_alpha 0.5) from 1/2 toward 3/4 and 1/4.
  rec->stats = {{300, 1}, {100, 1}};
  st.rebalance();
  EXPECT_NEAR(st.weights()[0], 0.625, 1e-12);
  EXPECT_NEAR(st.weights()[1], 0.375, 1e-12);
  rec->calls.clear();
  st.allreduce(buf)->wait();
  ASSERT_EQ(rec->calls.size(), 2u);
  EXPECT_EQ(rec->calls[0].numel, 625);
  EXPECT_EQ(rec->calls[1].offset, 625);
  EXPECT_EQ(rec->calls[1].numel, 375);
  // A channel that carried nothing since: no information, the weights stay.
  rec->stats[1] = {100, 2};
  st.rebalance();
  EXPECT_NEAR(st.weights()[0], 0.625, 1e-12);
}

TEST(StripedTransport, SmallBuffersGoWholeRoundRobinAndOneChannelTakesAll) {
  auto rec = std::make_shared<SplitRecordingTransport>(3);
  StripingOptions o;
  o.min_split_bytes = 1024;
  StripedTransport st(rec, o);
  at::Tensor small = at::zeros({10});  // 40 bytes
  rec->watch(small);
  for (int i = 0; i < 4; ++i) st.allreduce(small)->wait();
  ASSERT_EQ(rec->calls.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(rec->calls[static_cast<size_t>(i)].channel, i % 3);
    EXPECT_EQ(rec->calls[static_cast<size_t>(i)].numel, 10);
  }
  st.setActiveChannels(1);
  at::Tensor big = at::zeros({1000});
  rec->watch(big);
  rec->calls.clear();
  st.allreduce(big)->wait();
  ASSERT_EQ(rec->calls.size(), 1u);
  EXPECT_EQ(rec->calls[0].channel, 0);
  EXPECT_EQ(rec->calls[0].numel, 1000);
  st.setActiveChannels(7);  // more than there are: all of them
  EXPECT_EQ(st.activeChannels(), 3);
}

// OpTiming (NcclTransport's bookkeeping): an operation the test completes by hand.
struct FakeOp {
  bool done = false;
  double seconds = 0;
};
OpTiming::Op opOf(const std::shared_ptr<FakeOp>& f, double bytes) {
  return {bytes, [f] { return f->done; }, [f] { return f->seconds; }};
}

// One channel and nobody calling stats() (striping asks only with two or more channels): every
// submission retires what completed, so a long run keeps only what may still be running.
TEST(OpTiming, KeepsOnlyWhatMayStillRunWithoutStatsCalls) {
  OpTiming t;
  for (int i = 0; i < 10000; ++i) {
    auto op = std::make_shared<FakeOp>();
    t.submitted(opOf(op, 4));
    ASSERT_LE(t.inFlight(), 2u) << "operation " << i;
    op->done = true;
    op->seconds = 0.001;
  }
  const ChannelStats s = t.stats();
  EXPECT_EQ(s.bytes, 4 * 10000.0);
  EXPECT_NEAR(s.busy_s, 10.0, 1e-9);
  EXPECT_EQ(t.inFlight(), 0u);
}

// Bytes and busy time of the same operations: one still running counts in neither, so the rate
// is the completed operations' (counting its bytes at submission would double it here).
TEST(OpTiming, CountsBytesAndTimeOfTheSameCompletedOperations) {
  OpTiming t;
  auto a = std::make_shared<FakeOp>(), b = std::make_shared<FakeOp>();
  t.submitted(opOf(a, 1000));
  t.submitted(opOf(b, 1000));
  a->done = true;
  a->seconds = 1;
  ChannelStats s = t.stats();
  EXPECT_EQ(s.bytes, 1000);
  EXPECT_EQ(s.busy_s, 1);
  // In submission order: c still running holds back d, done, until c is done too.
  auto c = std::make_shared<FakeOp>(), d = std::make_shared<FakeOp>();
  t.submitted(opOf(c, 10));
  t.submitted(opOf(d, 20));
  d->done = true;
  d->seconds = 2;
  b->done = true;
  b->seconds = 3;
  s = t.stats();
  EXPECT_EQ(s.bytes, 2000);
  EXPECT_EQ(s.busy_s, 4);
  c->done = true;
  c->seconds = 5;
  s = t.stats();
  EXPECT_EQ(s.bytes, 2030);
  EXPECT_EQ(s.busy_s, 11);
}

// Operations that never complete (a device far behind, a hung one): at most max_in_flight are
// kept; the dropped ones count in neither bytes nor time.
TEST(OpTiming, BoundsOperationsThatNeverComplete) {
  OpTiming t(4);
  std::vector<std::shared_ptr<FakeOp>> ops;
  for (int i = 0; i < 10; ++i) {
    ops.push_back(std::make_shared<FakeOp>());
    t.submitted(opOf(ops.back(), 100));
  }
  EXPECT_EQ(t.inFlight(), 4u);
  EXPECT_EQ(t.dropped(), 6);
  for (auto& op : ops) {
    op->done = true;
    op->seconds = 1;
  }
  const ChannelStats s = t.stats();
  EXPECT_EQ(s.bytes, 400);
  EXPECT_EQ(s.busy_s, 4);
}

}  // namespace
}  // namespace aiacc::comm
