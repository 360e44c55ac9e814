// Shared by the comm tests: ranks as threads over one in-process store.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/config.h"
#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/hierarchical.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/store.h"

// Tests that exercise Gloo itself (or two-level reduction between CPU nodes, which rides on it)
// skip in builds without GlooTransport (comm/CMakeLists.txt says which builds those are).
#if AIACC_WITH_GLOO
#define AIACC_SKIP_WITHOUT_GLOO() (void)0
#else
#define AIACC_SKIP_WITHOUT_GLOO() \
  GTEST_SKIP() << "this build has no GlooTransport (a LibTorch carrying its own Gloo without headers)"
#endif

namespace aiacc::comm::test {

// Gloo options for one rank-thread of a test.
inline GlooOptions glooOptions(int rank, int world, int channels,
                               std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  GlooOptions o;
  o.rank = rank;
  o.world = world;
  o.channels = channels;
  o.timeout = timeout;
  return o;
}

// Runs fn(rank) on `world` threads, one per rank; returns each rank's error message ("" if none).
inline std::vector<std::string> runThreads(int world, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs fn(rank, transport) on `world` threads; returns each rank's error message ("" if none).
// The transport: Gloo (in builds without it, shared memory: the CPU transport such a build has);
// shm: shared memory; ranks_per_node > 0: a HierarchicalTransport over that many ranks per node
// (every shard size takes the three-stage path; Gloo builds only).
inline std::vector<std::string> runRanks(int world, const std::function<void(int, std::shared_ptr<Transport>)>& fn,
                                         int channels = 1, std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                         int ranks_per_node = 0, bool shm = false) {
  auto store = makeHashStore();
  return runThreads(world, [&](int r) {
    GlooOptions o = glooOptions(r, world, channels, timeout);
    std::shared_ptr<Transport> t;
#if !AIACC_WITH_GLOO
    shm = true;
#endif
    if (ranks_per_node > 0) {
#if AIACC_WITH_GLOO
      t = makeGlooHierarchical(store, o, ranks_per_node, /*min_shard_bytes=*/1, shm);
#else
      throw std::logic_error("two-level CPU reduction needs Gloo: the test must AIACC_SKIP_WITHOUT_GLOO()");
#endif
    } else if (shm) {
      ShmOptions so;
      so.rank = r;
      so.world = world;
      so.channels = channels;
      so.timeout = timeout;
      so.chunk_bytes = 4096;  // many rounds even for small tensors
      t = std::make_shared<ShmTransport>(store, so);
    } else {
#if AIACC_WITH_GLOO
      t = std::make_shared<GlooTransport>(store, o);
#endif
    }
    fn(r, t);
  });
}

// Wraps a transport (every operation passes through to it) and reports channel statistics at
// the given rates instead of measured ones: channel c has carried the payload bytes submitted to
// it, in bytes / bytes_per_s[c] busy seconds. Tests of what is decided from channel speeds
// (striping) then depend on no clock. Records every allreduce (channel, dtype, elements).
class RatedTransport : public Transport {
 public:
  struct Allreduce {
    int channel;
    at::ScalarType dtype;
    int64_t numel;
  };
  RatedTransport(std::shared_ptr<Transport> inner, std::vector<double> bytes_per_s)
      : inner_(std::move(inner)), rates_(std::move(bytes_per_s)), bytes_(rates_.size(), 0.0) {
    AIACC_CHECK(static_cast<int>(rates_.size()) == inner_->channels(), "one rate per channel");
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int channels() const override { return inner_->channels(); }
  ChannelStats channelStats(int c) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const double b = bytes_.at(static_cast<size_t>(c));
    return {b, b / rates_[static_cast<size_t>(c)]};
  }
  std::string describe() const override { return "rated " + inner_->describe(); }
  void abort(const std::string& why) override { inner_->abort(why); }
  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int c) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      allreduces_.push_back({c, t.scalar_type(), t.numel()});
    }
    carried(c, t.nbytes());
    return inner_->allreduce(std::move(t), op, c);
  }
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int c) override {
    carried(c, t.nbytes());
    return inner_->broadcast(std::move(t), root, c);
  }
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int c) override {
    carried(c, out.nbytes());
    return inner_->allgather(std::move(in), std::move(out), c);
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int c) override {
    carried(c, t.nbytes());
    return inner_->reduceScatter(std::move(t), c);
  }
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int c) override {
    carried(c, t.nbytes());
    return inner_->allgatherShards(std::move(t), c);
  }
  // The allreduces of one dtype so far, in submission order.
  std::vector<Allreduce> allreduces(at::ScalarType dtype) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Allreduce> out;
    for (const Allreduce& a : allreduces_) {
      if (a.dtype == dtype) out.push_back(a);
    }
    return out;
  }

 private:
  void carried(int c, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_.at(static_cast<size_t>(c)) += static_cast<double>(bytes);
  }
  std::shared_ptr<Transport> inner_;
  std::vector<double> rates_;
  mutable std::mutex mu_;
  std::vector<double> bytes_;  // per channel, since construction
  std::vector<Allreduce> allreduces_;
};

// One rank, `k` channels, every operation done at once; after abort() every operation fails
// with the reason (the sticky abort of a real transport).
class ImmediateTransport : public Transport {
 public:
  // `world`: the size it claims (rank 0 of it); its operations still complete at once, in place.
  explicit ImmediateTransport(int k, int world = 1) : k_(k), world_(world) {}
  int rank() const override { return 0; }
  int size() const override { return world_; }
  int channels() const override { return k_; }
  ChannelStats channelStats(int) const override { return {}; }
  std::string describe() const override { return "immediate"; }
  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (why_.empty()) why_ = why;
  }
  std::shared_ptr<Work> allreduce(at::Tensor, ReduceOp, int) override { return done(); }
  std::shared_ptr<Work> broadcast(at::Tensor, int, int) override { return done(); }
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int) override {
    out.copy_(in.reshape(out.sizes()));
    return done();
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor, int) override { return done(); }
  std::shared_ptr<Work> allgatherShards(at::Tensor, int) override { return done(); }

 private:
  class Result : public Work {
   public:
    explicit Result(std::string why) : why_(std::move(why)) {}
    void wait() override {
      if (!why_.empty()) throw CommError(why_);
    }

   private:
    std::string why_;
  };
  std::shared_ptr<Work> done() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::make_shared<Result>(why_);
  }
  int k_, world_;
  std::mutex mu_;
  std::string why_;
};

inline void expectNoErrors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace aiacc::comm::test
