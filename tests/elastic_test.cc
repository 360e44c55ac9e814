// Elastic jobs (--nnodes MIN:MAX, app/elastic.h): three emulated nodes, each one aiacc_train
// launcher with one worker (--nproc 1), on real JPEGs; they share this host, so their ranks
// talk over shared memory (and over Gloo with --noshm). Node 2's worker is SIGKILLed once the job
// trains; the other two go on from the most advanced survivor's state and share out the rest of
// the epoch (with --max-restarts its launcher starts it again and it rejoins:
// tests/elastic_rejoin_test.cc). Every step's samples go to a log (AIACC_TEST_SAMPLE_LOG): no
// sample of the epoch is trained twice, and none is missed beyond the tail every epoch drops
// (whole batches only).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "aiacc/config.h"
#include "aiacc/common/error.h"
#include "tests/elastic_job.h"

namespace aiacc::app {
namespace {

using test_elastic::batchSizesOf;
using test_elastic::expectEachSampleOnce;
using test_elastic::expectTheRunAgainEndedOnTwoNodes;
using test_elastic::expectTwoOfThreeWentOn;
using test_elastic::Job;
using test_elastic::JobSpec;
using test_elastic::kBatch;
using test_elastic::kClasses;
using test_elastic::killedWhileHeld;
using test_elastic::kModelBytes;
using test_elastic::kPositionBytes;
using test_elastic::runKilledJob;

// Over shared memory (the emulated nodes share this host) and over Gloo (--noshm).
class ElasticTransports : public ::testing::TestWithParam<bool> {};

TEST_P(ElasticTransports, AKilledNodeLeavesTheOthersTrainingWithNoSampleLostOrRepeated) {
  const bool shm = GetParam();
#if !AIACC_WITH_GLOO
  if (!shm) GTEST_SKIP() << "this build has no GlooTransport";
#endif
  test::TempDir d;
  // No metrics line before the epoch's end (--log-every 100): the steps trained before the kill
  // are still to be counted when the ranks regroup. The kill comes once each rank applied 2 steps
  // (and logged its third: each logs a step before it).
  JobSpec spec;
  spec.extra = shm ? "--log-every 100" : "--noshm --log-every 100";
  spec.when = "[ \"$(cat samples.* 2> /dev/null | grep -c ^step)\" -ge 9 ]";
  const Job job = runKilledJob(d, spec);
  EXPECT_NE(job.out.find("rc0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=0"), std::string::npos) << job.out;
  EXPECT_EQ(job.out.find("rc2=0"), std::string::npos) << job.out;  // its worker was killed
  EXPECT_NE(job.out.find("the job's other ranks go on without it (elastic)"), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("membership")) << job.out;
  const Json& change = job.report.at("membership").at(0);
  EXPECT_EQ(change.at("generation"), 1) << change;
  EXPECT_EQ(change.at("world_before"), 3) << change;
  EXPECT_EQ(change.at("world_after"), 2) << change;
  EXPECT_LE(change.at("steps_lost").get<int>(), 1) << change;
  EXPECT_LT(change.at("detect_s").get<double>(), 30) << change;  // half the timeout: never waited out
  EXPECT_GT(change.at("first_step_s").get<double>(), change.at("detect_s").get<double>()) << change;
  // The metrics file has the same record.
  std::ifstream metrics(d / "m.jsonl");
  bool recorded = false;
  for (std::string line; std::getline(metrics, line);) {
    recorded = recorded || line.find("\"event\":\"membership\"") != std::string::npos;
  }
  EXPECT_TRUE(recorded);
  EXPECT_EQ(job.report.at("world_size"), 2);
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
  // Every image trained counted once, the steps not yet in a metrics line at the failure included.
  EXPECT_EQ(job.report.at("images_seen").get<int64_t>(), job.trained) << job.restores;
  // The first world's part of the epoch ends at a step: only the last world's tail is left unseen
  // (2 ranks x 7 of a batch, and 1 of the order).
  expectEachSampleOnce(job, 2 * (kBatch - 1) + 1);
  // Generation 0's store keys are gone once generation 1 has restored: rank 0's own, and from
  // the list the killed rank had published, its.
  std::smatch keys;
  ASSERT_TRUE(std::regex_search(
      job.out, keys,
      std::regex(R"(elastic: generation 0's store keys deleted: (\d+) of this rank's, (\d+) of the ranks lost)")))
      << job.out;
  EXPECT_GT(std::stoi(keys[1].str()), 0) << keys[0];
  EXPECT_GT(std::stoi(keys[2].str()), 0) << keys[0];
  // Shared memory names the dead rank, so the generation closes without waiting the last call.
  // Its barriers pass for every survivor or for none, so both completed the same steps and hold
  // the same model: only the position travels (a few KiB; the model is 45 MiB with momentum).
  // (Over Gloo a ring's last chunk can reach one survivor and not the other: either may happen.)
  if (shm) {
    EXPECT_NE(job.out.find("shm: rank 2 died (its process is gone)"), std::string::npos) << job.out;
    EXPECT_LT(change.at("bytes").get<int64_t>(), kPositionBytes) << change;
  }
}

INSTANTIATE_TEST_SUITE_P(Elastic, ElasticTransports, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "SharedMemory" : "Gloo"); });

// A newcomer that dies while it joins (node 2's worker started again, then SIGKILLed by the test
// hook, as a spot node taken back while it joins would be): before it gives its settings to the
// agreement (the others wait for them until --comm-timeout, 15 s here), or in the state transfer
// after the ranks compared their states (the others see it die there: over shared memory, and over
// Gloo with --noshm). The two ranks that hold the state leave that generation before its first
// step and regroup without it; before, the set-up's failure ended them with an error.
struct JoinDeathCase {
  const char* name;
  const char* stage;   // AIACC_TEST_DIE_JOINING
  const char* flags;   // added to the job's
  const char* failed;  // how the survivors' set-up failed (their log)
  const char* nnodes;
  int restarts;  // --max-restarts: the newcomer dies this many times
};
class ElasticJoinDeath : public ::testing::TestWithParam<JoinDeathCase> {};

TEST_P(ElasticJoinDeath, ANewcomerThatDiesWhileJoiningLeavesTheOthersTraining) {
  test::TempDir d;
  JobSpec spec;
  const JoinDeathCase& c = GetParam();
#if !AIACC_WITH_GLOO
  if (std::string(c.flags).find("--noshm") != std::string::npos) GTEST_SKIP() << "this build has no GlooTransport";
#endif
  spec.extra = strCat("--max-restarts ", c.restarts, " --epochs 6 ", c.flags);
  spec.env = strCat("AIACC_TEST_DIE_JOINING=", c.stage);
  spec.nnodes = c.nnodes;
  const Job job = runKilledJob(d, spec);
  expectTwoOfThreeWentOn(job);
  for (int r = 1; r <= c.restarts; ++r) {
    EXPECT_NE(job.out.find(strCat("starting it again to join the running job (restart ", r, " of ", c.restarts, ")")),
              std::string::npos)
        << job.out;
  }
  EXPECT_EQ(job.out.find("the training starts again from step 0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("go on without it (elastic, no restart left)"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find(strCat("before its first step, its set-up failed: ", GetParam().failed)), std::string::npos)
      << job.out;
  EXPECT_EQ(job.out.find("elastic: joined generation"), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("membership")) << job.out;
  // Node 2 lost, then each newcomer's generation left: the first newcomer joins the regroup after
  // node 2's loss when it came back before that closed (over Gloo, where the loss is not named
  // and the last call runs out), else a later one.
  const Json& changes = job.report.at("membership");
  EXPECT_LE(changes.size(), static_cast<size_t>(c.restarts + 1)) << changes;
  EXPECT_EQ(changes.back().at("world_after"), 2) << changes;
  EXPECT_EQ(job.report.value("world_size", 0), 2);
  EXPECT_EQ(job.report.value("epochs", 0.0), 6.0);
  EXPECT_EQ(job.report.at("images_seen").get<int64_t>(), job.trained) << job.restores;
  expectEachSampleOnce(job, 3 * (kBatch - 1) + 2);
}
// BeforeItsSettings with MIN 1 and two restarts: the second newcomer comes back while the two
// survivors still wait for the first one's settings; alone at MIN, it must wait for them (their
// generation beats) instead of closing a generation of its own and beginning the job again.
INSTANTIATE_TEST_SUITE_P(Elastic, ElasticJoinDeath,
                         ::testing::Values(JoinDeathCase{"BeforeItsSettings", "settings", "--comm-timeout 15",
                                                         "timed out after 15 s waiting for", "1:3", 2},
                                           JoinDeathCase{"InTheStateTransfer", "restore", "", "shm: rank 2 died", "2:3",
                                                         1},
                                           JoinDeathCase{"InTheStateTransferOverGloo", "restore", "--noshm",
                                                         "collective failed on rank", "2:3", 1}),
                         [](const auto& info) { return std::string(info.param.name); });

// Node 2 started again with another --lr: the agreement of the generation it joins fails on
// every rank of it. The running job's ranks refuse it (they leave that generation before its first
// step and go on without it), and it exits 1 naming the difference; before, the whole job ended.
TEST(Elastic, ANewcomerWithOtherSettingsIsRefusedAndTheJobGoesOn) {
  test::TempDir d;
  JobSpec spec;
  spec.extra = "--epochs 6";
  spec.act = "kill -KILL $W $L2";
  spec.restart_node2_with = "--lr 0.3";
  const Job job = runKilledJob(d, spec);
  expectTwoOfThreeWentOn(job);
  EXPECT_NE(job.out.find("rc2=1"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("[rank 2] aiacc_train: error: ranks were started with different settings: --lr"),
            std::string::npos)
      << job.out;
  EXPECT_NE(job.out.find("before its first step, its set-up failed: ranks were started with different settings"),
            std::string::npos)
      << job.out;
  EXPECT_EQ(job.report.value("world_size", 0), 2);
  EXPECT_EQ(job.report.value("epochs", 0.0), 6.0);
  expectEachSampleOnce(job, 3 * (kBatch - 1) + 2);
}

// --elastic-batch keep-global: the first world's global batch (3 ranks x 5 = 15) outlives node 2.
// The two survivors share every later step 8 + 7, the learning rate stays at its first world's
// (a constant schedule: 0.1 x 15 / 256 in every metrics line; keep-per-rank would give 0.1 x 10 /
// 256), an epoch keeps its 240 / 15 = 16 steps, and every sample of epoch 0 is trained exactly once
// (15 divides 240: no tail in any world).
TEST(Elastic, KeepGlobalSharesTheFirstWorldsGlobalBatchOverTheSurvivors) {
  test::TempDir d;
  JobSpec spec;
  spec.extra = "--batch-size 5 --elastic-batch keep-global --lr-schedule step --lr-step-epochs 9 --log-every 1";
  spec.when = "[ \"$(cat samples.* 2> /dev/null | grep -c ^step)\" -ge 9 ]";
  const Job job = runKilledJob(d, spec);
  if (expectTwoOfThreeWentOn(job).is_null()) return;
  EXPECT_EQ(job.report.at("steps"), 32) << job.out;  // 2 epochs of 16 steps, whatever the world
  EXPECT_EQ(job.report.at("images_seen").get<int64_t>(), job.trained) << job.restores;
  EXPECT_EQ(job.trained, 2 * 240) << job.restores;
  for (const auto& [step, sizes] : batchSizesOf(d.path(), 0)) {
    for (size_t n : sizes) EXPECT_EQ(n, 5u) << "generation 0, step " << step;
  }
  const auto later = batchSizesOf(d.path(), 1);
  EXPECT_FALSE(later.empty()) << job.out;
  for (const auto& [step, sizes] : later) {
    EXPECT_EQ(std::multiset<size_t>(sizes.begin(), sizes.end()), (std::multiset<size_t>{7, 8})) << "step " << step;
  }
  std::ifstream metrics(d / "m.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    const Json j = Json::parse(line);
    if (j.value("type", "") != "step") continue;
    ++lines;
    EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), 0.1 * 15 / 256) << line;
  }
  EXPECT_GE(lines, 20);
  expectEachSampleOnce(job, 0);
}

// A rank lost at an epoch's end, not in a step: all three ranks finished epoch 1 and wait before
// its evaluation (AIACC_TEST_HOLD_EPOCH_EVAL); node 2's worker is SIGKILLed there, and the others
// fail in the evaluation's sum. Before, that ended the job; now they regroup, evaluate epoch 1 in
// the new world (once, on all 30 validation images), and train epoch 2.
TEST(Elastic, ARankLostAtAnEpochsEndEvaluationRegroupsAndTheJobGoesOn) {
  test::TempDir d;
  JobSpec spec = killedWhileHeld("AIACC_TEST_HOLD_EPOCH_EVAL");
  const Job job = runKilledJob(d, spec);
  const Json change = expectTwoOfThreeWentOn(job);
  if (change.is_null()) return;
  EXPECT_EQ(change.at("step"), 10) << change;                              // epoch 1's last: 240 / (3 x 8)
  EXPECT_EQ(change.at("steps_lost"), 0) << change;                         // between steps: none
  EXPECT_LT(change.at("bytes").get<int64_t>(), kPositionBytes) << change;  // the survivors hold the model
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0) << job.out;
  std::ifstream metrics(d / "m.jsonl");
  std::vector<Json> evals;
  for (std::string line; std::getline(metrics, line);) {
    const Json j = Json::parse(line);
    if (j.value("type", "") == "eval") evals.push_back(j);
  }
  ASSERT_EQ(evals.size(), 2u) << job.out;  // epoch 1's (after the regroup) and epoch 2's
  EXPECT_EQ(evals[0].at("step"), 10) << evals[0];
  EXPECT_EQ(evals[0].at("epoch").get<double>(), 1.0) << evals[0];
  EXPECT_EQ(evals[0].at("images"), kClasses * 5) << evals[0];
  EXPECT_EQ(evals[1].at("images"), kClasses * 5) << evals[1];
  EXPECT_EQ(job.report.at("images_seen").get<int64_t>(), job.trained) << job.restores;
  expectEachSampleOnce(job, 0);  // epoch 1 was the first world's alone, 10 whole steps of 24
}

// A rank lost after the last step, before the final evaluation (--max-steps 13 stops within epoch 2,
// and --eval-every 4 last evaluated step 12; AIACC_TEST_HOLD_RUN_END holds all three ranks there):
// the two others regroup and evaluate the final state once, and the job ends well. Before, the
// final evaluation was outside the loop that regroups, and the job failed.
TEST(Elastic, ARankLostBeforeTheFinalEvaluationRegroupsAndItIsEvaluated) {
  test::TempDir d;
  JobSpec spec = killedWhileHeld("AIACC_TEST_HOLD_RUN_END");
  spec.extra = "--max-steps 13 --eval-every 4";
  const Job job = runKilledJob(d, spec);
  const Json change = expectTwoOfThreeWentOn(job);
  if (change.is_null()) return;
  EXPECT_EQ(change.at("step"), 13) << change;
  EXPECT_EQ(change.at("steps_lost"), 0) << change;
  EXPECT_EQ(job.report.at("steps"), 13) << job.out;
  EXPECT_EQ(job.report.at("summed_ranks"), 2) << job.out;
  std::ifstream metrics(d / "m.jsonl");
  std::vector<int64_t> evaluated;
  for (std::string line; std::getline(metrics, line);) {
    const Json j = Json::parse(line);
    if (j.value("type", "") == "eval") evaluated.push_back(j.at("step").get<int64_t>());
  }
  EXPECT_EQ(evaluated, (std::vector<int64_t>{4, 8, 12, 13})) << job.out;
}

// A rank lost once training and its evaluation are done, before the report's sums over the ranks:
// the survivors' job still ends well (exit 0), and the report says its sums are rank 0's own.
TEST(Elastic, ARankLostAfterTheLastEvaluationLeavesTheJobDoneWithItsReport) {
  test::TempDir d;
  JobSpec spec = killedWhileHeld("AIACC_TEST_HOLD_RUN_END");
  const Job job = runKilledJob(d, spec);
  EXPECT_NE(job.out.find("rc0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=0"), std::string::npos) << job.out;
  ASSERT_FALSE(job.report.is_null()) << job.out;
  EXPECT_FALSE(job.report.contains("membership")) << job.out;  // nothing was left to train
  EXPECT_EQ(job.report.at("summed_ranks"), 1) << job.out;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0) << job.out;
  EXPECT_NE(job.out.find("a rank was lost after training ended"), std::string::npos) << job.out;
}

// A survivor whose model differs from rank 0's (AIACC_TEST_SKEW_AT_REGROUP: it adds 1 to a
// parameter as the ranks compare their states) receives rank 0's whole state, model and momentum,
// and the parameter check after it passes: the job finishes with the two survivors.
TEST(Elastic, ASurvivorWhoseStateDiffersFromRankZerosReceivesItWhole) {
  test::TempDir d;
  JobSpec spec;
  spec.env = "AIACC_TEST_SKEW_AT_REGROUP=1";
  const Job job = runKilledJob(d, spec);
  const Json change = expectTwoOfThreeWentOn(job);
  if (change.is_null()) return;
  EXPECT_GT(change.at("bytes").get<int64_t>(), kModelBytes) << change;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0) << job.out;
  EXPECT_EQ(job.out.find("parameters differ"), std::string::npos) << job.out;
}

// The store served by a standalone aiacc_train --rendezvous-server: node 0 (its launcher and its
// worker, rank 0) SIGKILLed; nodes 1 and 2 regroup and finish the job, each sample of the epoch
// seen once, and the server ends by itself when the job's last rank 0 says the job ended.
TEST(Elastic, WithAStandaloneStoreTheJobOutlivesNodeZero) {
  test::TempDir d;
  JobSpec spec;
  spec.act = "kill -KILL $(pgrep -P $L0) $L0";
  spec.server = true;
  const Job job = runKilledJob(d, spec);
  EXPECT_EQ(job.out.find("rc0=0"), std::string::npos) << job.out;  // killed
  EXPECT_NE(job.out.find("rc1=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc2=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rcS=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("serving the rendezvous store on port"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("is closed"), std::string::npos) << "the server ended with the job\n" << job.out;
  ASSERT_TRUE(job.report.contains("membership")) << job.out;
  const Json& change = job.report.at("membership").at(0);
  EXPECT_EQ(change.at("world_before"), 3) << change;
  EXPECT_EQ(change.at("world_after"), 2) << change;
  EXPECT_LE(change.at("steps_lost").get<int>(), 1) << change;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
  expectEachSampleOnce(job, 2 * (kBatch - 1) + 1);
}

// Every worker SIGKILLed at once (all of a job's spot nodes reclaimed; the launchers stay): no
// survivor holds the training state. The launchers start their workers again (--max-restarts),
// and they form a generation with no survivor (a last call of 5 s: the three restarted workers
// form one generation however slowly they start). With checkpoints (--resume auto), each starts
// from the newest valid one; without, they start the training again from step 0, as a restart
// under torchrun would, and rank 0 says so on its log (it was silent: the job trained from the
// beginning again and ended 0 as if nothing had happened). Either way the job ends at its last step.
struct NoSurvivorCase {
  const char* name;
  bool checkpoints;
  const char* said;  // on rank 0's log
};

void PrintTo(const NoSurvivorCase& c, std::ostream* os) { *os << c.name; }  // (stable test names)

class ElasticNoSurvivor : public ::testing::TestWithParam<NoSurvivorCase> {};

TEST_P(ElasticNoSurvivor, TheRestartedWorkersGoOnFromWhatIsLeftAndSaySo) {
  const NoSurvivorCase& c = GetParam();
  test::TempDir d;
  JobSpec spec;
  spec.extra = "--max-restarts 1 --rdzv-last-call 5";
  spec.act = "kill -KILL $(pgrep -P $L0) $(pgrep -P $L1) $(pgrep -P $L2)";
  if (c.checkpoints) {
    spec.extra += strCat(" --resume auto --checkpoint-every 2 --checkpoint-dir ", d / "ck");
    spec.act = "for i in $(seq 600); do ls ck/step-*.manifest > /dev/null 2>&1 && break; sleep 0.05; done; " + spec.act;
  }
  const Job job = runKilledJob(d, spec);
  for (const char* rc : {"rc0=0", "rc1=0", "rc2=0"}) EXPECT_NE(job.out.find(rc), std::string::npos) << rc << job.out;
  if (c.checkpoints) {
    EXPECT_NE(job.out.find("resumed from " + d / "ck/step-"), std::string::npos) << job.out;
  }
  EXPECT_NE(job.out.find(c.said), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("epochs")) << job.out;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
}

INSTANTIATE_TEST_SUITE_P(
    Elastic, ElasticNoSurvivor,
    ::testing::Values(NoSurvivorCase{"TheNewestCheckpointContinuesTheJob", true,
                                     "has no process of the one before (every rank that held the training state is "
                                     "gone): the job goes on from the checkpoint resumed, at step "},
                      NoSurvivorCase{"AndNoCheckpointTheRestartSaysItBeginsAgain", false,
                                     "resumed no checkpoint: the training starts again from step 0 (to go on from "
                                     "the newest checkpoint instead: --checkpoint-dir DIR --resume auto)"}),
    [](const auto& info) { return std::string(info.param.name); });

// --nnodes 3:3: with one node lost the others are below MIN. They wait --rdzv-timeout, then the
// first to come back saves its state, and both exit 75 (preempted, resumable) saying so. Rank 1
// comes back 1.5 s after rank 0 (AIACC_TEST_LATE_TO_REGROUP_MS), so rank 0 gives up, saves and
// stops the job while rank 1 still waits: rank 1 must stop as a survivor (75), not as a finished
// job's straggler (it exited 0 so once in CI, when it came back late under load). Rank 1 is
// also held (SIGSTOP) from just after it arrived until 1 s after node 0's worker exited: node 0's
// launcher, which serves the store, must go on serving until rank 1 has read how the job ended
// (it used to stop at once, and rank 1 then met a closed store).
// --rdzv-timeout bounds the first generation's wait too: 2 s failed once on a loaded machine
// (a node's worker started later than that, and the job never began); 8 s.
TEST(Elastic, BelowMinTheSurvivorsSaveTheStateAndStopResumable) {
  test::TempDir d;
  JobSpec spec;
  spec.extra = strCat("--rdzv-timeout 8 --checkpoint-dir ", d / "ckpt");
  spec.nnodes = "3:3";
  spec.env = "AIACC_TEST_LATE_TO_REGROUP_MS=1500";
  spec.act = "W0=$(pgrep -P $L0); W1=$(pgrep -P $L1); kill -KILL $W; for i in $(seq 600); do "
             "grep -q 'rank 1 arrives for the next generation' log1 && break; sleep 0.05; done; sleep 0.5; "
             "kill -STOP $W1; while kill -0 $W0 2> /dev/null; do sleep 0.05; done; sleep 1; kill -CONT $W1";
  const Job job = runKilledJob(d, spec);
  EXPECT_NE(job.out.find("rc0=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("only 2 of at least 3 processes arrived for generation 1 within 8 s"), std::string::npos)
      << job.out;
  EXPECT_NE(job.out.find("another surviving process stopped the job"), std::string::npos) << job.out;
  const size_t saved = job.out.find("; saved " + (d / "ckpt") + "/step-");
  ASSERT_NE(saved, std::string::npos) << job.out;
  EXPECT_NE(job.out.find("run the job again with --resume auto to continue"), std::string::npos) << job.out;
  // The other, let go once node 0's worker exited, finds the note of that save in its turn.
  EXPECT_EQ(test::occurrences(job.out, "; stopped; step "), 1) << job.out;
  EXPECT_EQ(test::occurrences(job.out, " is saved already (" + (d / "ckpt") + "/step-"), 1) << job.out;
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(d / "ckpt")) files += f.path().extension() == ".ckpt";
  EXPECT_EQ(files, 1);
}

// Below MIN the saved state continues in a smaller world: the job run again on the two nodes left
// (--nnodes 2:3 --resume auto) resumes the survivor's checkpoint of the three-rank job, shares the
// rest of the epoch out between two ranks, and ends; no sample of the epoch is trained twice over
// both runs.
TEST(Elastic, BelowMinTheSavedStateContinuesOnTheNodesLeft) {
  test::TempDir d;
  JobSpec spec;
  spec.extra = strCat("--rdzv-timeout 8 --checkpoint-dir ", d / "ckpt");
  spec.nnodes = "3:3";
  spec.again = "2:3";
  const Job job = runKilledJob(d, spec);
  EXPECT_NE(job.out.find("rc0=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("resume: the checkpoint was written by 3 ranks, this generation has 2: the rest of epoch 1 "
                         "is shared out among them"),
            std::string::npos)
      << job.out;
  expectTheRunAgainEndedOnTwoNodes(job);
}

TEST(Elastic, NodeRangeIsParsedAndBadOnesAreRefused) {
  auto out = test::runTrain("--nnodes 3:2 --data synthetic");
  EXPECT_NE(out.second.find("--nnodes 3:2: MIN must not exceed MAX"), std::string::npos) << out.second;
  out = test::runTrain("--nnodes 2:x --data synthetic");
  EXPECT_NE(out.second.find("--nnodes must be N or MIN:MAX"), std::string::npos) << out.second;
  out = test::runTrain("--max-restarts 2 --data synthetic");
  EXPECT_EQ(out.first, 2) << "a usage error";
  EXPECT_NE(out.second.find("--max-restarts needs an elastic job"), std::string::npos) << out.second;
  // A rank of an elastic job not started by aiacc's launcher: the store would die with rank 0.
  out = test::runShell(strCat("env AIACC_RANK=0 AIACC_WORLD_SIZE=2 AIACC_LOCAL_RANK=0 AIACC_LOCAL_SIZE=2 ",
                              AIACC_TRAIN_BIN, " --nnodes 1:2 --data synthetic 2>&1"));
  EXPECT_NE(out.second.find("needs the rendezvous store outside the workers"), std::string::npos) << out.second;
}

}  // namespace
}  // namespace aiacc::app
