// FaultTransport: wraps a Transport and injects one fault at this rank's k-th operation (counted
// over every channel, from 0, in submission order), so that tests (ours and a user's) can check
// that a job ends, fast and loud, when one rank fails or hangs:
//   kFail:  operation k fails at once with a CommError saying so (it never reaches the peers,
//           who wait for it in vain); later operations pass through.
//   kStall: from operation k on, nothing reaches the peers: the rank hangs, alive and connected
//           (as with a stuck GPU or a deadlocked host). Its own waits block until abort(), the
//           destructor, or `stall_limit` after the stall began, then fail saying the rank stalled.
// Killing a rank outright (its sockets closed) needs no wrapper: kill the process.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "aiacc/comm/transport.h"

namespace aiacc::comm {

struct FaultSpec {
  enum class Kind { kNone, kFail, kStall };
  Kind kind = Kind::kNone;
  int64_t at = 0;  // the operation (0-based) the fault hits
  std::chrono::milliseconds stall_limit = kDefaultTimeout;
};

class FaultTransport : public Transport {
 public:
  FaultTransport(std::shared_ptr<Transport> inner, FaultSpec fault);
  ~FaultTransport() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int channels() const override { return inner_->channels(); }
  ChannelStats channelStats(int channel) const override { return inner_->channelStats(channel); }
  std::string describe() const override { return "faulty " + inner_->describe(); }
  bool waitsOnDevice() const override { return inner_->waitsOnDevice(); }
  void abort(const std::string& why) override;
  void synchronize() override { inner_->synchronize(); }

  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int channel) override;
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel) override;
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel) override;
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel) override;

  // Operations submitted so far, and whether the fault has struck.
  int64_t operations() const;
  bool struck() const;
  // When the fault struck (valid once struck()).
  std::chrono::steady_clock::time_point struckAt() const;

 public:
  // Shared with the stalled works (which may outlive the transport): set by abort() or the
  // destructor, it ends their waits.
  struct Release {
    std::mutex mu;
    std::condition_variable cv;
    std::string why;
  };

 private:
  class StalledWork;
  template <typename Op>
  std::shared_ptr<Work> run(const char* what, Op op);

  std::shared_ptr<Transport> inner_;
  FaultSpec fault_;
  std::shared_ptr<Release> release_ = std::make_shared<Release>();
  mutable std::mutex mu_;
  int64_t ops_ = 0;
  bool struck_ = false;
  std::chrono::steady_clock::time_point struck_at_;
};

}  // namespace aiacc::comm
