// Transport: the one interface for collective communication, over contiguous tensors.
//
// Every call is asynchronous: it enqueues the operation on a channel and returns a Work whose
// wait() blocks until it is done and rethrows any error raised in the background (a timeout, a
// dead peer). Operations on one channel run in submission order, so every rank must submit the
// same sequence of operations per channel (the DataParallel bucket order guarantees this).
// A channel is one independent communicator (a Gloo context with its own thread, or an NCCL
// communicator with its own CUDA stream); channels run concurrently.
//
// The library's implementations (not installed; initProcessGroup picks them): GlooTransport
// (CPU, TCP); HierarchicalTransport, two-level reduction composed of an intra-node and an
// inter-node transport; NcclTransport (GPU, ProcessGroupNCCL); ShmTransport (CPU ranks of one
// host, shared memory); ThrottledTransport (a slowed wrapper for its tests). A program's own
// tests wrap one in FaultTransport (aiacc::comm_testing, fault_transport.h).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aiacc/config.h"  // the build's options, and its refusal of the other C++ ABI
#include "aiacc/comm/comm_error.h"
#include "aiacc/comm/failure.h"
#include "aiacc/comm/timeout.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {

class Work {
 public:
  virtual ~Work() = default;
  // Waits for the operation and rethrows its error. Where the transport's waitsOnDevice() is
  // false this blocks the host until the operation is done. Where it is true (NCCL), for device
  // tensors it makes the caller's current stream wait for the operation and returns at once (an
  // error found later is raised by synchronize(), or by the next operation or wait() on the
  // channel); for host tensors it blocks until the result is in place.
  virtual void wait() = 0;
  // wait(), then blocks the host until the operation is done on the device too, rethrowing its
  // error: for a caller about to read the result on the host. The same as wait() where wait()
  // already blocks.
  virtual void synchronize() { wait(); }
  // Without blocking: the operation's failure once it is known (what wait() will raise); none
  // while it runs, after it succeeded, and where the transport cannot tell without blocking (the
  // default; NCCL). For a caller with other work to do that would rather stop than finish it for
  // nothing: the Reducer ends backward when a bucket of the step has failed already.
  virtual Failure failure() const { return Failure(); }
};

// The first failure any of `works` is known to have met, without blocking (Work::failure()).
inline Failure firstFailure(const std::vector<std::shared_ptr<Work>>& works) {
  for (const auto& w : works) {
    if (Failure f = w->failure()) return f;
  }
  return Failure();
}

// Waits for every work in order (host: synchronize() instead of wait()), even after one failed:
// their buffers must outlive them all. The first failure calls abort(abortReason(it)) before
// anything else is waited for, so the works behind it (queued, or stalled on another channel)
// end at once instead of each waiting out its timeout; that first error is then rethrown.
inline void waitAll(const std::vector<std::shared_ptr<Work>>& works, bool host,
                    const std::function<void(const std::string&)>& abort) {
  std::exception_ptr first;  // caught on this thread: never shared with another
  for (const auto& w : works) {
    try {
      if (host) {
        w->synchronize();
      } else {
        w->wait();
      }
    } catch (const std::exception& e) {
      if (first) continue;
      first = std::current_exception();
      abort(abortReason(e));
    }
  }
  if (first) std::rethrow_exception(first);
}

enum class ReduceOp { kSum, kBitwiseOr };

// Cumulative traffic of one channel, measured where the operations execute: payload bytes and
// seconds spent executing them (waiting for peers included).
// Shards of an n-element buffer split into `parts`: the first n % parts shards hold one element
// more. Reduce-scatter leaves rank r's sum in shard r; allgatherShards spreads every shard.
struct Shard {
  int64_t offset = 0;
  int64_t count = 0;
};
inline Shard shardOf(int64_t n, int parts, int index) {
  const int64_t base = n / parts, rem = n % parts;
  return {index * base + std::min<int64_t>(index, rem), base + (index < rem ? 1 : 0)};
}

struct ChannelStats {
  double bytes = 0;
  double busy_s = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int channels() const = 0;
  virtual ChannelStats channelStats(int channel) const = 0;
  // One line for reports and logs, e.g. "gloo, 2 channels".
  virtual std::string describe() const = 0;
  // True when Work::wait() orders the caller's device stream after the operation and returns at
  // once (NCCL), false when it blocks the host until the operation is done (Gloo, shared memory).
  // A composite transport that chains operations on device-ordered transports submits them all
  // from the caller's thread, so every rank submits to each communicator in the same order.
  virtual bool waitsOnDevice() const { return false; }
  // Blocks the host until every operation submitted so far is done (on the device too), and
  // raises the first error any of them met: for a caller about to read on the host what those
  // operations produced (a device-ordered transport's wait() returns before). Nothing to do for
  // a transport whose wait() blocks the host (the default); a composite one forwards it.
  virtual void synchronize() {}
  // Gives up: every queued and later operation fails at once with a CommError saying `why`. An
  // operation already running ends at once too where the transport can interrupt it (shared
  // memory within 20 ms, Gloo at once; on this rank and on the peers waiting for it), otherwise
  // within its timeout. The transport is unusable afterwards. For a rank that knows the job is
  // lost (a peer died, a signal) and must not wait out each queued operation.
  virtual void abort(const std::string& why) = 0;

  // In place: t becomes the elementwise reduction of every rank's t. float16/float32/float64 (sum) or
  // uint8/int32/int64 (sum, bitwise or).
  virtual std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op = ReduceOp::kSum, int channel = 0) = 0;
  // In place: every rank's t becomes root's t.
  virtual std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel = 0) = 0;
  // out (size() * in.numel() elements) receives every rank's in, in rank order.
  virtual std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel = 0) = 0;
  // In place, float16/float32/float64 sum: afterwards t's shard shardOf(t.numel(), size(), rank())
  // holds the sum of every rank's t over that shard; the rest of t is unspecified. Any size.
  virtual std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel = 0) = 0;
  // In place: every rank's shard shardOf(t.numel(), size(), r) of t, from rank r, to every rank.
  virtual std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel = 0) = 0;
};

}  // namespace aiacc::comm
