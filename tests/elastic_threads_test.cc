// Elastic jobs whose ranks are threads (tests/elastic_threads.h): the decisions of a regroup on a
// manual clock, in a second where the same job of processes waits out its real timeouts.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "app/exit_code.h"
#include "tests/elastic_threads.h"

namespace aiacc::test_threads {
namespace {

// One rank's own error (AIACC_TEST_FAIL_AT_STEP=2:3: as its out of memory or full disk would) in a
// 3:3 job: the other two are below MIN, wait --rdzv-timeout (8 s on the manual clock), and stop.
// (The failing rank used to mark the job finished, and they exited 0 with the state lost.) With
// no --checkpoint-dir nobody can save: each says so, and exits 1, not 75: nothing of this run is
// on disk to resume (app/exit_code.h). Was the process test
// Elastic.ARanksOwnErrorBelowMinStopsTheOthersSayingNothingIsSaved (20 s), with the same
// assertions on each rank's line and code, as the worker's own endOfRun and endWithError give
// them. (What a launcher makes of its workers' codes: launcherExitCode's table, ExitCode.*.)
TEST(ElasticThreads, ARanksOwnErrorBelowMinStopsTheOthersSayingNothingIsSaved) {
  ThreadJobSpec spec;
  spec.env = [](int) { return std::map<std::string, std::string>{{"AIACC_TEST_FAIL_AT_STEP", "2:3"}}; };
  ThreadJob job(spec);
  ASSERT_TRUE(job.awaitEnd(2));
  job.clock().awaitLooks(2);  // ranks 0 and 1 wait for generation 1, below MIN
  job.clock().advance(spec.rdzv_timeout);
  const std::vector<RankEnd> ends = job.wait();
  ASSERT_EQ(ends.size(), 3u);
  EXPECT_NE(ends[2].error.find("aiacc_train: error: AIACC_TEST_FAIL_AT_STEP: rank 2 fails after step 3"),
            std::string::npos)
      << ends[2].error;
  std::vector<std::string> lines;  // every rank's lines, as the job's output holds them
  for (int r = 0; r < 3; ++r) {
    const RankEnd& e = ends[static_cast<size_t>(r)];
    EXPECT_EQ(e.code, app::kExitError) << "rank " << r << ": " << e.error << e.err;
    if (r < 2) {
      EXPECT_EQ(e.error, "") << "rank " << r;
    }
    lines.push_back(e.err);
  }
  // The first to time out ends the job. The other times out too, or, looking after that end,
  // stops as it did.
  EXPECT_GE(countContaining(lines, "only 2 of at least 3 processes arrived for generation 1 within 8 s"), 1)
      << lines[0] << lines[1];
  EXPECT_EQ(countContaining(lines, "only 2 of at least 3 processes arrived for generation 1 within 8 s") +
                countContaining(lines, "only 2 of at least 3 processes arrived for generation 1, and another "
                                       "surviving process stopped the job meanwhile"),
            2)
      << lines[0] << lines[1];
  EXPECT_EQ(countContaining(lines, "; stopped; nothing saved (no --checkpoint-dir): the steps this run did are lost"),
            2)
      << lines[0] << lines[1];
  std::vector<std::string> all = job.logLines();  // every line of the job's output: the log's, the ends'
  all.insert(all.end(), lines.begin(), lines.end());
  all.push_back(ends[2].error);
  EXPECT_EQ(countContaining(all, "saves its state"), 0);
  EXPECT_EQ(countContaining(all, "; saved "), 0);
}

}  // namespace
}  // namespace aiacc::test_threads
