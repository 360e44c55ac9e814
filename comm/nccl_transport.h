// NcclTransport: GPU collectives with NCCL, one communicator and one CUDA stream per channel.
// Compiled when the LibTorch found has CUDA and NCCL is present (AIACC_WITH_NCCL); elsewhere a
// CTest syntax-checks this file against the CUDA headers so it cannot rot unseen.
//
// Ordering without host synchronization: an operation first makes its channel's stream wait for
// an event recorded on the caller's current stream (so it sees the gradients backward wrote
// there), runs on the channel stream, and records a completion event; Work::wait() makes the
// caller's current stream wait for that event and returns at once. The tensor's memory is
// marked as used by the channel stream, so the caching allocator does not hand it out early.
// Host (CPU) tensors — fingerprints, readiness masks, metrics — are staged through the device
// and waited for: small control traffic only.
//
// Uneven shards (shardOf) use grouped ncclReduce/ncclBroadcast per shard; equal shards the
// in-place ncclReduceScatter/ncclAllGather. NCCL has no bitwise or: it is an allgather and a
// local fold.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace aiacc::comm {

struct NcclOptions {
  int rank = 0;
  int world = 1;
  int channels = 1;
  int device = 0;  // CUDA device of this rank (the local rank, by the launcher's convention)
  std::chrono::milliseconds timeout{60000};  // rendezvous
  std::string name = "nccl";                 // key prefix in the store
};

class NcclTransport : public Transport {
 public:
  NcclTransport(c10::intrusive_ptr<c10d::Store> store, const NcclOptions& options);
  ~NcclTransport() override;

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.world; }
  int channels() const override { return static_cast<int>(channels_.size()); }
  // Bytes submitted; busy time from CUDA timing events of the operations completed so far.
  ChannelStats channelStats(int channel) const override;
  std::string describe() const override;

  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int channel) override;
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel) override;
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel) override;
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel) override;

 private:
  class Channel;
  Channel& channel(int c) const;
  NcclOptions opt_;
  std::vector<std::unique_ptr<Channel>> channels_;
};

}  // namespace aiacc::comm
