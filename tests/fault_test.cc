// A job with one faulty rank ends within one timeout, whatever is queued: DataParallel training
// on 3 rank-threads whose rank 1 fails or stalls at a chosen operation (comm/fault_transport.h)
// in the middle of a step with many buckets in flight on 2 channels. Every rank must fail with a
// CommError within --comm-timeout plus a few seconds of the fault (not one timeout per queued
// bucket: ~25 per step here). A rank that dies outright is a real process, killed:
// DeadRank.OthersExitWithinTheTimeout in launcher_test.cc.
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/config.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/fault_transport.h"
#include "aiacc/comm/hierarchical.h"
#include "aiacc/comm/striped_transport.h"
#include "tests/comm_test_util.h"

namespace aiacc::comm {
namespace {

using Steady = std::chrono::steady_clock;
constexpr auto kTimeout = std::chrono::seconds(2);
constexpr int kWorld = 3;
constexpr int kSteps = 6;

// 12 layers of 64x64 with 1 KiB buckets: every weight and bias its own bucket (~24 per step).
std::shared_ptr<torch::nn::Module> deepNet() {
  torch::nn::Sequential s;
  for (int i = 0; i < 12; ++i) s->push_back(torch::nn::Linear(64, 64));
  return s.ptr();
}

struct Outcome {
  std::vector<std::string> errors;
  std::vector<double> seconds_after_fault;  // per rank: from the fault to its error
  int64_t rank1_ops = 0;                    // operations rank 1 submitted
};

// Trains kSteps steps; rank 1's transport carries `fault`.
Outcome train(FaultSpec fault, bool shm) {
  Outcome out;
  out.seconds_after_fault.assign(kWorld, -1);
  std::vector<Steady::time_point> failed_at(kWorld);
  std::shared_ptr<FaultTransport> faulty;
  std::mutex mu;
  out.errors = test::runRanks(
      kWorld,
      [&](int r, std::shared_ptr<Transport> t) {
    if (r == 1) {
      std::lock_guard<std::mutex> lock(mu);
      faulty = std::make_shared<FaultTransport>(t, fault);
      t = faulty;
    }
    WorldInfo w;
    w.rank = r;
    w.world = kWorld;
    auto net = deepNet();
    DataParallelOptions o;
    o.reducer.bucket_mb = 1.0 / 1024;
    o.reducer.first_bucket_mb = 1.0 / 1024;
    o.striping.channels = 2;
    try {
      DataParallel dp(net, t, w, o);
      auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(net.get());
      for (int step = 0; step < kSteps; ++step) {
        dp.beforeForward();
        const at::Tensor x = at::randn({4, 64}, at::detail::createCPUGenerator(100 * step + r), at::kFloat);
        seq->forward(x).pow(2).mean().backward();
        dp.finishBackward();
      }
    } catch (const CommError&) {
      failed_at[r] = Steady::now();
      throw;
    }
      },
      /*channels=*/2, kTimeout, /*ranks_per_node=*/0, shm);
  if (faulty) {
    out.rank1_ops = faulty->operations();
    for (int r = 0; r < kWorld; ++r) {
      if (faulty->struck() && failed_at[r] != Steady::time_point{}) {
        out.seconds_after_fault[r] = std::chrono::duration<double>(failed_at[r] - faulty->struckAt()).count();
      }
    }
  }
  return out;
}

struct FaultCase {
  const char* name;
  FaultSpec::Kind kind;
  bool shm;
};
const FaultCase kCases[] = {
    {"FailShm", FaultSpec::Kind::kFail, true},
    {"StallShm", FaultSpec::Kind::kStall, true},
    {"FailGloo", FaultSpec::Kind::kFail, false},
    {"StallGloo", FaultSpec::Kind::kStall, false},
};

class OneFaultyRank : public ::testing::TestWithParam<FaultCase> {};

TEST_P(OneFaultyRank, EveryRankFailsWithinOneTimeout) {
  const FaultCase& c = GetParam();
#if !AIACC_WITH_GLOO
  if (!c.shm) AIACC_SKIP_WITHOUT_GLOO();
#endif
  // A fault-free run gives the operation count: the fault hits the middle of step 4's buckets.
  const Outcome clean = train(FaultSpec{}, c.shm);
  test::expectNoErrors(clean.errors);
  const int64_t per_step = clean.rank1_ops / kSteps;  // setup operations make this an over-estimate
  ASSERT_GT(per_step, 20) << "buckets per step";
  FaultSpec f;
  f.kind = c.kind;
  f.at = clean.rank1_ops - 2 * per_step - per_step / 2;
  f.stall_limit = kTimeout;
  const auto t0 = Steady::now();
  const Outcome o = train(f, c.shm);
  const double total = std::chrono::duration<double>(Steady::now() - t0).count();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_FALSE(o.errors[r].empty()) << "rank " << r << " finished a job with a faulty rank";
    EXPECT_GE(o.seconds_after_fault[r], 0) << "rank " << r << ": " << o.errors[r];
    EXPECT_LT(o.seconds_after_fault[r], 2.0 + 5.0) << "rank " << r << ": " << o.errors[r];
  }
  EXPECT_NE(o.errors[1].find(c.kind == FaultSpec::Kind::kFail ? "injected failure of operation" : "stalled (injected)"),
            std::string::npos)
      << o.errors[1];
  EXPECT_LT(total, 20) << "one timeout per queued bucket would take ~" << per_step * 2 << " s";
}

INSTANTIATE_TEST_SUITE_P(Faults, OneFaultyRank, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<FaultCase>& i) { return std::string(i.param.name); });

// ---- Abort before waiting -----------------------------------------------------------------
// Passes everything through and logs, in order: "abort", and "wait N: ok" or "wait N: <error>"
// for operation N (counted from 0 over every channel) when its wait() returns.
class LoggingTransport : public Transport {
 public:
  explicit LoggingTransport(std::shared_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int channels() const override { return inner_->channels(); }
  ChannelStats channelStats(int c) const override { return inner_->channelStats(c); }
  std::string describe() const override { return inner_->describe(); }
  void abort(const std::string& why) override {
    add("abort");
    inner_->abort(why);
  }
  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int c) override {
    return logged(inner_->allreduce(t, op, c));
  }
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int c) override {
    return logged(inner_->broadcast(t, root, c));
  }
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int c) override {
    return logged(inner_->allgather(in, out, c));
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int c) override { return logged(inner_->reduceScatter(t, c)); }
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int c) override { return logged(inner_->allgatherShards(t, c)); }

  void add(const std::string& event) {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back(event);
  }
  std::vector<std::string> log() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  int64_t submitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }

 private:
  // (failure() is not forwarded: like NCCL's, these works tell a failure only when waited for,
  // so the tests below cover the path where finishBackward() meets it.)
  class LoggedWork : public Work {
   public:
    LoggedWork(LoggingTransport* t, std::shared_ptr<Work> w, int64_t n) : t_(t), w_(std::move(w)), n_(n) {}
    void wait() override {
      try {
        w_->wait();
      } catch (const std::exception& e) {
        t_->add(strCat("wait ", n_, ": ", e.what()));
        throw;
      }
      t_->add(strCat("wait ", n_, ": ok"));
    }

   private:
    LoggingTransport* t_;  // the tests keep the transport alive longer than every work
    std::shared_ptr<Work> w_;
    int64_t n_;
  };
  std::shared_ptr<Work> logged(std::shared_ptr<Work> w) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::make_shared<LoggedWork>(this, std::move(w), n_++);
  }
  std::shared_ptr<Transport> inner_;
  mutable std::mutex mu_;
  std::vector<std::string> log_;
  int64_t n_ = 0;
};

// Operation `fail_at` fails at once; every later one stalls (as on a channel whose peer hangs)
// until abort() or `stall_limit`, whichever comes first.
std::shared_ptr<LoggingTransport> failThenStall(int channels, int64_t fail_at, std::chrono::milliseconds stall_limit) {
  FaultSpec fail{FaultSpec::Kind::kFail, fail_at, stall_limit};
  FaultSpec stall{FaultSpec::Kind::kStall, fail_at + 1, stall_limit};
  auto failing = std::make_shared<FaultTransport>(std::make_shared<test::ImmediateTransport>(channels), fail);
  return std::make_shared<LoggingTransport>(std::make_shared<FaultTransport>(failing, stall));
}

// The events after the first "wait N: <error>": the transports must be aborted before any other
// wait returns, and every wait that returns then must have been ended by the abort, not by the
// stall limit (one timeout more, on every rank, than the failure already took).
void expectAbortBeforeTheOtherWaits(const std::vector<std::string>& log, int64_t failed) {
  const std::string first = strCat("wait ", failed, ": injected failure");
  size_t i = 0;
  while (i < log.size() && log[i].rfind(first, 0) != 0) ++i;
  ASSERT_LT(i, log.size()) << "the failing operation was never waited for";
  ASSERT_LT(i + 1, log.size()) << "nothing after the failure";
  EXPECT_EQ(log[i + 1], "abort") << "the next event after the failure";
  int waits = 0;
  for (size_t j = i + 1; j < log.size(); ++j) {
    if (log[j].rfind("wait ", 0) != 0) continue;
    ++waits;
    EXPECT_NE(log[j].find("aborted after an earlier failure: injected failure"), std::string::npos) << log[j];
    EXPECT_EQ(log[j].find("the stall limit passed"), std::string::npos) << log[j];
  }
  EXPECT_GT(waits, 0) << "the stalled operations were never waited for";
}

constexpr auto kLongStall = std::chrono::seconds(3);  // what a missing abort costs each test

// A failed bucket and a stalled one on the other channel: finishBackward() aborts the transport,
// waits for the rest (ended by the abort), and throws the failure; destroying DataParallel then
// waits for nothing.
// In each transfer dtype: fp16 and bf16 buckets go through the codec (cast, scale, finiteness
// check) after their waits, fp32 ones straight back into the gradients.
class AbortBeforeWaitCodec : public ::testing::TestWithParam<TransferDtype> {};

TEST_P(AbortBeforeWaitCodec, DataParallelAbortsWhenABucketFails) {
  auto net = [] {
    torch::nn::Sequential s(torch::nn::Linear(16, 16), torch::nn::Linear(16, 4));
    return s.ptr();
  };
  DataParallelOptions o;
  o.reducer.bucket_mb = 1.0 / (1 << 20);  // every parameter its own bucket: 4 buckets over 2 channels
  o.reducer.first_bucket_mb = 1.0 / (1 << 20);
  o.striping.channels = 2;
  o.codec.dtype = GetParam();
  o.finish_in_backward = false;  // finishBackward() called after backward, as aiacc_train does
  // The operations of construction come first; the step's first bucket is the one after them.
  int64_t setup_ops = 0;
  {
    auto clean = std::make_shared<LoggingTransport>(std::make_shared<test::ImmediateTransport>(2));
    DataParallel dp(net(), clean, WorldInfo{}, o);
    setup_ops = clean->submitted();
  }
  auto t = failThenStall(2, setup_ops, kLongStall);
  auto model = net();
  std::string error;
  {
    DataParallel dp(model, t, WorldInfo{}, o);
    ASSERT_EQ(dp.plan().buckets.size(), 4u);
    dp.beforeForward();
    auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(model.get());
    seq->forward(at::randn({2, 16})).sum().backward();
    try {
      dp.finishBackward();
    } catch (const CommError& e) {
      error = e.what();
    }
    t->add("finishBackward returned");
  }
  EXPECT_NE(error.find("injected failure"), std::string::npos) << error;
  const std::vector<std::string> log = t->log();
  expectAbortBeforeTheOtherWaits(log, setup_ops);
  const auto returned = std::find(log.begin(), log.end(), "finishBackward returned");
  ASSERT_NE(returned, log.end());
  for (auto it = returned; it != log.end(); ++it) {
    EXPECT_EQ(it->rfind("wait ", 0), std::string::npos) << "a wait after finishBackward() threw: " << *it;
  }
  for (int64_t n = setup_ops; n < setup_ops + 4; ++n) {  // each bucket waited for once, in finishBackward()
    const std::string prefix = strCat("wait ", n, ": ");
    EXPECT_EQ(std::count_if(log.begin(), returned, [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }), 1)
        << prefix;
  }
}

INSTANTIATE_TEST_SUITE_P(Transfers, AbortBeforeWaitCodec,
                         ::testing::Values(TransferDtype::kFloat32, TransferDtype::kFloat16, TransferDtype::kBFloat16),
                         [](const ::testing::TestParamInfo<TransferDtype>& i) {
  return std::string(transferDtypeName(i.param));
});

// A bucket that failed while backward goes on (as when a peer dies) ends backward at the next
// gradient hook: backward() raises that failure, after the transport was aborted; no later bucket
// is launched, and the layers backward had not reached get no gradient (the step is lost on
// every rank anyway). A transport whose works cannot tell a failure without being waited for
// (LoggingTransport's, like NCCL's) keeps the other path: finishBackward() raises it
// (AbortBeforeWaitCodec above).
TEST(AbortInBackward, AFailedBucketEndsBackwardAtTheNextGradient) {
  auto net = [] {
    torch::nn::Sequential s;
    for (int i = 0; i < 4; ++i) s->push_back(torch::nn::Linear(16, 16));
    return s;
  };
  DataParallelOptions o;
  o.reducer.bucket_mb = 1.0 / (1 << 20);  // every parameter its own bucket: 8
  o.reducer.first_bucket_mb = 1.0 / (1 << 20);
  int64_t setup_ops = 0;
  {
    auto counting = std::make_shared<FaultTransport>(std::make_shared<test::ImmediateTransport>(1), FaultSpec{});
    DataParallel dp(net().ptr(), counting, WorldInfo{}, o);
    setup_ops = counting->operations();
  }
  torch::nn::Sequential model = net();
  auto faulty = std::make_shared<FaultTransport>(std::make_shared<test::ImmediateTransport>(1),
                                                 FaultSpec{FaultSpec::Kind::kFail, setup_ops});
  std::string error;
  {
    DataParallel dp(model.ptr(), faulty, WorldInfo{}, o);
    ASSERT_EQ(dp.plan().buckets.size(), 8u);
    dp.beforeForward();
    try {
      model->forward(at::randn({2, 16})).sum().backward();
    } catch (const CommError& e) {
      error = e.what();
    }
  }
  EXPECT_NE(error.find("injected failure of operation"), std::string::npos) << "backward() raised: '" << error << "'";
  EXPECT_EQ(faulty->operations(), setup_ops + 1) << "buckets launched after the first one failed";
  auto* last = model[3]->as<torch::nn::Linear>();
  auto* first = model[0]->as<torch::nn::Linear>();
  EXPECT_TRUE(last->bias.grad().defined()) << "the first gradient of backward";
  EXPECT_FALSE(first->weight.grad().defined()) << "backward went on to the first layer";
  try {  // aborted: a later operation fails with the reason
    faulty->allreduce(at::zeros({1}), ReduceOp::kSum, 0)->wait();
    ADD_FAILURE() << "the transport was not aborted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("aborted after an earlier failure: injected failure"), std::string::npos)
        << e.what();
  }
}

// A bucket split over two channels has failed, without waiting, once any piece has.
TEST(AbortInBackward, AStripedBucketHasFailedWhenAPieceHas) {
  auto faulty = std::make_shared<FaultTransport>(std::make_shared<test::ImmediateTransport>(2),
                                                 FaultSpec{FaultSpec::Kind::kFail, 1});
  StripingOptions so;
  so.min_split_bytes = 64;
  StripedTransport st(faulty, so);
  at::Tensor buf = at::zeros({1000});
  const std::shared_ptr<Work> w = st.allreduce(buf);
  EXPECT_EQ(faulty->operations(), 2) << "pieces";
  const Failure f = w->failure();
  ASSERT_TRUE(f);
  EXPECT_NE(f.what().find("injected failure of operation 1"), std::string::npos) << f.what();
}

// A bucket split across two channels: one piece fails, the other stalls. Its Work aborts the
// transport before waiting for the stalled piece.
TEST(AbortBeforeWait, StripedPiecesAbortWhenOneFails) {
  auto t = failThenStall(2, 0, kLongStall);
  StripingOptions so;
  so.min_split_bytes = 64;
  StripedTransport st(t, so);
  at::Tensor buf = at::zeros({1000});
  EXPECT_THROW(st.allreduce(buf)->wait(), CommError);
  expectAbortBeforeTheOtherWaits(t->log(), 0);
}

// Two-level reduction over a node of 2 ranks (3 stages: reduce-scatter inside the node, the
// shard's allreduce between nodes, allgather inside the node), for each stage: operation A fails
// there and everything submitted after that failure, on either level, stalls (as behind a peer
// that hangs). Operation B, queued behind A, must end at once by the abort, not at the stall
// limit, and the stalled level must have been aborted before anything else was waited for.
struct StageCase {
  const char* name;
  int stage;  // 1, 2 or 3: where A fails
};
class TwoLevelAbort : public ::testing::TestWithParam<StageCase> {};

TEST_P(TwoLevelAbort, EveryStageAbortsBothLevelsWhenItFails) {
  const int stage = GetParam().stage;
  // Operations counted on each level. Intra: A's reduce-scatter (0), A's allgather (1) unless A
  // failed before it, then B's reduce-scatter. Inter: A's shard (0) unless A failed in stage 1,
  // then B's. B is submitted once A's operations up to its failing one were.
  const bool fail_intra = stage != 2;
  const int64_t fail_at = stage == 3 ? 1 : 0;
  const int64_t a_intra = stage == 3 ? 2 : 1, a_inter = stage == 1 ? 0 : 1;
  auto level = [&](bool intra) {
    std::shared_ptr<Transport> t = std::make_shared<test::ImmediateTransport>(intra ? 2 : 1, intra ? 2 : 1);
    if (intra == fail_intra)
      t = std::make_shared<FaultTransport>(t, FaultSpec{FaultSpec::Kind::kFail, fail_at, kLongStall});
    // B's operations, on both levels, stall.
    return std::make_shared<LoggingTransport>(
        std::make_shared<FaultTransport>(t, FaultSpec{FaultSpec::Kind::kStall, intra ? a_intra : a_inter, kLongStall}));
  };
  auto intra = level(true), inter = level(false);
  HierarchicalTransport h(intra, inter);
  at::Tensor a = at::zeros({1 << 14}), b = at::zeros({1 << 14});  // 32 KiB shards: the three-stage path
  auto wa = h.allreduce(a, ReduceOp::kSum, 0);
  for (int i = 0; i < 2000 && (intra->submitted() < a_intra || inter->submitted() < a_inter); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto wb = h.allreduce(b, ReduceOp::kSum, 0);
  EXPECT_THROW(wa->wait(), CommError);
  std::string error;
  try {
    wb->wait();
  } catch (const CommError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("aborted after an earlier failure: injected failure"), std::string::npos) << error;
  EXPECT_EQ(error.find("the stall limit passed"), std::string::npos) << "B waited for the stall limit: " << error;
  for (const auto& t : {intra, inter}) {
    const std::vector<std::string> log = t->log();
    const auto abort = std::find(log.begin(), log.end(), "abort");
    ASSERT_NE(abort, log.end()) << (t == intra ? "intra" : "inter") << " was never aborted";
    for (auto it = abort; it != log.end(); ++it) {
      EXPECT_EQ(it->find("the stall limit passed"), std::string::npos) << *it;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, TwoLevelAbort,
                         ::testing::Values(StageCase{"ReduceScatterInside", 1}, StageCase{"AllreduceBetween", 2},
                                           StageCase{"AllgatherInside", 3}),
                         [](const ::testing::TestParamInfo<StageCase>& i) { return std::string(i.param.name); });

// ---- Errors of a device-ordered transport reach the host where it blocks --------------------
// Like NCCL: wait() returns at once (it would only order the streams), and a failure of the
// operation is seen only by a host-blocking synchronize() (or the next operation).
class DeviceOrderedTransport : public test::ImmediateTransport {
 public:
  DeviceOrderedTransport() : test::ImmediateTransport(1) {}
  bool waitsOnDevice() const override { return true; }
  // From now on every allreduce fails on the "device".
  void failAllreduces() { fail_ = true; }
  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int c) override {
    if (!fail_) return test::ImmediateTransport::allreduce(t, op, c);
    ++failed_;
    return std::make_shared<FailsOnTheDevice>();
  }
  void synchronize() override {
    if (failed_ > 0) throw CommError("an allreduce failed on the device");
  }

 private:
  class FailsOnTheDevice : public Work {
   public:
    void wait() override {}  // ordered; nothing known yet
    void synchronize() override { throw CommError("an allreduce failed on the device"); }
  };
  bool fail_ = false;
  int failed_ = 0;
};

// bf16 transfer: the host reads the reduced wire (its finiteness check) in finishBackward(), so
// finishBackward() blocks for it and raises there. fp32 on a device-ordered transport: the host
// reads nothing in finishBackward(), and synchronize() (the trainer's, before it reads the
// step's results) raises.
TEST(DeviceOrderedErrors, RaiseWhereTheHostBlocks) {
  for (TransferDtype transfer : {TransferDtype::kBFloat16, TransferDtype::kFloat32}) {
    SCOPED_TRACE(transferDtypeName(transfer));
    auto t = std::make_shared<DeviceOrderedTransport>();
    torch::nn::Linear net(8, 2);
    DataParallelOptions o;
    o.codec.dtype = transfer;
    o.finish_in_backward = false;  // finishBackward() called after backward, as aiacc_train does
    DataParallel dp(net.ptr(), t, WorldInfo{}, o);
    t->failAllreduces();
    dp.beforeForward();
    net->forward(at::randn({2, 8})).sum().backward();
    if (transfer == TransferDtype::kBFloat16) {
      EXPECT_THROW(dp.finishBackward(), CommError);
    } else {
      EXPECT_TRUE(dp.finishBackward());
      EXPECT_THROW(dp.synchronize(), CommError);
    }
  }
}

}  // namespace
}  // namespace aiacc::comm
