// HierarchicalTransport: two-level reduction, composed of two transports.
//
//   intra: the ranks of this node (its rank = local rank), with 2K channels;
//   inter: the ranks with this local rank on every node (its rank = node index), with K channels.
//
// Global rank = node * ranks_per_node + local rank (the launcher's numbering). An allreduce on
// channel c runs as three stages, each on its own communicator:
//   1. reduce-scatter inside the node (intra channel 2c): local rank l holds the node's sum of
//      shard l (shardOf: any remainder goes to the first shards);
//   2. allreduce of that shard between nodes (inter channel c): only 1/ranks_per_node of the
//      buffer crosses the slow network per rank, and the ranks of a node use it in parallel;
//   3. allgather of the shards inside the node (intra channel 2c+1).
// A stage that fails aborts both transports before its relay (or, on the device path, the
// caller) waits for anything else, so the stages behind it end at once with that error.
// Stages of successive operations overlap: each stage has its own communicator and operations
// move from one stage to the next in submission order (two relay threads per channel), so
// bucket k's inter-node allreduce runs while bucket k+1 is reduced inside the node and bucket
// k-1 gathered. Small buffers (and bitwise ops) take a two-stage path instead: intra-node
// allreduce, then inter-node allreduce.
// On GPU the same composition applies to two NCCL transports (intra- and inter-node
// communicators); there the caller submits all three stages itself (waitsOnDevice), so every
// rank submits to its communicators in the same order, as NCCL requires.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "aiacc/comm/transport.h"
#include "aiacc/config.h"
#if AIACC_WITH_GLOO
#include "aiacc/comm/gloo_transport.h"
#endif

namespace aiacc::comm {

class HierarchicalTransport : public Transport {
 public:
  // Buffers whose shard per local rank is smaller than min_shard_bytes take the two-stage path.
  HierarchicalTransport(std::shared_ptr<Transport> intra, std::shared_ptr<Transport> inter,
                        int64_t min_shard_bytes = 4096);
  ~HierarchicalTransport() override;

  int rank() const override { return inter_->rank() * intra_->size() + intra_->rank(); }
  int size() const override { return inter_->size() * intra_->size(); }
  int channels() const override { return inter_->channels(); }
  bool waitsOnDevice() const override { return device_ordered_; }
  // Bytes: the full buffers submitted; busy: the three stages' communicators together.
  ChannelStats channelStats(int channel) const override;
  std::string describe() const override;

  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int channel) override;
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel) override;
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel) override;
  // Both as an allreduce (a superset of what they promise): not on any hot path.
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel) override;
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel) override;
  void abort(const std::string& why) override {
    intra_->abort(why);
    inter_->abort(why);
  }
  void synchronize() override {
    intra_->synchronize();
    inter_->synchronize();
  }

  const Transport& intra() const { return *intra_; }
  const Transport& inter() const { return *inter_; }

 private:
  using Stage = std::function<std::shared_ptr<Work>()>;  // returns null when nothing to do
  struct Op;
  std::shared_ptr<Work> submit(int channel, size_t bytes, Stage s1, Stage s2, Stage s3);
  void relay(int channel, int stage);

  std::shared_ptr<Transport> intra_, inter_;
  int64_t min_shard_bytes_;
  bool device_ordered_;  // both transports wait on the device: stages submitted by the caller
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::deque<std::shared_ptr<Op>>> after1_, after2_;  // per channel
  std::vector<double> bytes_;                                     // per channel
  std::vector<std::thread> threads_;
};

// Gloo between nodes, and inside the node shared memory (intra_shm) or Gloo over loopback;
// meeting through one store: ranks_per_node consecutive ranks form a node. base's rank and world
// are global; its name prefixes the sub-communicators.
#if AIACC_WITH_GLOO  // builds without GlooTransport: comm/CMakeLists.txt
std::shared_ptr<HierarchicalTransport> makeGlooHierarchical(c10::intrusive_ptr<c10d::Store> store,
                                                            const GlooOptions& base, int ranks_per_node,
                                                            int64_t min_shard_bytes = 4096, bool intra_shm = false);
#endif

}  // namespace aiacc::comm
