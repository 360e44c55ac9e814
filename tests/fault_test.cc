// A job with one faulty rank ends within one timeout, whatever is queued: DataParallel training
// on 3 rank-threads whose rank 1 fails or stalls at a chosen operation (comm/fault_transport.h)
// in the middle of a step with many buckets in flight on 2 channels. Every rank must fail with a
// CommError within --comm-timeout plus a few seconds of the fault (not one timeout per queued
// bucket: ~25 per step here). A rank that dies outright is a real process, killed:
// DeadRank.OthersExitWithinTheTimeout in launcher_test.cc.
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "comm/data_parallel.h"
#include "comm/fault_transport.h"
#include "tests/comm_test_util.h"

namespace aiacc::comm {
namespace {

using Clock = std::chrono::steady_clock;
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
  std::vector<Clock::time_point> failed_at(kWorld);
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
    o.bucket_mb = 1.0 / 1024;
    o.first_bucket_mb = 1.0 / 1024;
    o.channels = 2;
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
      failed_at[r] = Clock::now();
      throw;
    }
      },
      /*channels=*/2, kTimeout, /*ranks_per_node=*/0, shm);
  if (faulty) {
    out.rank1_ops = faulty->operations();
    for (int r = 0; r < kWorld; ++r) {
      if (faulty->struck() && failed_at[r] != Clock::time_point{}) {
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
#ifndef AIACC_WITH_GLOO
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
  const auto t0 = Clock::now();
  const Outcome o = train(f, c.shm);
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
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

}  // namespace
}  // namespace aiacc::comm
