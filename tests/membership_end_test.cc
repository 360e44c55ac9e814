// Elastic membership (comm/membership.h) at a job's end, and the one election of the survivor
// that saves: processes as threads over one in-memory store. How a survivor below MIN and a waiting
// newcomer learn how the job ended, which end wins, who the launcher still serves the store for,
// and who may save.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/comm/membership.h"
#include "aiacc/comm/store.h"
#include "tests/membership_util.h"

namespace aiacc::comm {
namespace {

using namespace std::chrono_literals;
using test_membership::ended;
using test_membership::formFirst;
using test_membership::fresh;
using test_membership::joinAsync;
using test_membership::joined;
using test_membership::kBound;
using test_membership::options;
using test_membership::survivor;

// Survivors below MIN each wait out their own timeout; the first to give up stops the job
// (JobEnd::kStopped). A survivor still waiting then stops as it did (a CommError saying so, the
// below-MIN remedy: resumable, and it saves its state if it claims the save first), never as a finished job's
// straggler; a newcomer, which holds nothing, is told how the job ended (JobEnded, and ends so:
// app/exit_code.h). After kFinished a survivor too has nothing left to do.
TEST(Membership, ASurvivorWaitingBelowMinStopsWhenAnotherStoppedTheJob) {
  for (JobEnd how : {JobEnd::kStopped, JobEnd::kStoppedUnsaved, JobEnd::kFinished}) {
    auto store = makeHashStore();
    const std::vector<Generation> g0 = formFirst(store, {"a", "b", "c"}, 3);
    auto waiting = joinAsync(store, options(3, 3), survivor(g0[1], 1), {2}, 3);
    auto late = joinAsync(store, options(3, 3), fresh("d"));
    std::this_thread::sleep_for(20ms);
    markJobEnded(*store, how);
    markJobEnded(*store, JobEnd::kFinished);  // (a later finish never hides a stop)
    EXPECT_EQ(jobEndedHow(*store), how);
    ASSERT_EQ(waiting.wait_for(kBound), std::future_status::ready);
    ASSERT_EQ(late.wait_for(kBound), std::future_status::ready);
    const JobEnded told = ended(late.get());  // (a newcomer that joined an ended job fails here)
    EXPECT_EQ(told.how, how) << told.what;
    if (how == JobEnd::kFinished) {
      EXPECT_EQ(ended(waiting.get()).how, JobEnd::kFinished);
      continue;
    }
    try {
      const Membership::Joined j = waiting.get();
      ADD_FAILURE() << (std::holds_alternative<JobEnded>(j)
                            ? "a survivor of a stopped job was told it had nothing left to do: " +
                                  std::get<JobEnded>(j).what
                            : std::string("a survivor joined a stopped job"));
    } catch (const CommError& e) {
      EXPECT_EQ(e.remedy(), CommError::Remedy::kMembership);
      EXPECT_NE(std::string(e.what()).find("another surviving process stopped the job"), std::string::npos) << e.what();
    }
  }
}

// A stop that saved the state is the job's end whatever was said before it; an unsaved stop and
// a finish only where nothing was.
TEST(Membership, ASavedStopIsTheEndOverAnyOther) {
  auto store = makeHashStore();
  markJobEnded(*store, JobEnd::kStoppedUnsaved);
  markJobEnded(*store, JobEnd::kFinished);
  EXPECT_EQ(jobEndedHow(*store), JobEnd::kStoppedUnsaved);
  markJobEnded(*store, JobEnd::kStopped);
  EXPECT_EQ(jobEndedHow(*store), JobEnd::kStopped);
  markJobEnded(*store, JobEnd::kStoppedUnsaved);
  EXPECT_EQ(jobEndedHow(*store), JobEnd::kStopped);
}

// After the job's end a launcher serves the store while a process still waits to be let in
// (waitersRemain): a survivor below MIN counts until it has read how the job ended and left, and
// so does a rank of the last generation that has not arrived yet (unless reported lost);
// processes let into a generation never count.
TEST(Membership, AWaiterRemainsUntilItHasReadTheEnd) {
  auto store = makeHashStore();
  const std::vector<Generation> g0 = formFirst(store, {"a", "b", "c"}, 3);
  EXPECT_FALSE(waitersRemain(*store));
  auto waiting = joinAsync(store, options(3, 3), survivor(g0[1], 1), {2}, 3);
  const auto deadline = std::chrono::steady_clock::now() + kBound;
  while (!waitersRemain(*store) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(waitersRemain(*store));
  markJobEnded(*store, JobEnd::kStopped);
  ASSERT_EQ(waiting.wait_for(kBound), std::future_status::ready);
  EXPECT_THROW(waiting.get(), CommError);
  EXPECT_TRUE(waitersRemain(*store)) << "rank 0 of generation 0 has neither arrived nor been reported lost";
  auto last = joinAsync(store, options(3, 3), survivor(g0[0], 1), {2}, 3);
  ASSERT_EQ(last.wait_for(kBound), std::future_status::ready);
  EXPECT_THROW(last.get(), CommError);
  EXPECT_FALSE(waitersRemain(*store));
  // Two survivors of a 2:3 job are let in (generation 1 closes): nobody waits.
  auto again = makeHashStore();
  const std::vector<Generation> h0 = formFirst(again, {"a", "b", "c"}, 3);
  auto first = joinAsync(again, options(2, 3), survivor(h0[0], 0), {2}, 3);
  auto second = joinAsync(again, options(2, 3), survivor(h0[1], 1), {2}, 3);
  ASSERT_EQ(first.wait_for(kBound), std::future_status::ready);
  ASSERT_EQ(second.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(joined(first.get()).size(), 2);
  EXPECT_FALSE(waitersRemain(*again));
}

// One rank's own error (markJobFailed) ends nothing: a survivor below MIN waits on, as after a
// lost rank. Once every rank of the generation has failed, the job has ended (kFailed), and a
// process still waiting to join is told so (JobEnded, kFailed), not as a finished job's end.
TEST(Membership, TheJobEndsWhenEveryRankOfItsGenerationFailed) {
  auto store = makeHashStore();
  const std::vector<Generation> g0 = formFirst(store, {"a", "b", "c"}, 3);
  markJobFailed(*store, 0, 3);
  EXPECT_FALSE(jobEnded(*store));
  auto waiting = joinAsync(store, options(3, 3), survivor(g0[1], 1), {2}, 3);
  EXPECT_EQ(waiting.wait_for(100ms), std::future_status::timeout) << "a survivor gave up on one rank's error";
  markJobEnded(*store, JobEnd::kStopped);
  ASSERT_EQ(waiting.wait_for(kBound), std::future_status::ready);
  EXPECT_THROW(waiting.get(), CommError);

  auto all = makeHashStore();
  formFirst(all, {"a", "b"}, 2);
  markJobFailed(*all, 0, 2);
  markJobFailed(*all, 0, 2);
  ASSERT_TRUE(jobEnded(*all));
  EXPECT_EQ(jobEndedHow(*all), JobEnd::kFailed);
  auto late = joinAsync(all, options(2, 2), fresh("c"));
  ASSERT_EQ(late.wait_for(kBound), std::future_status::ready);
  const JobEnded told = ended(late.get());  // (a process that joined a job whose every rank failed fails here)
  EXPECT_EQ(told.how, JobEnd::kFailed) << "a failed job was taken for another end: " << told.what;
  EXPECT_NE(told.what.find("every rank of the job failed"), std::string::npos) << told.what;
  EXPECT_FALSE(waitersRemain(*all));
}

// The job's one election of the survivor that saves (claimSave): of the members of a generation
// that claim at once, one wins; each generation has its own (a job of fixed size: generation 0).
TEST(Membership, OneMemberOfAGenerationIsElectedToSave) {
  auto store = makeHashStore();
  for (const int64_t generation : {int64_t{0}, int64_t{1}, int64_t{7}}) {
    std::atomic<int> won{0};
    std::vector<std::thread> members;
    for (int r = 0; r < 8; ++r) {
      members.emplace_back([&, generation] {
        won += claimSave(*store, generation) ? 1 : 0;  // (HashStore: one store, safe across threads)
      });
    }
    for (std::thread& t : members) t.join();
    EXPECT_EQ(won, 1) << "generation " << generation;
    EXPECT_FALSE(claimSave(*store, generation)) << "a claim after the election";
  }
}

// Only a process that arrives as a survivor of the generation before may be elected to save
// (ElasticJob::claimSave asks triedAsSurvivor): one left out of a generation since, or a newcomer,
// holds an older state or none.
TEST(Membership, OnlyASurvivorOfTheGenerationBeforeTriesAsOne) {
  auto store = makeHashStore();
  const std::vector<Generation> g0 = formFirst(store, {"a", "b"}, 1);
  Membership a(store, options(1, 2)), b(store, options(1, 2)), newcomer(store, options(1, 2));
  EXPECT_FALSE(a.triedAsSurvivor());                                 // (it tried none yet)
  const Generation g1 = joined(a.join(survivor(g0[0], 3), {1}, 2));  // b reported lost: a alone closes it
  EXPECT_EQ(g1.number, 1);
  EXPECT_TRUE(a.triedAsSurvivor());
  markJobEnded(*store, JobEnd::kFinished);                              // (so that the late ones do not wait)
  EXPECT_EQ(ended(b.join(survivor(g0[1], 2))).how, JobEnd::kFinished);  // late by one: it tries generation 2
  EXPECT_FALSE(b.triedAsSurvivor());
  EXPECT_EQ(ended(newcomer.join(fresh("c"))).how, JobEnd::kFinished);
  EXPECT_FALSE(newcomer.triedAsSurvivor());
  // The same process as a, once late by one (a survivor of generation 0 again): no survivor's try.
  EXPECT_EQ(ended(a.join(survivor(g0[0], 3))).how, JobEnd::kFinished);
  EXPECT_FALSE(a.triedAsSurvivor());
}

}  // namespace
}  // namespace aiacc::comm
