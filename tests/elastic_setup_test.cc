// An elastic generation whose set-up fails with only ranks that held the state in it (a rank lost
// in the state transfer; here AIACC_TEST_FAIL_SETUP=N, every such rank's set-up failing with a
// communication error, N times in all): after node 2's worker is SIGKILLed, nodes 0 and 1 regroup
// into generation 1 and its set-up fails. Once: they leave it for generation 2 and train on.
// Twice in a row: they stop resumable (exit 75), one of them saving its state (it used to exit 1
// with nothing saved), and the job run again on the two nodes (--resume auto) goes on from that
// save to the end, no sample of the epoch trained twice.
#include <gtest/gtest.h>

#include <string>

#include "aiacc/config.h"
#include "tests/elastic_job.h"

namespace aiacc::app {
namespace {

using test_elastic::expectEachSampleOnce;
using test_elastic::expectTwoOfThreeWentOn;
using test_elastic::Job;
using test_elastic::JobSpec;
using test_elastic::kBatch;
using test_elastic::runKilledJob;

class ElasticSetUpFails : public ::testing::TestWithParam<int> {};  // set-ups that fail

TEST_P(ElasticSetUpFails, WithNoNewcomerOnceIsTriedAgainAndTwiceStopsResumable) {
  const int failures = GetParam();
  test::TempDir d;
  JobSpec spec;
  spec.extra = strCat("--checkpoint-dir ", d / "ckpt");
  spec.env = strCat("AIACC_TEST_FAIL_SETUP=", failures);
  if (failures == 2) spec.again = "2:3";
  const Job job = runKilledJob(d, spec);
  const std::string first = "AIACC_TEST_FAIL_SETUP: rank 0's set-up of generation 1 fails";
  EXPECT_NE(job.out.find("elastic: leaving generation 1 before its first step, its set-up failed: " + first),
            std::string::npos)
      << job.out;
  if (failures == 1) {
    const Json change = expectTwoOfThreeWentOn(job);
    if (!change.is_null()) {
      EXPECT_EQ(change.at("generation"), 2) << change;
    }
    ASSERT_TRUE(job.report.contains("epochs")) << job.out;
    EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
    EXPECT_EQ(job.report.at("world_size"), 2);
    expectEachSampleOnce(job, 2 * (kBatch - 1) + 1);  // (as a regroup that did not fail)
    return;
  }
  EXPECT_NE(job.out.find("rc0=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find(strCat("elastic: the set-up of generation 2, with only ranks that hold the state in it, "
                                "failed the second time in a row (AIACC_TEST_FAIL_SETUP: rank 0's set-up of "
                                "generation 2 fails; before: ",
                                first, ")")),
            std::string::npos)
      << job.out;
  // One of the two saves (the other says so), and the job run again resumes that save.
  const std::string saved = "; saved " + (d / "ckpt") + "/step-";
  const size_t at = job.out.find(saved);
  ASSERT_NE(at, std::string::npos) << job.out;
  EXPECT_EQ(job.out.find(saved, at + 1), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("; it saves its own state"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("; another rank saves its state"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("run the job again with --resume auto to continue"), std::string::npos) << job.out;
  const std::string step = job.out.substr(at + saved.size(), job.out.find('.', at + saved.size()) - at - saved.size());
  EXPECT_NE(job.out.find("resumed from " + (d / "ckpt") + "/step-" + step), std::string::npos) << step << job.out;
  EXPECT_NE(job.out.find("again0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("again1=0"), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("epochs")) << job.out;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
  EXPECT_EQ(job.report.at("world_size"), 2);
  expectEachSampleOnce(job, 3 * (kBatch - 1) + 2 + 2 * (kBatch - 1) + 1);
}

INSTANTIATE_TEST_SUITE_P(Elastic, ElasticSetUpFails, ::testing::Values(1, 2),
                         [](const auto& info) { return std::string(info.param == 1 ? "Once" : "Twice"); });

}  // namespace
}  // namespace aiacc::app
