// OpTiming: the traffic bookkeeping of one channel whose operations complete asynchronously
// (NcclTransport: the device runs them after submission returns), so that ChannelStats count
// bytes and busy time of the same operations, and the bookkeeping holds on to a bounded number
// of them whatever the caller does.
//
//   - submitted(op): records an operation with its payload bytes and two callbacks: done()
//     (non-blocking: has it finished?) and seconds() (its execution time, asked once, after
//     done(); 0 when unmeasured). Completed operations at the front are retired first, so the
//     queue holds only what may still be running.
//   - Operations of one channel finish in submission order (one stream), so retirement stops
//     at the first one still running.
//   - At most `max_in_flight` operations are kept: past that, the oldest is dropped unretired
//     and counted in dropped(); its bytes and time are then both left out (a rate from bytes
//     counted without their time, or the other way round, would be biased).
//   - stats(): retires what completed, then returns the sums over retired operations: bytes and
//     seconds of the same operations.
// Thread-safe; the callbacks run under its lock (keep them short and non-blocking).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "aiacc/comm/transport.h"

namespace aiacc::comm {

class OpTiming {
 public:
  struct Op {
    double bytes = 0;
    std::function<bool()> done;
    std::function<double()> seconds;
  };

  explicit OpTiming(size_t max_in_flight = 256) : max_(max_in_flight < 1 ? 1 : max_in_flight) {}

  void submitted(Op op) {
    std::lock_guard<std::mutex> lock(mu_);
    retireLocked();
    while (queue_.size() >= max_) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.push_back(std::move(op));
  }

  ChannelStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    retireLocked();
    return stats_;
  }

  // Operations recorded and not yet retired (bounded by max_in_flight).
  size_t inFlight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
  }
  int64_t dropped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_;
  }

 private:
  void retireLocked() {
    while (!queue_.empty() && queue_.front().done()) {
      Op& op = queue_.front();
      stats_.bytes += op.bytes;
      stats_.busy_s += op.seconds ? op.seconds() : 0.0;
      queue_.pop_front();
    }
  }

  const size_t max_;
  mutable std::mutex mu_;
  std::deque<Op> queue_;
  ChannelStats stats_;
  int64_t dropped_ = 0;
};

}  // namespace aiacc::comm
