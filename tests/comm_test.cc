// comm/: Gloo transport collectives and DataParallel, with ranks as threads sharing one
// in-memory store (real Gloo over TCP on loopback between the threads).
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

#include "comm/data_parallel.h"
#include "comm/factory.h"
#include "comm/gloo_transport.h"
#include "comm/hierarchical.h"
#include "comm/shm_transport.h"
#include "comm/half.h"
#include "comm/store.h"
#include "comm/throttled_transport.h"

namespace aiacc::comm {
namespace {

// Runs fn(rank, transport) on `world` threads; returns each rank's error message ("" if none).
// ranks_per_node > 0: a HierarchicalTransport over that many ranks per node (every shard size
// takes the three-stage path).
std::vector<std::string> runRanks(int world, const std::function<void(int, std::shared_ptr<Transport>)>& fn,
                                  int channels = 1, std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                  int ranks_per_node = 0, bool shm = false) {
  auto store = makeHashStore();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooOptions o;
        o.rank = r;
        o.world = world;
        o.channels = channels;
        o.timeout = timeout;
        std::shared_ptr<Transport> t;
        if (ranks_per_node > 0) {
          t = makeGlooHierarchical(store, o, ranks_per_node, /*min_shard_bytes=*/1, shm);
        } else if (shm) {
          ShmOptions so;
          so.rank = r;
          so.world = world;
          so.channels = channels;
          so.timeout = timeout;
          so.chunk_bytes = 4096;  // many rounds even for small tensors
          t = std::make_shared<ShmTransport>(store, so);
        } else {
          t = std::make_shared<GlooTransport>(store, o);
        }
        fn(r, t);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expectNoErrors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(BucketPlan, PureFunctionOfTheParameterList) {
  std::vector<ParamInfo> params;
  for (int i = 0; i < 6; ++i) {
    ParamInfo p;
    p.name = "p" + std::to_string(i);
    p.numel = i == 2 ? 1000 : 100;  // 400 bytes each, p2: 4000 bytes
    p.shape = {p.numel};
    p.dtype = i == 0 ? 1 : 0;       // p0: another dtype
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

TEST(Gloo, CollectivesMatchClosedForm) {
  const int W = 3;
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
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
  }, /*channels=*/2));
}

// Shared-memory collectives give Gloo's results: bit for bit for sums of integer-valued data and
// for data movement, any size (many rounds of 4 KiB slots, empty shards), dtype and channel.
TEST(Shm, CollectivesMatchGloo) {
  for (int W : {2, 3}) {
    auto store = makeHashStore();
    std::vector<std::string> errors(W);
    std::vector<std::thread> threads;
    for (int r = 0; r < W; ++r) {
      threads.emplace_back([&, r] {
        try {
          GlooOptions o;
          o.rank = r;
          o.world = W;
          o.channels = 2;
          o.timeout = std::chrono::seconds(30);
          GlooTransport gloo(store, o);
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
          at::Tensor rs = at::arange(0, 10001, at::kFloat) * (r + 1), want = at::arange(0, 10001, at::kFloat) * (W * (W + 1) / 2);
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
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    expectNoErrors(errors);
  }
}

// A rank that never arrives is named within the timeout, not waited for forever.
TEST(Shm, MissingPeerIsNamedWithinTheTimeout) {
  auto store = makeHashStore();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ShmOptions so;
        so.rank = r;
        so.world = 2;
        so.timeout = std::chrono::seconds(1);
        ShmTransport shm(store, so);
        if (r == 1) return;  // rank 1 leaves without taking part
        at::Tensor t = at::ones({100});
        shm.allreduce(t, ReduceOp::kSum, 0)->wait();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(errors[0].find("rank 1 did not reach the barrier"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

// The one factory picks: shared memory on one host, Gloo between hosts, two-level between nodes
// with several ranks each (or as the tuner's alternative), and refuses GPU ranks without NCCL.
TEST(Factory, PicksTheTransportForTheLayout) {
  struct Case {
    int world, local_size;
    std::string hierarchical;
    bool tune, shm;
    std::string primary, alternative;
  };
  const std::vector<Case> cases = {
      {2, 2, "auto", true, true, "shm, 2 ranks", ""},
      {2, 1, "auto", true, true, "gloo, 2 ranks", ""},
      {2, 2, "auto", true, false, "gloo, 2 ranks", ""},
      {4, 2, "auto", false, true, "two-level, 2 nodes x 2 ranks (intra: shm", ""},
      {4, 2, "auto", true, true, "gloo, 4 ranks", "two-level, 2 nodes x 2 ranks"},
      {4, 2, "off", true, true, "gloo, 4 ranks", ""},
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
    expectNoErrors(errors);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_EQ(primary[r].rfind(c.primary, 0), 0u) << primary[r];
      EXPECT_EQ(alternative[r].rfind(c.alternative, 0), 0u) << alternative[r];
    }
  }
  TransportSpec gpu;
  gpu.gpu = true;
#ifndef AIACC_WITH_NCCL
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
  const int N = GetParam().nodes, R = GetParam().per_node, W = N * R;
  auto store = makeHashStore();
  std::vector<std::string> errors(W);
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooOptions o;
        o.rank = r;
        o.world = W;
        o.channels = 2;
        o.timeout = std::chrono::seconds(30);
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
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  expectNoErrors(errors);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TwoLevel,
                         ::testing::Values(Layout{1, 4}, Layout{2, 2}, Layout{4, 1}, Layout{3, 2}),
                         [](const auto& info) {
                           return std::to_string(info.param.nodes) + "x" + std::to_string(info.param.per_node);
                         });

// A small convolutional net without BatchNorm: per-rank batch statistics would make the
// N-rank gradient differ from the single-process one by design.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int hidden = 8) {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, hidden, 3).padding(1)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(hidden, 16, 3).stride(2)));
    fc = register_module("fc", torch::nn::Linear(16, 5));
    unused = register_module("unused", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra = false) {
    x = torch::relu(c2(torch::relu(c1(x))));
    x = fc(x.mean({2, 3}));
    if (use_extra) x = x * unused(torch::ones({1, 4})).sum();  // (a shift would have zero gradient)
    return x;
  }
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear fc{nullptr}, unused{nullptr};
};
TORCH_MODULE(Net);

// Copies parameter values (rank threads must not draw initial weights from the global generator:
// it is shared between threads, so concurrent construction interleaves its draws).
std::vector<at::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}
void restore(torch::nn::Module& m, const std::vector<at::Tensor>& values) {
  at::NoGradGuard no_grad;
  auto params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values[i]);
}

at::Tensor inputs(int n, uint64_t seed) {
  return at::randn({n, 3, 12, 12}, at::detail::createCPUGenerator(seed), at::kFloat);
}
at::Tensor targets(int n, uint64_t seed) {
  return at::randint(0, 5, {n}, at::detail::createCPUGenerator(seed), at::kLong);
}

// One backward of Net on W ranks with batch b each, through DataParallel with options o, and
// the single-process backward on the concatenated batch into ref. Only rank 0 starts from ref's
// weights: DataParallel must broadcast them. Returns each rank's gradients (undefined where a
// parameter has none).
std::vector<std::vector<at::Tensor>> rankGradients(Net& ref, int W, int b, const DataParallelOptions& o,
                                                   int ranks_per_node = 0, bool shm = false) {
  const at::Tensor x = inputs(W * b, 1), y = targets(W * b, 2);
  torch::manual_seed(7);
  ref = Net();
  const auto init = snapshot(*ref);
  torch::nn::functional::cross_entropy(ref->forward(x), y).backward();
  std::vector<std::vector<at::Tensor>> grads(W);
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    Net net;  // arbitrary init on ranks > 0
    if (r == 0) restore(*net, init);
    DataParallel dp(net.ptr(), t, WorldInfo{r, W, r, W}, o);
    torch::nn::functional::cross_entropy(net->forward(x.narrow(0, r * b, b)), y.narrow(0, r * b, b)).backward();
    ASSERT_TRUE(dp.finishBackward());
    for (auto& p : net->parameters()) grads[r].push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  }, 1, std::chrono::seconds(30), ranks_per_node, shm));
  return grads;
}

struct Caps {
  double first_mb, mb;
  const char* name;
  Negotiation negotiation = Negotiation::kDecentralized;
  int ranks_per_node = 0;  // > 0: two-level reduction
  bool shm = false;        // shared memory (inside the node, with two-level)
};

class Equivalence : public ::testing::TestWithParam<Caps> {};

// After one backward on N ranks with batch b each, every rank's averaged gradient equals the
// single-process gradient on the N*b concatenated batch.
TEST_P(Equivalence, GradientEqualsSingleProcessOnConcatenatedBatch) {
  const int W = 3, b = 4;
  DataParallelOptions o;
  o.first_bucket_mb = GetParam().first_mb;
  o.bucket_mb = GetParam().mb;
  o.negotiation = GetParam().negotiation;
  Net ref{nullptr};  // built by rankGradients
  const auto grads = rankGradients(ref, W, b, o, GetParam().ranks_per_node, GetParam().shm);
  auto rp = ref->named_parameters();
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(grads[r].size(), rp.size());
    for (size_t i = 0; i < rp.size(); ++i) {
      if (!grads[r][i].defined()) {  // agreed unused everywhere (central negotiation): no gradient
        EXPECT_FALSE(rp[i].value().grad().defined()) << rp[i].key();
        continue;
      }
      const at::Tensor want = rp[i].value().grad().defined() ? rp[i].value().grad() : at::zeros_like(rp[i].value());
      EXPECT_TRUE(at::allclose(grads[r][i], want, 1e-5, 1e-7))
          << GetParam().name << " rank " << r << " " << rp[i].key() << " max diff "
          << (grads[r][i] - want).abs().max().item<float>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BucketCaps, Equivalence,
                         ::testing::Values(Caps{1e-9, 1e-9, "one_param_per_bucket"},
                                           Caps{1, 25, "default"}, Caps{1000, 1000, "one_bucket"},
                                           Caps{1, 25, "central_negotiation", Negotiation::kCentral},
                                           Caps{1, 25, "hierarchical_1x3", Negotiation::kDecentralized, 3},
                                           Caps{1e-9, 1e-9, "hierarchical_3x1_per_param", Negotiation::kDecentralized, 1},
                                           Caps{1, 25, "shm", Negotiation::kDecentralized, 0, true},
                                           Caps{1e-9, 1e-9, "hierarchical_1x3_shm_per_param", Negotiation::kDecentralized, 3, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// 20 SGD steps on N ranks leave identical parameters everywhere, equal to a single-process run
// on the concatenated batches.
TEST(DataParallel, TwentyStepsMatchSingleProcess) {
  const int W = 2, b = 3, steps = 20;
  torch::manual_seed(3);
  Net ref;
  const auto init = snapshot(*ref);
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(ref->forward(inputs(W * b, 10 + s)), targets(W * b, 50 + s)).backward();
    ref_opt.step();
  }
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

TEST(DataParallel, ModelMismatchIsNamedNotHung) {
  const auto errors = runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
    Net net(r == 0 ? 8 : 6);  // rank 1 has a different c1
    DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2});
  }, 1, std::chrono::seconds(10));
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("model mismatch: parameter #0 ('c1.weight'"), std::string::npos) << errors[r];
  }
}

TEST(DataParallel, UnusedParametersOnOneRankDoNotHang) {
  std::vector<at::Tensor> unused_grad(2);
  expectNoErrors(runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
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
  }, 1, std::chrono::seconds(20)));
  // Last step (s = 2): rank 0 used it, rank 1 did not: both hold rank 0's gradient / 2.
  EXPECT_TRUE(unused_grad[0].equal(unused_grad[1]));
  EXPECT_GT(unused_grad[0].abs().sum().item<float>(), 0.0f);
}

// Agreement rides on the last bucket (no collective of its own), in every transfer dtype: a
// parameter unused everywhere keeps no gradient; one used on a single rank gets the average.
TEST(DataParallel, DetectUnusedLeavesNeverUsedParametersWithoutGradient) {
  for (TransferDtype dtype : {TransferDtype::kFloat32, TransferDtype::kFloat16, TransferDtype::kBFloat16}) {
    std::vector<bool> defined(2), used_once(2);
    expectNoErrors(runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
      Net net;
      DataParallelOptions o;
      o.detect_unused = true;
      o.transfer = dtype;
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
      (torch::nn::functional::cross_entropy(ref->forward(x.narrow(0, off, b)), y.narrow(0, off, b)) /
       (micro * W)).backward();
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

TEST(DataParallel, DeadRankFailsTheOthersWithinTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = runRanks(2, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    DataParallel dp(net.ptr(), t, WorldInfo{r, 2, r, 2});
    if (r == 1) throw std::runtime_error("rank 1 dies before its first step");
    torch::nn::functional::cross_entropy(net->forward(inputs(2, 0)), targets(2, 0)).backward();
    dp.finishBackward();
  }, 1, std::chrono::seconds(3));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(errors[0].find("collective failed on rank 0"), std::string::npos) << errors[0];
  EXPECT_LT(s, 30.0) << "no hang";
}

// A net with one large fused bucket, so buckets are split across channels.
struct WideImpl : torch::nn::Module {
  WideImpl() { fc = register_module("fc", torch::nn::Linear(512, 1024)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Wide);

// With channel 1 slowed, the split converges to give it less, identically on every rank, the
// step's exposed communication beats the equal split's, and the gradients stay exact.
TEST(DataParallel, SplitFollowsMeasuredChannelSpeed) {
  const int W = 2;
  std::vector<std::vector<double>> weights(W);
  std::vector<at::Tensor> grads(W);
  torch::manual_seed(4);
  Wide ref;
  const auto init = snapshot(*ref);
  const at::Tensor x = at::randn({2 * W, 512}, at::detail::createCPUGenerator(8), at::kFloat);
  ref->forward(x).pow(2).mean().backward();
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> gloo) {
    auto slow = std::make_shared<ThrottledTransport>(gloo, std::vector<double>{0.0, 0.05});
    Wide net;
    restore(*net, init);
    // Exposed communication of the last 3 of 6 steps, balanced or split equally.
    auto train = [&](bool balance) {
      DataParallelOptions o;
      o.first_bucket_mb = 100;  // one bucket of 2 MiB
      o.balance_channels = balance;
      DataParallel dp(net.ptr(), slow, WorldInfo{r, W, r, W}, o);
      double before = 0;
      for (int step = 0; step < 6; ++step) {
        if (step == 3) before = dp.exposedCommSeconds();
        for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
        net->forward(x.narrow(0, r * 2, 2)).pow(2).mean().backward();
        dp.finishBackward();
      }
      if (balance) weights[r] = dp.channelWeights();
      return dp.exposedCommSeconds() - before;
    };
    const double equal = train(false);
    restore(*net, init);
    const double balanced = train(true);
    // Equal: 1 MiB on the slowed channel, 50 ms of throttle a step; balanced: a fraction of it.
    EXPECT_LT(balanced, equal) << "rank " << r;
    grads[r] = net->fc->weight.grad().clone();
  }, /*channels=*/2));
  ASSERT_EQ(weights[0].size(), 2u);
  EXPECT_EQ(weights[0], weights[1]) << "every rank splits identically";
  EXPECT_LT(weights[0][1], 0.3) << "the slowed channel carries less (started at 0.5)";
  for (int r = 0; r < W; ++r) {
    // Each rank's loss is the mean over its own half: the average of the two equals the full-batch
    // gradient of the mean over all rows.
    EXPECT_TRUE(at::allclose(grads[r], ref->fc->weight.grad(), 1e-5, 1e-7)) << "rank " << r;
  }
}

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

struct Precision {
  TransferDtype dtype;
  double bound;  // relative to the largest gradient value of each parameter
  const char* name;
};

class ReducedPrecision : public ::testing::TestWithParam<Precision> {};

// fp16 and bf16 transfer stay within their precision of the fp32 result on realistic gradients,
// identically on every rank.
TEST_P(ReducedPrecision, TransferIsCloseToFp32) {
  const int W = 3, b = 4;
  DataParallelOptions o;
  o.transfer = GetParam().dtype;
  Net ref{nullptr};  // built by rankGradients
  const auto grads = rankGradients(ref, W, b, o);
  auto rp = ref->parameters();
  for (size_t i = 0; i + 2 < rp.size(); ++i) {  // the last two: the unused layer (zeros)
    const at::Tensor& want = rp[i].grad();
    // fp16 keeps 11 significant bits (relative error ~5e-4 per rounding), bf16 8 (~4e-3); a few
    // roundings along the ring; values far below the scale's reach flush toward zero, hence the
    // absolute term.
    const double bound = GetParam().bound * want.abs().max().item<double>() + 1e-6;
    EXPECT_LE((grads[0][i] - want).abs().max().item<double>(), bound) << "param " << i;
    EXPECT_TRUE(grads[0][i].equal(grads[W - 1][i])) << "identical on every rank";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReducedPrecision,
                         ::testing::Values(Precision{TransferDtype::kFloat16, 3e-3, "fp16"},
                                           Precision{TransferDtype::kBFloat16, 2e-2, "bf16"}),
                         [](const auto& info) { return std::string(info.param.name); });

// 200 training steps on 2 ranks end with the same held-out accuracy whether gradients travel as
// fp32, fp16 or bf16 (a 4-class problem of Gaussian clusters that an MLP learns to ~95%).
TEST(DataParallel, TwoHundredStepsReachTheSameAccuracyInEveryTransferDtype) {
  const int W = 2, b = 16, steps = 200, D = 8, C = 4;
  const at::Tensor centers = at::randn({C, D}, at::detail::createCPUGenerator(5), at::kFloat) * 1.5;
  auto sample = [&](int n, uint64_t seed, at::Tensor* labels) {
    auto gen = at::detail::createCPUGenerator(seed);
    *labels = at::randint(0, C, {n}, gen, at::kLong);
    return centers.index_select(0, *labels) + at::randn({n, D}, gen, at::kFloat);
  };
  at::Tensor test_y;
  const at::Tensor test_x = sample(2000, 99, &test_y);
  torch::manual_seed(11);
  torch::nn::Sequential init_net(torch::nn::Linear(D, 32), torch::nn::ReLU(), torch::nn::Linear(32, C));
  const auto init = snapshot(*init_net);
  auto accuracy = [&](TransferDtype dtype) {
    std::vector<double> acc(W);
    expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
      torch::nn::Sequential net(torch::nn::Linear(D, 32), torch::nn::ReLU(), torch::nn::Linear(32, C));
      restore(*net, init);
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      DataParallelOptions o;
      o.transfer = dtype;
      DataParallel dp(net.ptr(), t, WorldInfo{r, W, r, W}, o);
      for (int s = 0; s < steps; ++s) {
        at::Tensor y;
        const at::Tensor x = sample(b, 1000 * s + r, &y);
        opt.zero_grad();
        torch::nn::functional::cross_entropy(net->forward(x), y).backward();
        if (dp.finishBackward()) opt.step();
      }
      at::NoGradGuard no_grad;
      acc[r] = net->forward(test_x).argmax(1).eq(test_y).to(at::kDouble).mean().item<double>();
    }));
    EXPECT_EQ(acc[0], acc[1]) << "ranks hold the same model";
    return acc[0];
  };
  const double fp32 = accuracy(TransferDtype::kFloat32), fp16 = accuracy(TransferDtype::kFloat16),
               bf16 = accuracy(TransferDtype::kBFloat16);
  EXPECT_GT(fp32, 0.85) << "the problem is learnable in 200 steps";
  EXPECT_NEAR(fp16, fp32, 0.01) << "fp16 " << fp16 << " fp32 " << fp32;
  EXPECT_NEAR(bf16, fp32, 0.01) << "bf16 " << bf16 << " fp32 " << fp32;
}

// A planted inf is caught on every rank: all skip the same step and halve the scale; training
// continues with the next step.
TEST(DataParallel, Fp16OverflowSkipsTheStepEverywhere) {
  const int W = 2;
  std::vector<std::vector<bool>> stepped(W);
  std::vector<double> scales(W);
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    Net net;
    DataParallelOptions o;
    o.transfer = TransferDtype::kFloat16;
    o.grad_scale = 256;
    DataParallel dp(net.ptr(), t, WorldInfo{r, W, r, W}, o);
    for (int s = 0; s < 3; ++s) {
      for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
      at::Tensor in = inputs(2, 10 + s);
      if (s == 1 && r == 1) in[0][0][0][0] = std::numeric_limits<float>::infinity();  // only rank 1
      torch::nn::functional::cross_entropy(net->forward(in), targets(2, s)).backward();
      stepped[r].push_back(dp.finishBackward());
    }
    scales[r] = dp.gradScale();
  }));
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(stepped[r], (std::vector<bool>{true, false, true})) << "rank " << r;
    EXPECT_DOUBLE_EQ(scales[r], 128.0);
  }
}

// The tuner's search on a known landscape: fusion at 8 MiB is 30% faster, 2 channels 1% faster
// (noise: not taken), two-level 20% faster. Frozen well within 30 steps, on the fastest.
TEST(Autotune, FindsTheFastestConfigurationAndIgnoresNoise) {
  TuneSpace space;
  space.bucket_mb = {2, 8, 64};
  space.channels = {2, 4};
  space.try_two_level = true;
  Autotuner tuner(TuneConfig{25, 1, false}, space);
  auto landscape = [](const TuneConfig& c) {
    double t = 1.0;
    if (c.bucket_mb == 8) t *= 0.7;
    if (c.channels == 2) t *= 0.99;
    if (c.channels == 4) t *= 1.2;
    if (c.two_level) t *= 0.8;
    return t;
  };
  int steps = 0;
  while (!tuner.frozen() && steps < 100) {
    // The first step of each trial is slow (switch cost): it must be discarded.
    tuner.record(landscape(tuner.current()) * (steps % 3 == 0 ? 5 : 1), 0.1);
    ++steps;
  }
  ASSERT_TRUE(tuner.frozen());
  EXPECT_LE(steps, 30);
  EXPECT_EQ(tuner.current(), (TuneConfig{8, 1, true})) << tuner.summary();
  // A flat landscape: nothing beats the start by more than noise, so the start stays.
  Autotuner flat(TuneConfig{25, 1, false}, space);
  for (int i = 0; i < 100 && !flat.frozen(); ++i) flat.record(1.0 - 0.001 * (i % 7), 0);
  EXPECT_EQ(flat.current(), (TuneConfig{25, 1, false})) << flat.summary();
  // Step times within noise, but 8 MiB buckets leave far less communication exposed: taken.
  Autotuner quiet(TuneConfig{25, 1, false}, space);
  for (int i = 0; i < 100 && !quiet.frozen(); ++i) {
    const TuneConfig& c = quiet.current();
    quiet.record(1.0 + 0.01 * (i % 3), c.bucket_mb == 8 ? 0.02 : 0.2);
  }
  EXPECT_EQ(quiet.current().bucket_mb, 8) << quiet.summary();
}

// Many small tensors, one bucket each at the start: fusing them into one bucket is much faster,
// and the tuner, fed real step times, picks it, identically on every rank.
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
  expectNoErrors(runRanks(W, [&](int r, std::shared_ptr<Transport> t) {
    auto net = std::make_shared<Many>();
    DataParallelOptions o;
    o.bucket_mb = 1e-6;  // one tensor per bucket: 240 allreduces a step
    o.first_bucket_mb = 1e-6;
    o.autotune = true;
    o.tune_space.bucket_mb = {1e-6, 25};
    DataParallel dp(net, t, WorldInfo{r, W, r, W}, o);
    const at::Tensor x = at::ones({2, 4});
    for (int step = 0; step < 40 && dp.tuning(); ++step) {
      dp.beforeForward();
      net->forward(x).sum().backward();
      dp.finishBackward();
    }
    ASSERT_FALSE(dp.tuning()) << "not frozen after 40 steps";
    chosen[r] = dp.tuner()->current();
    summaries[r] = dp.tuner()->summary();
    ASSERT_EQ(dp.plan().buckets.size(), 2u) << summaries[r];  // the small first bucket, then all the rest
  }));
  EXPECT_EQ(chosen[0], chosen[1]);
  EXPECT_EQ(chosen[0].bucket_mb, 25) << summaries[0];
}

TEST(Store, PortInUseIsAClearError) {
  StoreOptions o;
  o.port = 29731;
  o.world = 1;
  o.timeout = std::chrono::seconds(5);
  auto first = makeTcpStore(o);
  try {
    auto second = makeTcpStore(o);
    FAIL() << "second server on the same port";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("port 29731"), std::string::npos) << e.what();
  }
}

TEST(Store, WaitNamesTheMissingRanks) {
  auto store = makeHashStore();
  store->set("ready/0", {1});
  store->set("ready/2", {1});
  try {
    waitForRanks(*store, "ready", 4, std::chrono::milliseconds(200));
    FAIL() << "missing ranks not reported";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1,3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace aiacc::comm
