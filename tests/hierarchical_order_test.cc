// Two-level reduction over device-ordered transports (NCCL on GPUs): the caller submits every
// stage itself, so each rank submits to its two communicators in one and the same order, which
// NCCL requires of communicators used concurrently. Checked on the CPU with real shared-memory
// transports wrapped to say they wait on the device and to record each submission.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aiacc/comm/hierarchical.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/store.h"
#include "tests/comm_test_util.h"

namespace aiacc::comm {
namespace {

// Forwards to a real transport; records "<name>.<op>@<channel>" per submission.
class OrderRecordingTransport : public Transport {
 public:
  OrderRecordingTransport(std::shared_ptr<Transport> inner, std::string name, std::vector<std::string>* log,
                          bool device_ordered)
      : inner_(std::move(inner)), name_(std::move(name)), log_(log), device_ordered_(device_ordered) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int channels() const override { return inner_->channels(); }
  bool waitsOnDevice() const override { return device_ordered_; }
  ChannelStats channelStats(int c) const override { return inner_->channelStats(c); }
  std::string describe() const override { return inner_->describe(); }
  void abort(const std::string& why) override { inner_->abort(why); }
  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int c) override {
    note("allreduce", c);
    return inner_->allreduce(t, op, c);
  }
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int c) override {
    note("broadcast", c);
    return inner_->broadcast(t, root, c);
  }
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int c) override {
    note("allgather", c);
    return inner_->allgather(in, out, c);
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int c) override {
    note("reduceScatter", c);
    return inner_->reduceScatter(t, c);
  }
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int c) override {
    note("allgatherShards", c);
    return inner_->allgatherShards(t, c);
  }

 private:
  void note(const char* op, int c) {
    std::lock_guard<std::mutex> lock(mu_);  // the caller's thread and (host-ordered) relays
    log_->push_back(name_ + "." + op + "@" + std::to_string(c));
  }
  std::shared_ptr<Transport> inner_;
  std::string name_;
  std::vector<std::string>* log_;
  bool device_ordered_;
  static inline std::mutex mu_;
};

std::shared_ptr<Transport> shm(c10::intrusive_ptr<c10d::Store> store, const std::string& name, int rank, int world,
                               int channels) {
  ShmOptions o;
  o.rank = rank;
  o.world = world;
  o.channels = channels;
  o.name = name;
  o.chunk_bytes = 4096;
  return std::make_shared<ShmTransport>(store, o);
}

TEST(TwoLevelOnDevice, EveryRankSubmitsInTheCallersOrder) {
  const int N = 2, R = 2, W = N * R;
  auto store = makeHashStore();
  std::vector<std::vector<std::string>> logs(W);
  const std::vector<int64_t> sizes = {10007, 3, 4096, 1, 777};  // sharded and two-stage, interleaved
  const auto errors = test::runThreads(W, [&](int r) {
    const int node = r / R, local = r % R;
    auto intra = std::make_shared<OrderRecordingTransport>(shm(store, "intra" + std::to_string(node), local, R, 2),
                                                           "intra", &logs[r], true);
    auto inter = std::make_shared<OrderRecordingTransport>(shm(store, "inter" + std::to_string(local), node, N, 1),
                                                           "inter", &logs[r], true);
    HierarchicalTransport h(intra, inter, /*min_shard_bytes=*/64);
    ASSERT_TRUE(h.waitsOnDevice());
    std::vector<at::Tensor> ts;
    std::vector<std::shared_ptr<Work>> works;
    for (int64_t n : sizes) {  // all submitted before any is waited for
      ts.push_back(at::arange(n, at::kFloat) * (r + 1));
      works.push_back(h.allreduce(ts.back(), ReduceOp::kSum, 0));
    }
    for (auto& w : works) w->wait();
    for (size_t i = 0; i < sizes.size(); ++i) {  // sum over ranks of (r + 1) = 10
      ASSERT_TRUE(ts[i].equal(at::arange(sizes[i], at::kFloat) * 10)) << "size " << sizes[i];
    }
  });
  test::expectNoErrors(errors);
  std::vector<std::string> want;
  for (int64_t n : sizes) {
    if (n / R * 4 >= 64) {
      want.insert(want.end(), {"intra.reduceScatter@0", "inter.allreduce@0", "intra.allgatherShards@1"});
    } else {
      want.insert(want.end(), {"intra.allreduce@0", "inter.allreduce@0"});
    }
  }
  for (int r = 0; r < W; ++r) EXPECT_EQ(logs[r], want) << "rank " << r;
}

// Host-ordered transports keep the relay threads (stages of successive operations overlap) and
// say so.
TEST(TwoLevelOnDevice, HostOrderedTransportsKeepTheRelays) {
  auto store = makeHashStore();
  std::vector<std::string> log;
  const auto errors = test::runThreads(1, [&](int) {
    auto intra = std::make_shared<OrderRecordingTransport>(shm(store, "i", 0, 1, 2), "intra", &log, false);
    auto inter = std::make_shared<OrderRecordingTransport>(shm(store, "o", 0, 1, 1), "inter", &log, true);
    HierarchicalTransport h(intra, inter, 64);
    EXPECT_FALSE(h.waitsOnDevice()) << "one host-ordered part makes the whole host-ordered";
    at::Tensor t = at::ones({1000});
    h.allreduce(t, ReduceOp::kSum, 0)->wait();
    EXPECT_TRUE(t.equal(at::ones({1000})));
  });
  test::expectNoErrors(errors);
}

}  // namespace
}  // namespace aiacc::comm
