// Elastic jobs whose ranks fail (tests/elastic_job.h's three nodes, each one launcher and one
// worker; the faults from app/test_hooks.h).
//
// A generation whose set-up fails with only ranks that held the state in it (a rank lost in the
// state transfer; here AIACC_TEST_FAIL_SETUP=N, every such rank's set-up failing with a
// communication error, N times in all): after node 2's worker is SIGKILLed, nodes 0 and 1 regroup
// into generation 1 and its set-up fails. Once: they leave it for generation 2 and train on.
// Twice in a row: they stop resumable (exit 75), one of them saving its state (it used to exit 1
// with nothing saved), and the job run again on the two nodes (--resume auto) goes on from that
// save to the end, no sample of the epoch trained twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "aiacc/common/checkpoint_dir.h"
#include "aiacc/config.h"
#include "tests/elastic_job.h"

namespace aiacc::app {
namespace {

using test_elastic::expectEachSampleOnce;
using test_elastic::expectTheRunAgainEndedOnTwoNodes;
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
                                "failed again in this regroup (AIACC_TEST_FAIL_SETUP: rank 0's set-up of "
                                "generation 2 fails; before: ",
                                first, ")")),
            std::string::npos)
      << job.out;
  // One of the two saves (the other says so), and the job run again resumes that save.
  const std::string saved = "; saved " + (d / "ckpt") + "/step-";
  const size_t at = job.out.find(saved);
  ASSERT_NE(at, std::string::npos) << job.out;
  EXPECT_EQ(test::occurrences(job.out, saved), 1) << job.out;
  EXPECT_NE(job.out.find("; it saves its own state"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("; another rank saves its state"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("run the job again with --resume auto to continue"), std::string::npos) << job.out;
  const std::string step = job.out.substr(at + saved.size(), job.out.find('.', at + saved.size()) - at - saved.size());
  EXPECT_NE(job.out.find("resumed from " + (d / "ckpt") + "/step-" + step), std::string::npos) << step << job.out;
  expectTheRunAgainEndedOnTwoNodes(job);
}

INSTANTIATE_TEST_SUITE_P(Elastic, ElasticSetUpFails, ::testing::Values(1, 2),
                         [](const auto& info) { return std::string(info.param == 1 ? "Once" : "Twice"); });

// An error every rank meets (AIACC_TEST_FAIL_AT_STEP=*:3: each throws its own after step 3, as a
// setting or the data would make them) ends the job. With --max-restarts 2, a launcher starts its
// worker again only while the job's end is not recorded in the store: the last rank to fail
// records it before it exits, so two workers at most are started again, once each; each such
// worker finds the job failed on every rank and exits 1, and is not started again. (Each was
// started again as many times as --max-restarts allowed, each start failing the same way.)
TEST(Elastic, AnErrorOfEveryRankEndsTheJobWithOneRestartAtMost) {
  test::TempDir d;
  JobSpec spec;
  spec.extra = "--max-restarts 2";
  spec.env = "AIACC_TEST_FAIL_AT_STEP=*:3";
  spec.act = "true";
  const Job job = runKilledJob(d, spec);
  for (const char* rc : {"rc0=1", "rc1=1", "rc2=1"}) EXPECT_NE(job.out.find(rc), std::string::npos) << rc << job.out;
  EXPECT_NE(job.out.find("AIACC_TEST_FAIL_AT_STEP: rank 0 fails after step 3"), std::string::npos) << job.out;
  const auto count = [&](const std::string& what) { return test::occurrences(job.out, what); };
  const int restarted = count("; starting it again to join the running job (restart 1 of 2)");
  EXPECT_LE(restarted, 2) << "the last to fail recorded the end before it exited\n" << job.out;
  EXPECT_EQ(count("(restart 2 of 2)"), 0) << job.out;
  EXPECT_EQ(count("elastic: every rank of the job failed (their logs say why) while this process waited to join "
                  "generation 1; nothing left to join"),
            restarted)
      << job.out;
  // Every rank's last worker: ended after the end was recorded (its own error, or the failed job
  // found), and not started again.
  EXPECT_EQ(count("exited with code 1 after the job's end was recorded; not starting it again"), 3) << job.out;
  // Node 0's launcher, which serves the store, keeps it for the workers the others start again
  // (however late they start), instead of closing it once its own worker has read the end.
  EXPECT_NE(job.out.find("the job failed on every rank; serving the rendezvous store 10 s more"), std::string::npos)
      << job.out;
}

// Nodes 1 and 2 stopped resumable (75) with the store gone, in turn: one saved, the other found
// that step saved (or, a step ahead of it over a failed last step, saved its newer one). The
// newest step they name.
int64_t expectTheSurvivorsSavedInTurn(const Job& job, const std::string& dir) {
  EXPECT_NE(job.out.find("rc1=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc2=75"), std::string::npos) << job.out;
  EXPECT_EQ(test::occurrences(job.out,
                              "aiacc_train: elastic: the rendezvous store failed while this process regrouped ("),
            2)
      << job.out;
  int64_t newest = -1;
  // How often `said` is followed by a step on the output; the newest of them all.
  const auto count = [&](const std::string& said) {
    int n = 0;
    for (size_t at = job.out.find(said); at != std::string::npos; at = job.out.find(said, at + 1), ++n) {
      newest = std::max<int64_t>(newest, std::stoll(job.out.substr(at + said.size(), 12)));
    }
    return n;
  };
  const int saves = count("; stopped; saved " + dir + "/step-");
  const int found = count(" is saved already (" + dir + "/step-");
  EXPECT_GE(saves, 1) << job.out;
  EXPECT_EQ(saves + found, 2) << job.out;
  return newest;
}

// Node 0 gone whole, its launcher (which served the store: no --rendezvous-server) with its
// worker, as when a spot node is reclaimed: the others cannot regroup. They stop resumable (exit
// 75) with the state saved in turn (they exited 1, and the steps since the last checkpoint were
// lost). The job run again on two nodes goes on from that save to the end, no sample of the epoch
// trained twice. The folder holds an earlier run's checkpoint of a later step: it says nothing of
// this run's state (a survivor that looked at the folder's newest checkpoint took it for a save
// and saved nothing).
TEST(Elastic, WithTheStoreGoneWithNodeZeroTheOthersSaveTheStateAndStopResumable) {
  test::TempDir d;
  CheckpointDir(d / "ckpt").write(999, "an earlier run's checkpoint");
  JobSpec spec;
  spec.extra = strCat("--checkpoint-dir ", d / "ckpt");
  spec.act = "kill -KILL $(pgrep -P $L0) $L0";
  spec.again = "2:3";
  const Job job = runKilledJob(d, spec);
  const int64_t step = expectTheSurvivorsSavedInTurn(job, d / "ckpt");
  EXPECT_NE(job.out.find(strCat("resumed from ", d / "ckpt", "/", checkpointPayloadName(step))), std::string::npos)
      << job.out;
  expectTheRunAgainEndedOnTwoNodes(job);
}

// The same loss when rank 0 is not on node 0, so that rank 0, which writes the periodic
// checkpoints (one every step here), is one of the survivors: node 0's worker is killed and
// started again by its launcher (--max-restarts 1), and joins as the last rank; then node 0 goes
// whole. The two save in turn, and the newest state is what `latest` names, whatever rank 0's
// writes in flight did. (Should rank 0 meet the lost store first in its per-step look for
// newcomers: ElasticJob.ALostStoreMeansNoNewcomersAndARegroupThatFailsAsSuch.)
TEST(Elastic, WithTheStoreGoneAndRankZeroElsewhereTheOthersSaveTheStateAndStopResumable) {
  test::TempDir d;
  JobSpec spec;
  spec.extra = strCat("--max-restarts 1 --epochs 8 --checkpoint-every 1 --checkpoint-dir ", d / "ckpt");
  spec.act = "kill -KILL $(pgrep -P $L0); for i in $(seq 1200); do grep -q 'elastic: joined generation' log0 && "
             "break; sleep 0.05; done; sleep 1; kill -KILL $(pgrep -P $L0) $L0";
  const Job job = runKilledJob(d, spec);
  EXPECT_NE(job.out.find("starting it again to join the running job (restart 1 of 1)"), std::string::npos) << job.out;
  const int64_t step = expectTheSurvivorsSavedInTurn(job, d / "ckpt");
  const std::optional<CheckpointFile> latest = findNewestValid(d / "ckpt", {});
  ASSERT_TRUE(latest.has_value()) << job.out;
  EXPECT_EQ(latest->step, step) << latest->path << "\n" << job.out;
}

// A store gone while every rank lives (the --rendezvous-server killed) ends nothing: rank 0 says
// once that no process can join, and the job trains to its end and writes its report. (Rank 0's
// look for newcomers threw, or, had it not, its mark of the job's end in the store: exit 1, no
// report.)
TEST(Elastic, AStoreGoneWhileEveryRankLivesEndsNothing) {
  test::TempDir d;
  JobSpec spec;
  spec.server = true;
  spec.act = "kill -KILL $S";
  const Job job = runKilledJob(d, spec);
  for (const char* rc : {"rc0=0", "rc1=0", "rc2=0"}) EXPECT_NE(job.out.find(rc), std::string::npos) << rc << job.out;
  EXPECT_NE(job.out.find("no process can join, and the job goes on with its 3 processes while they last"),
            std::string::npos)
      << job.out;
  ASSERT_TRUE(std::filesystem::exists(d / "r.json")) << job.out;  // rank 0's, on node 0
  const Json report = test::readJson(d / "r.json");
  EXPECT_EQ(report.at("epochs").get<double>(), 2.0);
  EXPECT_EQ(report.at("world_size"), 3);
}

}  // namespace
}  // namespace aiacc::app
