// Time as the elastic protocol's waits see it: Membership::join's last call, its below-MIN
// timeout and the beat it watches (comm/membership.h). Production code uses steadyClock(); a test
// injects a clock it moves itself (tests/manual_clock.h), so that a decision that waits an hour
// is tested in milliseconds, and one that must not happen before a deadline is tested without a
// race against the machine's load (leveldb's Env, which injects time the same way, is the model).
//
// Contract: now() never goes back. sleepFor(d) returns after at least d of real time on the
// steady clock; on a test's clock it may return sooner, with now() unchanged, so every caller
// loops: it sleeps, then reads now() and the state it waits on again, never assuming that d passed.
#pragma once

#include <chrono>
#include <memory>

namespace aiacc::comm {

class Clock {
 public:
  using duration = std::chrono::steady_clock::duration;
  using time_point = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;
  virtual time_point now() const = 0;
  // Waits up to `d` (see the contract above): between two looks at what the caller waits for.
  virtual void sleepFor(duration d) const = 0;
};

// std::chrono::steady_clock, and std::this_thread::sleep_for: the one every process uses.
std::shared_ptr<const Clock> steadyClock();

}  // namespace aiacc::comm
