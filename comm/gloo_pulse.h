// Internal to GlooTransport (not installed). GlooPulse: heartbeats between the ranks of a
// GlooTransport, so that a peer that is alive to TCP but makes no progress (SIGSTOP, a hung
// process, a network path that went silent) is named within heartbeat_timeout instead of after
// the collective timeout. A dead peer needs none of this: its sockets close.
//
// On a Gloo context of its own, ranks form a ring: every period (timeout / 6) each rank sends one
// byte to its right neighbour and waits up to `timeout` for one from its left. Nothing from the
// left in that time, or a right neighbour that takes no byte in that time, calls on_lost once
// with "gloo: rank Q stopped responding ...". Every rank
// watches one peer, and the store is not involved (it lives in rank 0's process, which may be
// the one that stopped). A rank that leaves says so (one "leaving" byte); so does one whose left
// neighbour's link closed (it left, or died: the data channels' sockets say which). The byte is
// passed round the ring and every rank stops watching, so that the end of a job, where ranks
// leave one by one, is never taken for a stopped peer.
#pragma once

#include <gloo/rendezvous/context.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace aiacc::comm {

class GlooPulse {
 public:
  // Starts the ring at once (every rank must construct one, on a context of its own).
  GlooPulse(std::shared_ptr<gloo::rendezvous::Context> context, std::chrono::milliseconds timeout,
            std::function<void(const std::string&)> on_lost);
  // Says "leaving" to the right neighbour and stops: within one period while the left neighbour
  // beats, within `timeout` when it is stopped (on_lost is not called then).
  ~GlooPulse();
  GlooPulse(const GlooPulse&) = delete;
  GlooPulse& operator=(const GlooPulse&) = delete;

 private:
  void loop();
  bool stopping();

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::chrono::milliseconds timeout_, period_;
  std::function<void(const std::string&)> on_lost_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace aiacc::comm
