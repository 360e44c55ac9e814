// Elastic membership's tests (tests/membership_test.cc, tests/membership_end_test.cc): processes
// as threads over one store, each joining on a thread of its own, every join bounded.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "aiacc/comm/membership.h"
#include "tests/manual_clock.h"

namespace aiacc::comm::test_membership {

using namespace std::chrono_literals;
constexpr auto kBound = 20s;

inline MembershipOptions options(int min, int max, std::chrono::milliseconds last_call = 1h) {
  MembershipOptions o;
  o.min = min;
  o.max = max;
  o.last_call = last_call;
  o.timeout = 1h;
  o.poll = 2ms;
  return o;
}

inline Member fresh(const std::string& node) {
  Member m;
  m.node = node;
  return m;
}

inline Member survivor(const Generation& g, int64_t step) {
  Member m = g.members[static_cast<size_t>(g.rank)];
  m.generation = g.number;
  m.rank = g.rank;
  m.step = step;
  return m;
}

// The generation a join returned; throws (failing the test) when it returned the job's end.
inline Generation joined(Membership::Joined j) {
  if (const JobEnded* e = std::get_if<JobEnded>(&j)) throw std::logic_error("join returned the job's end: " + e->what);
  return std::get<Generation>(std::move(j));
}
// The job's end a join returned; throws (failing the test) when it joined a generation.
inline JobEnded ended(Membership::Joined j) {
  if (const Generation* g = std::get_if<Generation>(&j)) {
    throw std::logic_error("join let the process into generation " + std::to_string(g->number) +
                           " instead of returning the job's end");
  }
  return std::get<JobEnded>(std::move(j));
}

// A join on a thread of its own.
using Pending = std::future<Membership::Joined>;

// Joins on a thread of its own; the future fails the test if it takes longer than kBound.
inline Pending joinAsync(const c10::intrusive_ptr<c10d::Store>& store, MembershipOptions o, Member self,
                         std::vector<int> lost = {}, int previous_world = 0) {
  return std::async(std::launch::async, [=] {
    Membership m(store, o);
    return m.join(self, lost, previous_world);
  });
}

inline Membership::Joined wait(Pending& f) {
  EXPECT_EQ(f.wait_for(kBound), std::future_status::ready) << "join did not return within the bound";
  return f.get();
}
inline Generation get(Pending& f) { return joined(wait(f)); }

// Moves `clock` by `d` in two moves, each once the `waiters` joins have looked again: to 1 ms
// before, where `f` must still be waiting (a failure naming `what` if it returned), then the last
// millisecond. So a test shows that a join decided at `d` of its time, not a moment before.
inline ::testing::AssertionResult waitsOut(aiacc::test::ManualClock& clock, Pending& f, Clock::duration d,
                                           const char* what, int waiters = 1) {
  clock.awaitLooks(waiters);
  clock.advance(d - 1ms);
  clock.awaitLooks(waiters);
  if (f.wait_for(0ms) != std::future_status::timeout) return ::testing::AssertionFailure() << what;
  clock.advance(1ms);
  return ::testing::AssertionSuccess();
}

// The first generation of one process per node: closed when MAX (all of them) have come.
inline std::vector<Generation> formFirst(const c10::intrusive_ptr<c10d::Store>& store,
                                         const std::vector<std::string>& nodes, int min) {
  std::vector<Pending> pending;
  for (const std::string& node : nodes) {
    pending.push_back(joinAsync(store, options(min, static_cast<int>(nodes.size())), fresh(node)));
  }
  std::vector<Generation> out;
  for (auto& f : pending) out.push_back(get(f));
  return out;
}

}  // namespace aiacc::comm::test_membership
