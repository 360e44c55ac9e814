#include "aiacc/comm/gloo_pulse.h"

#include <algorithm>
#include <cstdint>
#include <exception>

#include "aiacc/common/error.h"

namespace aiacc::comm {
namespace {

constexpr uint8_t kAlive = 1, kLeaving = 2;
constexpr uint64_t kPulseSlot = 1;  // the context carries nothing else

}  // namespace

GlooPulse::GlooPulse(std::shared_ptr<gloo::rendezvous::Context> context, std::chrono::milliseconds timeout,
                     std::function<void(const std::string&)> on_lost)
    : context_(std::move(context)), timeout_(timeout), period_(std::max(std::chrono::milliseconds(50), timeout / 6)),
      on_lost_(std::move(on_lost)), thread_([this] { loop(); }) {}

GlooPulse::~GlooPulse() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool GlooPulse::stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

// A Gloo send completes only once the receiver has posted its receive, so every rank keeps one
// receive from its left posted at all times (the next one goes up as soon as one completes,
// before the pause): a send waits only for a receiver that stopped, and a ring of senders never
// waits on itself. A timeout on either side is silence: the send's names the right neighbour (it
// posts no receive: stopped), the receive's the left one (it sends nothing).
void GlooPulse::loop() {
  const int P = context_->size, r = context_->rank;
  if (P == 1) return;
  const int right = (r + 1) % P, left = (r + P - 1) % P;
  uint8_t out = kAlive, in = 0;
  auto send = context_->createUnboundBuffer(&out, 1);
  auto recv = context_->createUnboundBuffer(&in, 1);
  // Says "leaving" to the right neighbour, as far as it still listens (errors are no news then).
  auto leave = [&] {
    try {
      out = kLeaving;
      send->send(right, kPulseSlot);
      send->waitSend(timeout_);
    } catch (const std::exception&) {
    }
  };
  // Whether an error from Gloo is its application timeout (silence), not a closed link.
  auto timedOut = [](const std::exception& e) { return firstLine(e.what()).find("Timed out") != std::string::npos; };
  auto silent = [&](int peer, std::chrono::steady_clock::time_point since) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    on_lost_(strCat("gloo: rank ", peer, " stopped responding: no heartbeat for ", waited,
                    " s (its process is stopped, e.g. by SIGSTOP or a debugger, or hangs, or the network to it "
                    "went silent)"));
  };
  try {
    recv->recv(left, kPulseSlot);
  } catch (const std::exception&) {  // a link closed already: its peer left or died
    return leave();
  }
  for (;;) {
    if (stopping()) return leave();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      out = kAlive;
      send->send(right, kPulseSlot);
      send->waitSend(timeout_);
    } catch (const std::exception& e) {
      if (stopping() || !timedOut(e))
        return leave();  // a closed link: its peer left or died (the data channels say which)
      return silent(right, t0);
    }
    try {
      recv->waitRecv(timeout_);
    } catch (const std::exception& e) {
      if (stopping() || !timedOut(e)) return leave();
      return silent(left, t0);
    }
    if (in == kLeaving) return leave();  // the job is ending: pass it on, stop watching
    try {
      recv->recv(left, kPulseSlot);
    } catch (const std::exception&) {
      return leave();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, period_, [&] { return stop_; });
  }
}

}  // namespace aiacc::comm
