// ShmTransport: collectives between ranks on one host through shared memory, as NCCL's SHM
// transport does between GPUs of one node: no sockets, no kernel copies.
//
// Each rank maps, per channel, one segment of its own (two slots of chunk_bytes) and every
// peer's. A slot is split into P areas; shard q of a buffer (shardOf: the same shards as every
// transport) travels through area q, a piece per round, the rounds alternating between slots:
//   allreduce: every rank copies piece k of every shard q into its area q; barrier; rank r sums
//   piece k of shard r over every rank's area r (the reduce work is split P ways) into its
//   output and its own area r; barrier; every rank copies the other pieces from their owners.
//   Reduce-scatter stops after the sum; broadcast and allgather are one copy in, one out.
// Two barriers per round; the alternating slots make a third unnecessary (round k+2 reuses a
// slot only after every rank arrived at round k+1, so nobody still reads it). A barrier is a
// sequence number in each segment's header, published with a release store and awaited with
// acquire loads (spin briefly, then yield); a peer that stops arriving is a CommError after the
// timeout, naming it.
//
// Liveness: a waiter does not wait out the timeout for a peer that can never come. Between
// sleeps it reads the peer's state in its segment: aborted (abort() there), closed (its transport
// destroyed), died (a robust process-shared lock its channel thread holds is free: the kernel
// releases it when the process dies, whatever the PID namespace), or silent (a heartbeat thread
// per rank bumps a counter every heartbeat_timeout / 6; none seen for heartbeat_timeout: the
// process is stopped or hangs). Each ends the operation with a CommError naming the rank within
// a sleep (20 ms) of the cause, or heartbeat_timeout for a silent one. A silent peer whose
// process this rank can see (same PID namespace: its pid and start time, recorded in its header,
// match /proc) is named only once it is stopped (SIGSTOP, a debugger: state T or t); one that is
// merely slow (a loaded host, where its heartbeat thread waited seconds for a core, or this rank
// itself was not running) is waited for, up to the timeout. abort() ends this rank's
// operation in flight the same way, and its peers', which read it.
//
// Segments are created under a random job id agreed through the store, mapped by everyone, then
// unlinked at once (by the last peer to map each one, so that no rank's death after the set-up,
// the owner's included, can leave one): nothing is left in /dev/shm once the constructor has
// returned on any rank, even if the job is killed later; a start that fails (a peer missing, a
// segment refused) unlinks and unmaps what it made. Left behind only by a rank killed during its
// own set-up, before its peers mapped its segment. Each channel has its own segments and worker
// thread, so channels run concurrently.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/timeline.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

struct ShmOptions {
  int rank = 0;
  int world = 1;
  int channels = 1;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // A peer with no heartbeat for this long is lost (0: never; then only the timeout ends a wait
  // for a stopped peer), if its process is stopped or cannot be seen (another PID namespace).
  std::chrono::milliseconds heartbeat_timeout{3000};
  std::string name = "shm";            // key prefix in the store
  int64_t chunk_bytes = 4 << 20;       // per slot; each rank maps 2 slots per channel of every rank
  std::shared_ptr<Timeline> timeline;  // when set: every operation as a span on row 1 + row_base + channel
  int row_base = 0;
  std::string row_label = "shm channel";
};

class ShmTransport : public Transport {
 public:
  // All ranks must be on this host. Blocks until every rank mapped every segment.
  ShmTransport(c10::intrusive_ptr<c10d::Store> store, const ShmOptions& options);
  ~ShmTransport() override;

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.world; }
  int channels() const override { return static_cast<int>(channels_.size()); }
  ChannelStats channelStats(int channel) const override;
  std::string describe() const override;

  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int channel) override;
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel) override;
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel) override;
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel) override;
  void abort(const std::string& why) override;

 private:
  class Channel;
  class Heart;
  Channel& channel(int c);
  ShmOptions opt_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::unique_ptr<Heart> heart_;  // after channels_: stops before they go
};

}  // namespace aiacc::comm
