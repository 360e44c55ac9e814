// Transport: the one interface for collective communication, over contiguous tensors.
//
// Every call is asynchronous: it enqueues the operation on a channel and returns a Work whose
// wait() blocks until it is done and rethrows any error raised in the background (a timeout, a
// dead peer). Operations on one channel run in submission order, so every rank must submit the
// same sequence of operations per channel (the DataParallel bucket order guarantees this).
// A channel is one independent communicator (a Gloo context with its own thread, or an NCCL
// communicator with its own CUDA stream); channels run concurrently.
//
// Implementations: GlooTransport (CPU, TCP; gloo_transport.h). NcclTransport (GPU) is added
// with the GPU path; makeTransport() picks one.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "common/error.h"

namespace aiacc::comm {

// Raised when communication fails: timeout, a peer gone, a mismatch between ranks.
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(what) {}
};

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation finished; rethrows its error.
  virtual void wait() = 0;
};

enum class ReduceOp { kSum, kBitwiseOr };

// Cumulative traffic of one channel, measured where the operations execute: payload bytes and
// seconds spent executing them (waiting for peers included).
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

  // In place: t becomes the elementwise reduction of every rank's t. float16/float32/float64 (sum) or
  // uint8/int32/int64 (sum, bitwise or).
  virtual std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op = ReduceOp::kSum,
                                          int channel = 0) = 0;
  // In place: every rank's t becomes root's t.
  virtual std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel = 0) = 0;
  // out (size() * in.numel() elements) receives every rank's in, in rank order.
  virtual std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel = 0) = 0;
  // out (in.numel() / size() elements) receives this rank's shard of the sum of every rank's in.
  virtual std::shared_ptr<Work> reduceScatter(at::Tensor in, at::Tensor out, int channel = 0) = 0;
};

}  // namespace aiacc::comm
