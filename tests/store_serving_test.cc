// When a launcher that serves an elastic job's store beyond its own workers may stop
// (app/store_serving.h, mayStopServing): a table over the job's end, the waiters, the
// restarts and the time, each row on both sides of its deadline.
#include "app/store_serving.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>

namespace aiacc::app {
namespace {

using namespace std::chrono_literals;
using TimePoint = std::chrono::steady_clock::time_point;

TEST(StoreServing, StopsOnlyOnceNobodyCanStillNeedTheStore) {
  const TimePoint t0 = TimePoint(1h);  // (any start: only differences count)
  const TimePoint never = TimePoint::max();
  struct Row {
    const char* why;
    std::chrono::milliseconds since_start;              // now - t0
    std::optional<std::chrono::milliseconds> ended_at;  // the end first seen at t0 + this
    bool failed, restarts, waiters;
    TimePoint until;
    bool stop;
    bool asks;  // whether the waiters (a store request) are asked
  };
  const Row rows[] = {
      {"the job goes on", 5s, std::nullopt, false, false, false, never, false, false},
      {"the job goes on past any grace", 1h, std::nullopt, false, false, true, never, false, false},
      {"--rdzv-timeout not yet", 8s - 1ms, std::nullopt, false, false, false, t0 + 8s, false, false},
      {"--rdzv-timeout reached with the job still on", 8s, std::nullopt, false, false, false, t0 + 8s, true, false},
      {"--rdzv-timeout reached with waiters", 8s, 1s, false, false, true, t0 + 8s, true, false},
      {"ended, nobody waits", 1s, 1s, false, false, false, never, true, true},
      {"ended, a survivor below MIN still to read it", 1s, 1s, false, false, true, never, false, true},
      {"ended, a waiter within the grace", 11s - 1ms, 1s, false, false, true, never, false, true},
      {"ended, a waiter that died waiting: the grace is over", 11s, 1s, false, false, true, never, true, false},
      {"failed on every rank, no restarts, nobody waits", 1s, 1s, true, false, false, never, true, true},
      {"failed on every rank, restarts: workers started again read it", 1s, 1s, true, true, false, never, false, false},
      {"failed on every rank, restarts, within the grace", 11s - 1ms, 1s, true, true, false, never, false, false},
      {"failed on every rank, restarts, the grace over", 11s, 1s, true, true, true, never, true, false},
      {"stopped with restarts (not failed): nobody waits", 1s, 1s, false, true, false, never, true, true},
  };
  for (const Row& r : rows) {
    ServingFacts f;
    f.now = t0 + r.since_start;
    f.until = r.until;
    if (r.ended_at) f.ended = t0 + *r.ended_at;
    f.failed = r.failed;
    f.restarts = r.restarts;
    int asked = 0;
    f.waiters = [&] { return ++asked, r.waiters; };
    EXPECT_EQ(mayStopServing(f), r.stop) << r.why;
    EXPECT_EQ(asked, r.asks ? 1 : 0) << r.why;
  }
  EXPECT_EQ(kWaitersGrace, 10s) << "the rows above are written for a 10 s grace";
}

}  // namespace
}  // namespace aiacc::app
