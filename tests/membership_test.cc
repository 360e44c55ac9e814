// Elastic membership (comm/membership.h): processes as threads over one store (an in-memory one,
// and a real TCPStore served the way a launcher serves it). Who is in a generation, in which
// order, when it closes, what happens below MIN and to a late arrival, and that old keys go.
// Where a close must come early (every rank accounted for), the last call is an hour: a test
// that failed to close early would fail at its 20 s bound, never pass by waiting.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <algorithm>
#include <thread>
#include <vector>

#include "aiacc/comm/membership.h"
#include "aiacc/comm/store.h"
#include "aiacc/comm/transport.h"
#include "tests/membership_util.h"
#include "tests/test_util.h"

namespace aiacc::comm {
namespace {

using namespace std::chrono_literals;
using test_membership::ended;
using test_membership::formFirst;
using test_membership::fresh;
using test_membership::get;
using test_membership::joinAsync;
using test_membership::kBound;
using test_membership::options;
using test_membership::Pending;
using test_membership::survivor;
using test_membership::wait;
using test_membership::waitsOut;

TEST(Membership, MaxArrivalsCloseTheFirstGeneration) {
  auto store = makeHashStore();
  const std::vector<Generation> g = formFirst(store, {"a", "a", "b"}, 2);
  std::vector<int> ranks;
  for (const Generation& x : g) {
    EXPECT_EQ(x.number, 0);
    EXPECT_EQ(x.size(), 3);
    ranks.push_back(x.rank);
  }
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2}));
  for (const Generation& x : g) {
    const WorldInfo w = x.world();
    EXPECT_EQ(w.world, 3);
    EXPECT_EQ(w.local_size, x.members[static_cast<size_t>(x.rank)].node == "a" ? 2 : 1);
    EXPECT_EQ(x.survivors(), 0) << "nobody comes from a generation before the first";
  }
  EXPECT_EQ(Membership(store, options(2, 3)).current(), 0);
}

// Newcomers with a launcher's rank keep it in the first generation, whatever their arrival order.
TEST(Membership, AFirstGenerationKeepsTheLaunchersRanks) {
  auto store = makeHashStore();
  std::vector<Pending> pending;
  for (int r : {2, 0, 1}) {
    Member m = fresh("n");
    m.rank = r;
    pending.push_back(joinAsync(store, options(3, 3), m));
    std::this_thread::sleep_for(2ms);
  }
  for (int r : {2, 0, 1}) EXPECT_EQ(get(pending[static_cast<size_t>(r == 2 ? 0 : r + 1)]).rank, r);
}

// Rank 1 of three is lost. The two others, one of which reports it, form the next generation
// at once (nobody left to wait for), the one at the higher step first.
TEST(Membership, SurvivorsCloseAtOnceWhenEveryRankIsAccountedForMostAdvancedFirst) {
  auto store = makeHashStore();
  const std::vector<Generation> g0 = formFirst(store, {"a", "b", "c"}, 2);
  std::vector<Pending> next;
  for (const Generation& x : g0) {
    if (x.rank == 1) continue;
    const int64_t step = x.rank == 2 ? 10 : 9;  // rank 2 completed one step more
    next.push_back(joinAsync(store, options(2, 3), survivor(x, step),
                             x.rank == 0 ? std::vector<int>{1} : std::vector<int>{}, 3));
  }
  for (auto& f : next) {
    const Generation g1 = get(f);
    EXPECT_EQ(g1.number, 1);
    ASSERT_EQ(g1.size(), 2);
    EXPECT_EQ(g1.members[0].rank, 2);  // the survivor at step 10 is the new rank 0
    EXPECT_EQ(g1.members[0].step, 10);
    EXPECT_EQ(g1.members[1].rank, 0);
    EXPECT_EQ(g1.survivors(), 2);
    EXPECT_EQ(g1.lostFrom(3), std::vector<int>{1});
  }
}

// A process started later waits for the next generation; the running group sees it (one check)
// and regroups: survivors first, the newcomer last.
// The newcomer says it waits (MembershipOptions::waiting_to_join) once it has arrived: from then
// on the running group's joinersWaiting sees it. The survivors say nothing.
TEST(Membership, ANewcomerIsSeenAndJoinsAfterTheSurvivors) {
  auto store = makeHashStore();
  const std::vector<Generation> g0 = formFirst(store, {"a", "b"}, 1);
  Membership running(store, options(1, 3));
  EXPECT_FALSE(running.joinersWaiting(g0[0]));
  std::atomic<int64_t> waits_for{-1};
  std::atomic<int> said{0};
  MembershipOptions joining = options(1, 3), surviving = options(1, 3);
  joining.waiting_to_join = [&](int64_t g) { waits_for = g, ++said; };
  surviving.waiting_to_join = [&](int64_t) { ++said; };
  auto newcomer = joinAsync(store, joining, fresh("c"));
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (said == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(waits_for, 1);
  ASSERT_TRUE(running.joinersWaiting(g0[0]));
  std::vector<Pending> old;
  for (const Generation& x : g0) old.push_back(joinAsync(store, surviving, survivor(x, 5), {}, 2));
  const Generation joined = get(newcomer);
  EXPECT_EQ(joined.number, 1);
  EXPECT_EQ(joined.rank, 2);
  EXPECT_EQ(joined.members[2].generation, -1);
  EXPECT_TRUE(joined.isSurvivor(0) && joined.isSurvivor(1));
  EXPECT_FALSE(joined.isSurvivor(2));
  EXPECT_FALSE(g0[0].isSurvivor(0));  // (nobody survives into the first generation)
  for (auto& f : old) {
    const Generation g1 = get(f);
    EXPECT_LT(g1.rank, 2);
    EXPECT_EQ(g1.members[static_cast<size_t>(g1.rank)].rank, g1.rank);  // the order of old ranks kept
  }
  EXPECT_EQ(said, 1) << "only the newcomer said it waits";
}

// A newcomer alone at MIN (1) does not close the next generation while the one before beats (its
// members alive, in a long step, an evaluation or a failed set-up): it waits for them, well past
// its last call and past beat_stale, and the generation forms with both of them, survivors first
// (its last call runs from the first survivor's arrival, not from its own). Once
// nobody beats for the newest generation (its members gone at once), a newcomer closes the next
// alone after beat_stale. (Before, the newcomer closed generation 1 alone at its last call: a job
// begun again beside the live one, whose members then found generation 1 closed without them.)
TEST(Membership, ANewcomerAtMinWaitsForALiveGenerationAndClosesAloneOnlyOnceItsBeatStops) {
  auto store = makeHashStore();
  const std::vector<Generation> g0 = formFirst(store, {"a", "b"}, 1);
  auto clock = std::make_shared<aiacc::test::ManualClock>();
  MembershipOptions o = options(1, 3, 500ms);
  o.beat_stale = 500ms;
  o.clock = clock;
  // Generation 0 beats every 100 ms of the newcomer's time, for 4 times its last call and beat_stale.
  auto newcomer = joinAsync(store, o, fresh("c"));
  for (int i = 0; i < 20; ++i) {
    beat(*store, 0);
    clock->awaitLooks(1);
    ASSERT_EQ(newcomer.wait_for(0ms), std::future_status::timeout) << "a newcomer closed a generation alone";
    clock->advance(100ms);
  }
  std::vector<Pending> old;
  for (const Generation& x : g0) old.push_back(joinAsync(store, o, survivor(x, 5), {}, 2));
  const Generation joined = get(newcomer);
  EXPECT_EQ(joined.number, 1);
  EXPECT_EQ(joined.size(), 3);
  EXPECT_EQ(joined.rank, 2);
  for (auto& f : old) EXPECT_EQ(get(f).survivors(), 2);
  // Nobody beats for generation 1: its members are gone. A newcomer forms generation 2 alone once
  // the beat stood still for beat_stale and its last call ran out after that, not before. (The
  // last call runs from its last look that found the beat alive: here 1 ms before it was stale.)
  auto alone = joinAsync(store, o, fresh("d"));
  ASSERT_TRUE(waitsOut(*clock, alone, o.beat_stale, "closed before the beat stood still for beat_stale"));
  ASSERT_TRUE(waitsOut(*clock, alone, o.last_call - 1ms, "closed before its last call ran out"));
  const Generation g2 = get(alone);
  EXPECT_EQ(g2.number, 2);
  EXPECT_EQ(g2.size(), 1);
  EXPECT_EQ(g2.survivors(), 0);
}

// Newcomers alone at MIN do not begin a job that has ended (a worker restarted after the end):
// they are told so, as below MIN; and while the running generation beats but never lets them in,
// they give up after MembershipOptions::timeout instead of waiting for ever.
TEST(Membership, NewcomersAloneAtMinNeitherBeginAnEndedJobNorWaitForEver) {
  auto store = makeHashStore();
  const std::vector<Generation> g0 = formFirst(store, {"a", "b"}, 1);
  auto clock = std::make_shared<aiacc::test::ManualClock>();
  MembershipOptions o = options(1, 3, 20ms);
  o.beat_stale = 1h;  // (the beat never stands still for that long here)
  o.timeout = 300ms;
  o.clock = clock;
  beat(*store, 0);
  auto stuck = joinAsync(store, o, fresh("c"));
  ASSERT_TRUE(waitsOut(*clock, stuck, o.timeout, "gave up before the timeout"));
  try {
    get(stuck);
    ADD_FAILURE() << "a newcomer formed a generation of its own beside a live one";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("generation 0 is alive but did not let this process in within 0.3 s"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(e.remedy(), CommError::Remedy::kMembership);
  }
  markJobEnded(*store);
  o.timeout = 5s;
  auto late = joinAsync(store, o, fresh("d"));
  EXPECT_EQ(ended(wait(late)).how, JobEnd::kFinished);
  EXPECT_FALSE(waitersRemain(*store));  // each said it left
}

// Once MIN have come and nobody accounts for the rest, the last call closes the generation; a
// process arriving after that is not in it and is let in by the next one.
TEST(Membership, TheLastCallClosesAtMinAndALateArrivalWaitsForTheNext) {
  auto store = makeHashStore();
  auto clock = std::make_shared<aiacc::test::ManualClock>();
  MembershipOptions o = options(2, 3, 50ms);
  o.clock = clock;
  auto a = joinAsync(store, o, fresh("a"));
  auto b = joinAsync(store, o, fresh("b"));
  ASSERT_TRUE(waitsOut(*clock, a, o.last_call, "closed before the last call ran out", 2));
  const Generation ga = get(a), gb = get(b);
  EXPECT_EQ(ga.number, 0);
  EXPECT_EQ(ga.size(), 2);
  auto late = joinAsync(store, o, fresh("c"));
  // The group regroups once it sees the newcomer (else the survivors alone might close it).
  Membership running(store, options(2, 3));
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (!running.joinersWaiting(ga) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  auto a1 = joinAsync(store, options(2, 3), survivor(ga, 1), {}, 2);
  auto b1 = joinAsync(store, options(2, 3), survivor(gb, 1), {}, 2);
  const Generation gl = get(late);
  EXPECT_EQ(gl.number, 1);
  EXPECT_EQ(gl.size(), 3);
  EXPECT_EQ(gl.rank, 2);
  get(a1);
  get(b1);
}

TEST(Membership, BelowMinFailsAfterTheTimeoutNamingTheCount) {
  auto store = makeHashStore();
  auto clock = std::make_shared<aiacc::test::ManualClock>();
  MembershipOptions o = options(2, 3);
  o.timeout = 1h;
  o.clock = clock;
  auto alone = joinAsync(store, o, fresh("a"));
  ASSERT_TRUE(waitsOut(*clock, alone, o.timeout, "gave up before the timeout"));
  try {
    get(alone);
    FAIL() << "a generation of one formed below MIN 2";
  } catch (const CommError& e) {
    EXPECT_EQ(e.remedy(), CommError::Remedy::kMembership);
    EXPECT_NE(std::string(e.what()).find("only 1 of at least 2 processes arrived for generation 0 within 3600 s"),
              std::string::npos)
        << e.what();
  }
}

// A process that waits to join a job that then ends is told so, not left waiting.
TEST(Membership, AProcessWaitingToJoinAJobThatEndedIsToldSo) {
  auto store = makeHashStore();
  const std::vector<Generation> g0 = formFirst(store, {"a", "b"}, 2);
  auto late = joinAsync(store, options(2, 3), fresh("c"));
  std::this_thread::sleep_for(20ms);
  markJobEnded(*store);
  EXPECT_EQ(late.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(ended(late.get()).how, JobEnd::kFinished);
}

// Each close deletes the keys of the generation two before it.
TEST(Membership, OldGenerationsKeysAreDeleted) {
  auto store = makeHashStore();
  std::vector<Generation> g = formFirst(store, {"a", "b"}, 2);
  for (int64_t n = 1; n <= 3; ++n) {
    // One member of each generation claims the save (claimSave); the other is told it is taken.
    EXPECT_TRUE(claimSave(*store, g[1].number));
    EXPECT_FALSE(claimSave(*store, g[0].number));
    EXPECT_FALSE(claimSave(*store, g[1].number));
    std::vector<Pending> next;
    for (const Generation& x : g) next.push_back(joinAsync(store, options(2, 2), survivor(x, n), {}, 2));
    for (size_t i = 0; i < next.size(); ++i) g[i] = get(next[i]);
    EXPECT_EQ(g[0].number, n);
  }
  for (const char* k : {"arrivals", "roster", "closed", "m0", "m1", "survivors", "saver"}) {
    EXPECT_FALSE(store->check({std::string("elastic/g0/") + k})) << k;
    EXPECT_FALSE(store->check({std::string("elastic/g1/") + k})) << k;
  }
  EXPECT_TRUE(store->check({"elastic/g3/roster"}));
  EXPECT_TRUE(store->check({"elastic/g2/roster"}));
  EXPECT_TRUE(store->check({"elastic/g2/saver"}));
}

// Over the real engine, served by a process that is none of the members (as aiacc's launcher
// serves it): a generation of three, then two after one is lost.
TEST(Membership, OverATcpStoreServedOutsideTheMembers) {
  const int port = aiacc::test::freePort();
  auto server = hostStore(port, 3, 30s);
  auto client = [&] {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port);
    o.isServer = false;
    o.timeout = 30s;
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o));
  };
  std::vector<Pending> first;
  for (int i = 0; i < 3; ++i) first.push_back(joinAsync(client(), options(3, 3), fresh("n" + std::to_string(i))));
  std::vector<Generation> g0;
  for (auto& f : first) g0.push_back(get(f));
  std::vector<Pending> next;
  for (const Generation& x : g0) {
    if (x.rank != 0) next.push_back(joinAsync(client(), options(2, 3), survivor(x, 4), {0}, 3));
  }
  for (auto& f : next) {
    const Generation g1 = get(f);
    EXPECT_EQ(g1.size(), 2);
    EXPECT_EQ(g1.lostFrom(3), std::vector<int>{0});
  }
}

TEST(Membership, RecordsRoundTripAndANodeWithASpaceIsRefused) {
  Member m;
  m.generation = 4;
  m.rank = 2;
  m.step = 1234;
  m.node = "host-7:0";
  const Member back = decodeMember(encodeMember(m));
  EXPECT_EQ(back.generation, 4);
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.step, 1234);
  EXPECT_EQ(back.node, "host-7:0");
  EXPECT_EQ(decodeMember(encodeMember(Member{})).node, "");
  m.node = "two words";
  EXPECT_THROW(encodeMember(m), Error);
  EXPECT_THROW(Membership(makeHashStore(), options(3, 2)), InputError);
}

}  // namespace
}  // namespace aiacc::comm
