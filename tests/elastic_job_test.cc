// ElasticJob (app/elastic.h) on an in-memory or a TCP store, each membership on a manual clock:
// a store lost, a first join that fails, and a process the others went on without that cannot get
// back in (LeftOutError).
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aiacc/comm/membership.h"
#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"
#include "app/elastic.h"
#include "tests/manual_clock.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

// ElasticJob once the store is gone (its server ended, as node 0's launcher does with its node):
// rank 0's look for newcomers at each step says none, says so once on the log, and asks no more
// (it threw, and rank 0 exited 1 with the state it held, when the store went before its step's
// communication failed); the regroup of a lost rank then fails with StoreLostError, which the
// trainer stops on with the state saved (the tests above). Every process of the run shares the
// run id the first one set.
TEST(ElasticJob, ALostStoreMeansNoNewcomersAndARegroupThatFailsAsSuch) {
  const int port = test::freePort();
  auto server = comm::hostStore(port, 1, std::chrono::seconds(10));  // (as a launcher serves it)
  auto client = [&] {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port);
    o.isServer = false;
    o.timeout = std::chrono::seconds(2);
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  };
  ElasticOptions o;
  o.membership.min = o.membership.max = 1;
  o.node = "n0";
  ElasticJob job(client(), o);
  ASSERT_FALSE(job.start());  // (nullopt: joined)
  EXPECT_EQ(job.generation().size(), 1);
  ASSERT_FALSE(job.runId().empty());
  const std::vector<uint8_t> id = client()->get("run_id");
  EXPECT_EQ(std::string(id.begin(), id.end()), job.runId());
  EXPECT_FALSE(job.joinersWaiting());
  server.reset();
  EXPECT_FALSE(job.joinersWaiting());
  EXPECT_FALSE(job.joinersWaiting());
  EXPECT_THROW((void)job.regroup(1, "shm: rank 1 died (its process is gone)"), StoreLostError);
}

// A process whose first join failed (below MIN past --rdzv-timeout) is in no generation: its
// error says nothing of the job's end. (When 892cf28 first made the join a value, the worker held
// the job before joining, and its error's markFailed, for generation -1 of size 0, recorded the
// job as failed on every rank for each process still running or waiting.)
TEST(ElasticJob, AProcessWhoseFirstJoinFailedEndsNothing) {
  auto store = comm::makeHashStore();
  auto clock = std::make_shared<aiacc::test::ManualClock>();
  ElasticOptions o;
  o.membership.min = o.membership.max = 2;
  o.membership.timeout = std::chrono::hours(1);
  o.membership.clock = clock;
  o.node = "n0";
  ElasticJob job(store, o);
  auto first = std::async(std::launch::async, [&] { return job.start(); });
  clock->awaitLooks(1);
  clock->advance(o.membership.timeout);
  ASSERT_EQ(first.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_THROW(first.get(), comm::CommError);
  EXPECT_FALSE(job.joined());
  job.markFailed();
  EXPECT_FALSE(comm::jobEnded(*store)) << "a process in no generation ended the job";
}

// Three ElasticJobs of MIN 2, MAX 3 on `store` (one store each when `per_job`), generation 0
// joined by all three, then generation 1 by jobs 0 and 1, which report job 2's rank lost: job 2
// is left out.
struct LeftOutJob {
  std::shared_ptr<aiacc::test::ManualClock> clock = std::make_shared<aiacc::test::ManualClock>();
  std::vector<std::unique_ptr<ElasticJob>> jobs;
};
void leaveTheThirdOut(LeftOutJob& j, const std::function<c10::intrusive_ptr<c10d::Store>()>& store) {
  for (int r = 0; r < 3; ++r) {
    ElasticOptions o;
    o.membership.min = 2;
    o.membership.max = 3;
    o.membership.timeout = std::chrono::hours(1);
    o.membership.clock = j.clock;
    o.node = "n" + std::to_string(r);
    o.launch_rank = r;
    j.jobs.push_back(std::make_unique<ElasticJob>(store(), o));
  }
  std::vector<std::future<std::optional<comm::JobEnded>>> starts;
  for (auto& job : j.jobs) starts.push_back(std::async(std::launch::async, [&job] { return job->start(); }));
  for (auto& f : starts) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    ASSERT_FALSE(f.get());  // (nullopt: joined; three of MAX 3 close at once)
  }
  std::vector<std::future<std::optional<comm::JobEnded>>> regroups;
  for (int r = 0; r < 2; ++r) {
    regroups.push_back(std::async(std::launch::async,
                                  [&job = j.jobs[r]] { return job->regroup(7, "shm: rank 2 died"); }));
  }
  for (auto& f : regroups) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    ASSERT_FALSE(f.get());  // (two survivors and one lost account for generation 0's three)
  }
  ASSERT_EQ(j.jobs[0]->generation().number, 1);
  ASSERT_EQ(j.jobs[0]->generation().size(), 2);
}

// The left-out process's regroup, once it ended: the LeftOutError's message, or a failure.
std::string leftOutError(std::future<std::optional<comm::JobEnded>>& regroup) {
  if (regroup.wait_for(std::chrono::seconds(20)) != std::future_status::ready) return "(still waiting)";
  try {
    (void)regroup.get();
    return "(the left-out process's regroup returned)";
  } catch (const LeftOutError& e) {
    EXPECT_EQ(e.remedy(), comm::CommError::Remedy::kNone);
    return e.what();
  } catch (const std::exception& e) {
    return strCat("(not a LeftOutError: ", e.what(), ")");
  }
}

// A process the others went on without (SIGSTOPped, or slow to regroup) that cannot get back in
// is no survivor. Here it waits alone, below MIN, for generation 2 and times out. It ends with
// LeftOutError (an error, exit 1: not kMembership, which the trainer turns into a survivor's
// resumable stop, and used to print "another surviving rank saves its state" and exit 75 with
// nobody saving), claims no save, and records no end of the job.
TEST(ElasticJob, AProcessLeftOutThatCannotGetBackInIsAnErrorThatEndsNothing) {
  auto store = comm::makeHashStore();
  LeftOutJob j;
  leaveTheThirdOut(j, [&] { return store; });
  if (HasFatalFailure()) return;
  ElasticJob& late = *j.jobs[2];
  auto left_out = std::async(std::launch::async, [&late] { return late.regroup(7, "shm: rank 0 died"); });
  j.clock->awaitLooks(1);  // (it waits for generation 2, alone)
  j.clock->advance(std::chrono::hours(1));
  const std::string what = leftOutError(left_out);
  EXPECT_NE(what.find("only 1 of at least 2 processes arrived for generation 2"), std::string::npos) << what;
  EXPECT_NE(what.find("left out (the others went on past its generation 0 without it)"), std::string::npos) << what;
  EXPECT_FALSE(late.claimSave());
  late.markFailed();
  EXPECT_FALSE(comm::jobEnded(*store)) << "a process left out ended the job that went on without it";
  EXPECT_TRUE(j.jobs[0]->claimSave()) << "a survivor of generation 1 may save";
  EXPECT_FALSE(j.jobs[1]->claimSave());
}

// The store gone (node 0's launcher with its node) while a process left out waits: its regroup
// fails as the left out one's (LeftOutError), not as a survivor's StoreLostError, on which the
// trainer would save its state, older than the job's, as if it were the newest.
TEST(ElasticJob, AProcessLeftOutThatMeetsTheStoreGoneIsNoSurvivorThatSaves) {
  const int port = test::freePort();
  auto server = comm::hostStore(port, 1, std::chrono::seconds(10));
  LeftOutJob j;
  leaveTheThirdOut(j, [&] {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port);
    o.isServer = false;
    o.timeout = std::chrono::seconds(2);
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  });
  if (HasFatalFailure()) return;
  ElasticJob& late = *j.jobs[2];
  auto left_out = std::async(std::launch::async, [&late] { return late.regroup(7, "shm: rank 0 died"); });
  j.clock->awaitLooks(1);  // (it waits for generation 2, alone)
  server.reset();
  const std::string what = leftOutError(left_out);
  EXPECT_NE(what.find("left out (the others went on past its generation 0 without it)"), std::string::npos) << what;
  EXPECT_NO_THROW(late.markFailed());  // (nothing to say: no store request)
}

// A process left out records no failure in the generation it was in: there its count could
// complete it, and end a job that others run. Generation 0 = {A, C}; A fails (1 of 2); A's
// launcher starts it again (A2), which forms generation 1 alone once generation 0's beat has stood
// still; C, left out, is not let into the live generation 1 within --rdzv-timeout.
TEST(ElasticJob, AProcessLeftOutCountsNoFailureThatCouldEndTheJobOthersRun) {
  auto store = comm::makeHashStore();
  auto clock = std::make_shared<aiacc::test::ManualClock>();
  auto make = [&](int rank) {
    ElasticOptions o;
    o.membership.min = 1;
    o.membership.max = 2;
    o.membership.timeout = std::chrono::seconds(10);
    o.membership.clock = clock;
    o.node = "n" + std::to_string(rank);
    o.launch_rank = rank;
    return std::make_unique<ElasticJob>(store, o);
  };
  auto a = make(0), c = make(1);
  {
    auto first = std::async(std::launch::async, [&] { return a->start(); });
    ASSERT_FALSE(c->start());
    ASSERT_EQ(first.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    ASSERT_FALSE(first.get());
  }
  a->markFailed();  // (A's own error: 1 of generation 0's 2)
  ASSERT_FALSE(comm::jobEnded(*store));
  auto a2 = make(0);
  auto again = std::async(std::launch::async, [&] { return a2->start(); });
  clock->awaitLooks(1);
  clock->advance(std::chrono::seconds(3));  // (generation 0's beat stood still: a newcomer alone closes 1)
  ASSERT_EQ(again.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  ASSERT_FALSE(again.get());
  ASSERT_EQ(a2->generation().number, 1);
  auto left_out = std::async(std::launch::async, [&] { return c->regroup(5, "shm: rank 0 died"); });
  for (int s = 0; s < 10; ++s) {  // (C's look at the tenth second is its last)
    comm::beat(*store, 1);        // generation 1 lives (A2's beat)
    clock->awaitLooks(1);
    clock->advance(std::chrono::seconds(1));
  }
  const std::string what = leftOutError(left_out);
  EXPECT_NE(what.find("generation 1 is alive but did not let this process in within 10 s"), std::string::npos) << what;
  c->markFailed();
  EXPECT_FALSE(comm::jobEnded(*store)) << "C's failure, counted in generation 0, ended the job A2 runs";
}

}  // namespace
}  // namespace aiacc::app
