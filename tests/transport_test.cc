// comm/ transports: Gloo, shared memory, two-level, the factory, fp16/bf16 conversion (the
// store: tests/store_test.cc). Ranks are threads sharing one in-memory store (real Gloo over TCP on loopback).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/optim/sgd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include "aiacc/config.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/factory.h"
#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/hierarchical.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/half.h"
#include "aiacc/comm/nccl_env.h"
#include "aiacc/comm/store.h"
#include "aiacc/comm/throttled_transport.h"
#include "tests/comm_test_util.h"

namespace aiacc::comm {
namespace {

using test::expectNoErrors;
using test::glooOptions;
using test::runRanks;
using test::runThreads;

TEST(Gloo, CollectivesMatchClosedForm) {
  const int W = 3;
  expectNoErrors(runRanks(
      W,
      [&](int r, std::shared_ptr<Transport> t) {
    // allreduce: sum over ranks of (r+1) * (i+1) = 6 * (i+1), on both channels at once.
    at::Tensor a = at::arange(1, 1001, at::kFloat) * (r + 1);
    at::Tensor b = at::full({17}, static_cast<double>(r), at::kDouble);
    auto wa = t->allreduce(a, ReduceOp::kSum, 0);
    auto wb = t->allreduce(b, ReduceOp::kSum, 1);
    wa->wait();
    wb->wait();
    ASSERT_TRUE(a.equal(at::arange(1, 1001, at::kFloat) * 6));
    ASSERT_TRUE(b.equal(at::full({17}, 3.0, at::kDouble)));
    // bitwise or of one-hot masks.
    at::Tensor m = at::zeros({4}, at::kByte);
    m[r] = 1 << r;
    t->allreduce(m, ReduceOp::kBitwiseOr, 0)->wait();
    ASSERT_EQ(m.sum().item<int64_t>(), 1 + 2 + 4);
    // broadcast from rank 2.
    at::Tensor c = at::full({5}, static_cast<double>(r), at::kFloat);
    t->broadcast(c, 2, 0)->wait();
    ASSERT_TRUE(c.equal(at::full({5}, 2.0, at::kFloat)));
    // allgather in rank order.
    at::Tensor in = at::full({2}, static_cast<int64_t>(10 * r), at::kLong), out = at::empty({2 * W}, at::kLong);
    t->allgather(in, out, 1)->wait();
    ASSERT_TRUE(out.equal(at::tensor({0, 0, 10, 10, 20, 20}, at::kLong)));
    // reduce-scatter over uneven shards (10 = 4 + 3 + 3): each rank holds its shard of the sum.
    at::Tensor rs = at::arange(0, 10, at::kFloat) * (r + 1);
    t->reduceScatter(rs, 0)->wait();
    const Shard sh = shardOf(10, W, r);
    ASSERT_EQ(sh.count, r == 0 ? 4 : 3);
    ASSERT_TRUE(rs.narrow(0, sh.offset, sh.count).equal(at::arange(sh.offset, sh.offset + sh.count, at::kFloat) * 6));
    // allgather of shards, in place: rank r fills its shard with r.
    at::Tensor ag = at::full({11}, -1.0, at::kDouble);
    const Shard mine = shardOf(11, W, r);
    ag.narrow(0, mine.offset, mine.count).fill_(r);
    t->allgatherShards(ag, 1)->wait();
    ASSERT_TRUE(ag.equal(at::tensor({0., 0., 0., 0., 1., 1., 1., 1., 2., 2., 2.}, at::kDouble)));
      },
      /*channels=*/2));
}

// Shared-memory collectives give Gloo's results: bit for bit for sums of integer-valued data and
// for data movement, any size (many rounds of 4 KiB slots, empty shards), dtype and channel.
TEST(Shm, CollectivesMatchGloo) {
  AIACC_SKIP_WITHOUT_GLOO();
#if AIACC_WITH_GLOO
  for (int W : {2, 3}) {
    auto store = makeHashStore();
    const std::vector<std::string> errors = runThreads(W, [&](int r) {
      GlooTransport gloo(store, glooOptions(r, W, 2));
      ShmOptions so;
      so.rank = r;
      so.world = W;
      so.channels = 2;
      so.chunk_bytes = 4096;
      ShmTransport shm(store, so);
      auto gen = at::detail::createCPUGenerator(200 + r);
      std::vector<std::shared_ptr<Work>> works;
      std::vector<at::Tensor> a, b;
      for (int64_t n : {1, 2, 5, 1000, 10007}) {
        a.push_back(at::randint(-1000, 1000, {n}, gen, at::kFloat));
        a.push_back(at::randint(-8, 8, {n}, gen, at::kHalf));
        a.push_back(at::randint(-100, 100, {n}, gen, at::kLong));
      }
      for (size_t i = 0; i < a.size(); ++i) {
        b.push_back(a[i].clone());
        works.push_back(shm.allreduce(a[i], ReduceOp::kSum, static_cast<int>(i % 2)));
        gloo.allreduce(b[i], ReduceOp::kSum, 0)->wait();
      }
      for (auto& w : works) w->wait();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(a[i].equal(b[i])) << "tensor " << i;
      // reduce-scatter: this rank's shard holds the sum.
      at::Tensor rs = at::arange(0, 10001, at::kFloat) * (r + 1),
                 want = at::arange(0, 10001, at::kFloat) * (W * (W + 1) / 2);
      shm.reduceScatter(rs, 1)->wait();
      const Shard sh = shardOf(10001, W, r);
      ASSERT_TRUE(rs.narrow(0, sh.offset, sh.count).equal(want.narrow(0, sh.offset, sh.count)));
      // allgather of shards, broadcast, allgather, bitwise or.
      at::Tensor ag = at::full({3001}, -1.0, at::kDouble);
      for (int q = 0; q < W; ++q) {
        if (q == r) ag.narrow(0, shardOf(3001, W, q).offset, shardOf(3001, W, q).count).fill_(q);
      }
      shm.allgatherShards(ag, 0)->wait();
      for (int q = 0; q < W; ++q) {
        const Shard s = shardOf(3001, W, q);
        ASSERT_TRUE(ag.narrow(0, s.offset, s.count).eq(q).all().item<bool>()) << "shard " << q;
      }
      at::Tensor c = at::full({3000}, static_cast<double>(r), at::kFloat);
      shm.broadcast(c, W - 1, 1)->wait();
      ASSERT_TRUE(c.eq(W - 1).all().item<bool>());
      at::Tensor in = at::full({1500}, static_cast<int64_t>(r), at::kLong), out = at::empty({1500 * W}, at::kLong);
      shm.allgather(in, out, 0)->wait();
      ASSERT_TRUE(out.equal(at::arange(0, W, at::kLong).repeat_interleave(1500)));
      at::Tensor m = at::zeros({W}, at::kByte);
      m[r] = 1;
      shm.allreduce(m, ReduceOp::kBitwiseOr, 1)->wait();
      ASSERT_EQ(m.sum().item<int64_t>(), W);
    });
    expectNoErrors(errors);
  }
#endif
}

// A peer that arrives late at every barrier (its waiters have gone to sleep on its futex by
// then) still gives exact sums: the sleeping side is woken, round after round.
TEST(Shm, LatePeerWakesSleepingWaiters) {
  const int W = 3;
  auto store = makeHashStore();
  const std::vector<std::string> errors = runThreads(W, [&](int r) {
    ShmOptions so;
    so.rank = r;
    so.world = W;
    so.chunk_bytes = 4096;  // 2500 floats: several rounds, so several barriers per operation
    so.timeout = std::chrono::seconds(30);
    ShmTransport shm(store, so);
    for (int i = 0; i < 5; ++i) {
      if (r == i % W) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      at::Tensor t = at::full({2500}, static_cast<float>(r + i), at::kFloat);
      shm.allreduce(t, ReduceOp::kSum, 0)->wait();
      const float want = static_cast<float>(W * (W - 1) / 2 + W * i);
      ASSERT_TRUE(t.eq(want).all().item<bool>()) << "operation " << i;
    }
  });
  expectNoErrors(errors);
}

// Segments of a start that failed (rank 1 of 3 never comes) are unlinked: /dev/shm holds none
// of this test's names afterwards, on the rank that waited nor on the one that came.
TEST(Shm, FailedStartLeavesNoSegment) {
  const std::string tag = "leaktest" + std::to_string(::getpid());
  auto ours = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      n += e.path().filename().string().find(tag) != std::string::npos;
    }
    return n;
  };
  auto store = makeHashStore();
  const std::vector<std::string> errors = runThreads(3, [&](int r) {
    if (r == 1) return;
    ShmOptions so;
    so.rank = r;
    so.world = 3;
    so.channels = 2;
    so.name = tag;
    so.timeout = std::chrono::milliseconds(500);
    ShmTransport shm(store, so);
  });
  EXPECT_NE(errors[0].find("(1 of 3 missing)"), std::string::npos) << errors[0];
  EXPECT_NE(errors[2].find("(1 of 3 missing)"), std::string::npos) << errors[2];
  EXPECT_EQ(ours(), 0);
}

// The one factory picks: shared memory on one host, Gloo between hosts, two-level between nodes
// with several ranks each (or as the tuner's alternative), and refuses GPU ranks without NCCL.
// Errors are sticky per channel: when a peer stalls (alive, connected, taking part in nothing
// more), the first operation it misses fails within the timeout and every operation queued
// behind it fails at once with that first error (not one timeout each); wait() raises it every
// time; abort() fails the rest at once.
TEST(Transport, FirstFailureFailsEverythingQueuedAtOnce) {
  const auto timeout = std::chrono::seconds(2);
  std::vector<std::string> first(2), later(2);
  double elapsed = 0;
  std::atomic<bool> rank0_done{false};
  const auto errors = runRanks(
      2,
      [&](int r, std::shared_ptr<Transport> t) {
    at::Tensor x = at::ones({64});
    for (int i = 0; i < 2; ++i) t->allreduce(x, ReduceOp::kSum, 0)->wait();  // both ranks: fine
    if (r == 1) {  // stalls, its transport open, until rank 0 has seen everything fail
      for (int i = 0; i < 600 && !rank0_done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<Work>> works;
    std::vector<at::Tensor> keep;
    for (int i = 0; i < 8; ++i) {
      keep.push_back(at::ones({64}));
      works.push_back(t->allreduce(keep.back(), ReduceOp::kSum, 0));
    }
    for (size_t i = 0; i < works.size(); ++i) {
      try {
        works[i]->wait();
        ADD_FAILURE() << "operation " << i << " succeeded without its peer";
      } catch (const CommError& e) {
        (i == 0 ? first[0] : later[0]) = e.what();
        if (i > 0) {
          EXPECT_EQ(std::string(e.what()), first[0]) << "operation " << i << " has its own error";
        }
      }
    }
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_THROW(works[3]->wait(), CommError) << "a second wait() after an error is not a success";
    EXPECT_THROW(t->allreduce(x, ReduceOp::kSum, 0)->wait(), CommError) << "a later operation fails too";
    rank0_done = true;
      },
      /*channels=*/1, timeout);
  expectNoErrors(errors);
  EXPECT_NE(first[0], "");
  EXPECT_GE(elapsed, 1.5) << "the first missed operation waits out its timeout (the peer is alive): " << first[0];
  EXPECT_LT(elapsed, 2.0 * 3) << "8 queued operations took about one timeout, not eight";
}

TEST(Transport, AbortFailsQueuedAndLaterOperationsAtOnce) {
  const auto errors = runRanks(
      2,
      [&](int r, std::shared_ptr<Transport> t) {
    at::Tensor x = at::ones({16});
    t->allreduce(x, ReduceOp::kSum, 0)->wait();
    t->abort(strCat("rank ", r, " gives up: test"));
    try {
      t->allreduce(x, ReduceOp::kSum, 0)->wait();
      ADD_FAILURE() << "an operation after abort() succeeded";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("gives up: test"), std::string::npos) << e.what();
    }
      },
      /*channels=*/2, std::chrono::seconds(5));
  expectNoErrors(errors);
}

TEST(Factory, PicksTheTransportForTheLayout) {
  struct Case {
    int world, local_size;
    TwoLevelMode hierarchical;
    bool tune, shm;
    std::string primary, alternative;
  };
  const std::vector<Case> cases = {
      {2, 2, TwoLevelMode::kAuto, true, true, "shm, 2 ranks", ""},
      {2, 1, TwoLevelMode::kAuto, true, true, "gloo, 2 ranks", ""},
      {2, 2, TwoLevelMode::kAuto, true, false, "gloo, 2 ranks", ""},
      {4, 2, TwoLevelMode::kAuto, false, true, "two-level, 2 nodes x 2 ranks (intra: shm", ""},
      {4, 2, TwoLevelMode::kAuto, true, true, "gloo, 4 ranks", "two-level, 2 nodes x 2 ranks"},
      {4, 2, TwoLevelMode::kOff, true, true, "gloo, 4 ranks", ""},
  };
  for (const Case& c : cases) {
    auto store = makeHashStore();
    std::vector<std::string> primary(c.world), alternative(c.world), errors(c.world);
    // Held until every rank is done: a rank that tore its transports down at once would close
    // connections a slower peer is still completing.
    std::vector<Transports> held(c.world);
    std::vector<std::thread> threads;
    for (int r = 0; r < c.world; ++r) {
      threads.emplace_back([&, r] {
        try {
          TransportSpec spec;
          spec.world = WorldInfo{r, c.world, r % c.local_size, c.local_size};
          spec.hierarchical = c.hierarchical;
          spec.tune_two_level = c.tune;
          spec.shm = c.shm;
          spec.timeout = std::chrono::seconds(30);
          held[r] = makeTransports(store, spec);
          primary[r] = held[r].primary->describe();
          alternative[r] = held[r].alternative ? held[r].alternative->describe() : "";
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
#if !AIACC_WITH_GLOO
    // Without Gloo, every layout but one host on shared memory is refused, saying why.
    if (c.primary.rfind("shm", 0) != 0) {
      for (int r = 0; r < c.world; ++r) EXPECT_NE(errors[r].find("GlooTransport"), std::string::npos) << errors[r];
      continue;
    }
#endif
    expectNoErrors(errors);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_EQ(primary[r].rfind(c.primary, 0), 0u) << primary[r];
      EXPECT_EQ(alternative[r].rfind(c.alternative, 0), 0u) << alternative[r];
    }
  }
  TransportSpec gpu;
  gpu.gpu = true;
#if !AIACC_WITH_NCCL
  EXPECT_THROW(makeTransports(makeHashStore(), gpu), InputError);
#endif
}

struct Layout {
  int nodes, per_node;
};

class TwoLevel : public ::testing::TestWithParam<Layout> {};

// Two-level reduction gives what the flat ring gives: exactly for integer-valued data, within
// rounding otherwise; for every size (empty shards, remainders), dtype and collective. Several
// operations are in flight at once on two channels, so the stages of one overlap the next's.
TEST_P(TwoLevel, MatchesFlatAllreduce) {
  AIACC_SKIP_WITHOUT_GLOO();
#if AIACC_WITH_GLOO
  const int N = GetParam().nodes, R = GetParam().per_node, W = N * R;
  auto store = makeHashStore();
  const std::vector<std::string> errors = runThreads(W, [&](int r) {
    GlooOptions o = glooOptions(r, W, 2);
    o.name = "flat";
    GlooTransport flat(store, o);
    o.name = "two-level";
    auto h = makeGlooHierarchical(store, o, R, /*min_shard_bytes=*/1);
    ASSERT_EQ(h->rank(), r);
    ASSERT_EQ(h->size(), W);
    auto gen = at::detail::createCPUGenerator(100 + r);
    std::vector<at::Tensor> a, b;
    std::vector<std::shared_ptr<Work>> works;
    for (int64_t n : {1, 3, 7, 1000, 10007}) {  // sizes below, at and far above the ranks per node
      a.push_back(at::randint(-1000, 1000, {n}, gen, at::kFloat));
      a.push_back(at::randint(-8, 8, {n}, gen, at::kHalf));
      a.push_back(at::randn({n}, gen, at::kDouble));
    }
    for (size_t i = 0; i < a.size(); ++i) {
      b.push_back(a[i].clone());
      works.push_back(h->allreduce(a[i], ReduceOp::kSum, static_cast<int>(i % 2)));
      flat.allreduce(b[i], ReduceOp::kSum, static_cast<int>(i % 2))->wait();
    }
    for (auto& w : works) w->wait();
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].scalar_type() == at::kDouble) {
        ASSERT_TRUE(at::allclose(a[i], b[i], 1e-12, 1e-12)) << "tensor " << i;
      } else {
        ASSERT_TRUE(a[i].equal(b[i])) << "tensor " << i << " (" << a[i].scalar_type() << ", " << a[i].numel() << ")";
      }
    }
    // bitwise or of one-hot masks (two-stage path).
    at::Tensor m = at::zeros({W}, at::kByte);
    m[r] = 1;
    h->allreduce(m, ReduceOp::kBitwiseOr, 1)->wait();
    ASSERT_EQ(m.sum().item<int64_t>(), W);
    // broadcast from the last rank; allgather in rank order.
    at::Tensor c = at::full({9}, static_cast<double>(r), at::kFloat);
    h->broadcast(c, W - 1, 0)->wait();
    ASSERT_TRUE(c.equal(at::full({9}, static_cast<double>(W - 1), at::kFloat)));
    at::Tensor in = at::full({2}, static_cast<int64_t>(r), at::kLong), out = at::empty({2 * W}, at::kLong);
    h->allgather(in, out, 1)->wait();
    ASSERT_TRUE(out.equal(at::arange(0, W, at::kLong).repeat_interleave(2)));
  });
  expectNoErrors(errors);
#endif
}

INSTANTIATE_TEST_SUITE_P(Layouts, TwoLevel, ::testing::Values(Layout{1, 4}, Layout{2, 2}, Layout{4, 1}, Layout{3, 2}),
                         [](const auto& info) {
  return std::to_string(info.param.nodes) + "x" + std::to_string(info.param.per_node);
});

// A small convolutional net without BatchNorm: per-rank batch statistics would make the

TEST(Half, ConversionAndSumMatchScalarReference) {
  const at::Tensor x = at::randn({1003}, at::detail::createCPUGenerator(2), at::kFloat) * 100;
  at::Tensor h = at::empty({1003}, at::kHalf), back = at::empty({1003}, at::kFloat);
  floatToHalf(x.data_ptr<float>(), reinterpret_cast<uint16_t*>(h.data_ptr<at::Half>()), 1003, 0.5f);
  EXPECT_TRUE(h.equal((x * 0.5f).to(at::kHalf))) << "round to nearest, as ATen's cast";
  EXPECT_TRUE(halfToFloat(reinterpret_cast<uint16_t*>(h.data_ptr<at::Half>()), back.data_ptr<float>(), 1003, 2.0f));
  EXPECT_TRUE(back.equal(h.to(at::kFloat) * 2));
  at::Tensor sum = at::empty({1003}, at::kHalf);
  sumHalf(sum.data_ptr(), h.data_ptr(), h.data_ptr(), 1003);
  EXPECT_TRUE(sum.equal((h.to(at::kFloat) * 2).to(at::kHalf)));
  h[1001] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(halfToFloat(reinterpret_cast<uint16_t*>(h.data_ptr<at::Half>()), back.data_ptr<float>(), 1003, 1.0f));
  h[1001] = 0;
  h[3] = std::nanf("");  // inside the vectorized part
  EXPECT_FALSE(halfToFloat(reinterpret_cast<uint16_t*>(h.data_ptr<at::Half>()), back.data_ptr<float>(), 1003, 1.0f));
  // bfloat16: round to nearest even, as ATen's cast; sums in fp32, rounded once; inf/nan caught.
  at::Tensor bf = at::empty({1003}, at::kBFloat16);
  auto* bits = static_cast<uint16_t*>(bf.data_ptr());
  floatToBf16(x.data_ptr<float>(), bits, 1003, 0.5f);
  EXPECT_TRUE(bf.equal((x * 0.5f).to(at::kBFloat16)));
  EXPECT_TRUE(bf16ToFloat(bits, back.data_ptr<float>(), 1003, 2.0f));
  EXPECT_TRUE(back.equal(bf.to(at::kFloat) * 2));
  at::Tensor bsum = at::empty({1003}, at::kBFloat16);
  sumBf16(bsum.data_ptr(), bf.data_ptr(), bf.data_ptr(), 1003);
  EXPECT_TRUE(bsum.equal((bf.to(at::kFloat) * 2).to(at::kBFloat16)));
  bf[500] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(bf16ToFloat(bits, back.data_ptr<float>(), 1003, 1.0f));
  bf[500] = std::nanf("");
  EXPECT_FALSE(bf16ToFloat(bits, back.data_ptr<float>(), 1003, 1.0f));
}

// A library leaves the process's signal dispositions alone: the program decides about SIGPIPE.
#if AIACC_WITH_GLOO
void countSigpipe(int) {}
#endif
TEST(Gloo, LeavesSigpipeAlone) {
  AIACC_SKIP_WITHOUT_GLOO();
#if AIACC_WITH_GLOO
  struct sigaction mine {
  }, before{}, after{};
  mine.sa_handler = countSigpipe;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGPIPE, &mine, &before), 0);
  {
    GlooTransport t(makeHashStore(), test::glooOptions(0, 1, 1));
    ASSERT_EQ(sigaction(SIGPIPE, nullptr, &after), 0);
  }
  ASSERT_EQ(sigaction(SIGPIPE, &before, nullptr), 0);
  EXPECT_EQ(after.sa_handler, &countSigpipe);
#endif
}

// What NcclTransport logs instead of setting the environment itself: one line per setting that
// differs from kNcclEnvironment, saying what it costs.
TEST(NcclEnvironment, NotesWhatDiffers) {
  const std::map<std::string, std::string> env = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"},
                                                  {"TORCH_NCCL_PROPAGATE_ERROR", "1"},
                                                  {"TORCH_NCCL_USE_COMM_NONBLOCKING", "1"},
                                                  {"TORCH_NCCL_NONBLOCKING_TIMEOUT", "60"}};
  const std::vector<std::string> notes = ncclEnvironmentNotes([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0].rfind("TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (NcclTransport expects 2): ", 0), 0u) << notes[0];
  EXPECT_EQ(notes[1].rfind("TORCH_NCCL_ENABLE_TIMING is unset (NcclTransport expects 1): ", 0), 0u) << notes[1];
}

}  // namespace
}  // namespace aiacc::comm
