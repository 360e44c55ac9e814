// A clock a test moves itself (comm/clock.h): now() stands still until advance(). sleepFor
// returns after at most a millisecond of real time, with now() unchanged, so a waiter keeps
// looking at the state it waits on, and decides on time only once the test has moved it. Each
// sleep is counted per thread: awaitLooks() lets a test wait until every waiter has gone round
// its loop since a change (so it has seen it) before the test moves the time or asserts.
// A watchdog: once a minute of real time passes with no advance (an assertion ended the test while
// a waiter still waits, and the waiter's future would block for ever), the clock jumps a year, so
// every deadline passes and the waiter returns.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "aiacc/comm/clock.h"

namespace aiacc::test {

class ManualClock final : public comm::Clock {
 public:
  time_point now() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_;
  }
  void sleepFor(duration d) const override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++sleeps_[std::this_thread::get_id()];
      if (std::chrono::steady_clock::now() - moved_ > std::chrono::minutes(1)) {
        now_ += std::chrono::hours(24 * 365);
        moved_ = std::chrono::steady_clock::now();
      }
    }
    changed_.notify_all();
    std::this_thread::sleep_for(std::min<duration>(d, std::chrono::milliseconds(1)));
  }
  void advance(duration d) {
    std::lock_guard<std::mutex> lock(mutex_);
    now_ += d;
    moved_ = std::chrono::steady_clock::now();
  }
  // Waits (up to 20 s of real time; a failure of the test past it) until `threads` threads have
  // each slept `times` times since this call: each has looked again `times - 1` times at least
  // once whole. (A waiter reads the state, then sleeps: its second sleep from here follows a
  // whole look that began after the call.)
  void awaitLooks(int threads, int times = 2) const {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::map<std::thread::id, long> before = sleeps_;
    const bool done = changed_.wait_for(lock, std::chrono::seconds(20), [&] {
      int n = 0;
      for (const auto& [id, count] : sleeps_) {
        const auto b = before.find(id);
        n += count - (b == before.end() ? 0 : b->second) >= times ? 1 : 0;
      }
      return n >= threads;
    });
    EXPECT_TRUE(done) << "fewer than " << threads << " waiters went round their loop within 20 s";
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  mutable std::map<std::thread::id, long> sleeps_;
  mutable time_point now_ = time_point(std::chrono::hours(1));  // (any start: only differences count)
  mutable std::chrono::steady_clock::time_point moved_ =
      std::chrono::steady_clock::now();  // the last advance (real time)
};

}  // namespace aiacc::test
