// NcclTransport: GPU collectives through c10d::ProcessGroupNCCL (libtorch_cuda), one process
// group per channel. Compiled when the LibTorch found has CUDA and NCCL is present
// (AIACC_WITH_NCCL: the LibTorch 2.x configuration); elsewhere a CTest syntax-checks it.
//
// Why ProcessGroupNCCL rather than raw NCCL communicators: it is the engine PyTorch's CI tests,
// with a watchdog thread per process group that times every operation out, aborts the
// communicators of a failed or timed-out one (so the process can exit instead of hanging in a
// kernel), propagates the error to the other ranks through the store, and times operations with
// CUDA events. aiacc keeps what is its own: the channels, the staging of host tensors, the
// shard layout, sticky errors that name the operation.
//
// Errors. Every operation is bounded by `timeout`. The communicator's set-up and teardown are
// bounded by TORCH_NCCL_NONBLOCKING_TIMEOUT (seconds; read once per process), not by `timeout`:
// ProcessGroupNCCL waits for a non-blocking communicator there, for 30 minutes by default. The
// constructor returns only once every rank's communicator exists (one element reduced per
// channel), so a peer that joined and went silent fails the set-up, not a later operation.
// ProcessGroupNCCL's watchdog thread checks every operation for NCCL errors and for the timeout;
// when one fails it marks the process group failed (ProcessGroupNCCL::getError(); with
// TORCH_NCCL_PROPAGATE_ERROR=1 the other ranks' groups too, through the store), and later, after
// a pause for its flight recorder, acts as TORCH_NCCL_ASYNC_ERROR_HANDLING says: 2 aborts the
// communicators and leaves the process running, 3 (the default) ends the process from the
// watchdog. PyTorch reads these variables when a process group is made. NcclTransport sets no
// environment (a library must not: setenv races getenv in threads already running): a program
// sets kNcclEnvironment (comm/nccl_env.h: ASYNC_ERROR_HANDLING=2, PROPAGATE_ERROR=1,
// USE_COMM_NONBLOCKING=1 with NONBLOCKING_TIMEOUT=60 so that set-up times out too,
// ENABLE_TIMING=1 for busy time per channel) at start-up, as aiacc_train does, and NcclTransport
// logs the ones that differ.
// Without TORCH_NCCL_BLOCKING_WAIT, ProcessGroupNCCL's own
// Work::wait() only makes the caller's stream wait, so nothing the watchdog finds later reaches
// the host through it. NcclTransport raises a CommError naming the operation, channel and rank:
//   - at every submission and every wait() on a channel, from the channel's first error
//     (sticky), the process group's failure state, and the errors of the operations that
//     completed since the last call;
//   - where the host blocks: a host (CPU) tensor (control traffic: fingerprints, arrival order,
//     unused-parameter flags, step times, metrics) travels through the device, and its wait()
//     blocks the host, polling the operation, the group's state and the timeout, so it raises
//     before a result is copied back; Work::synchronize() and synchronize() do the same for
//     device tensors (DataParallel calls them where the host reads reduced values next).
// On the first error it finds, NcclTransport aborts the channel's communicators itself instead
// of waiting for the watchdog's abort. For device tensors wait() returns at once: what the device
// computes from a failed operation is unspecified, and the failure is raised by the channel's
// next operation, wait() or synchronize(). After a failure every later operation on the channel
// fails at once with the first error, and wait() rethrows it every time.
//
// Ordering without host synchronization: an operation is ordered after the caller's current
// stream (ProcessGroupNCCL makes its stream wait for it) and Work::wait() makes the caller's
// current stream wait for the operation's end and returns at once (waitsOnDevice()). Host (CPU)
// tensors, such as fingerprints, readiness masks and metrics, are staged through the device and
// waited for: small control traffic only.
//
// Uneven shards (shardOf) go through ProcessGroupNCCL's list collectives (grouped reduces and
// broadcasts); equal shards the in-place reduce-scatter and allgather. NCCL has no bitwise or: it
// is an allgather and a local fold.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/transport.h"

namespace aiacc::comm {

struct NcclOptions {
  int rank = 0;
  int world = 1;
  int channels = 1;
  int device = 0;                                       // CUDA device of this rank
  std::chrono::milliseconds timeout = kDefaultTimeout;  // every operation, and the set-up
  std::string name = "nccl";                            // key prefix in the store
  // Notices, one line each (rank 0: the NCCL environment settings that differ from
  // kNcclEnvironment); default: none.
  std::function<void(const std::string&)> log;
};

class NcclTransport : public Transport {
 public:
  // Makes the process groups and connects them (eagerly, so a missing peer fails here, within
  // the timeout, naming the channel).
  NcclTransport(c10::intrusive_ptr<c10d::Store> store, const NcclOptions& options);
  ~NcclTransport() override;

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.world; }
  int channels() const override { return static_cast<int>(channels_.size()); }
  bool waitsOnDevice() const override { return true; }
  // Bytes and CUDA-timed busy time of the same completed operations (comm/op_timing.h: the
  // bookkeeping retires completed operations at every submission and keeps a bounded number in
  // flight, whether or not anyone asks for the statistics).
  ChannelStats channelStats(int channel) const override;
  std::string describe() const override;

  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int channel) override;
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel) override;
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel) override;
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel) override;
  // Fails every later operation with `why` and aborts the communicators (ProcessGroupNCCL::abort).
  void abort(const std::string& why) override;
  // Blocks the host until every channel's last operation completed (see Errors above).
  void synchronize() override;

 private:
  class Channel;
  Channel& channel(int c) const;
  NcclOptions opt_;
  std::vector<std::unique_ptr<Channel>> channels_;
};

}  // namespace aiacc::comm
