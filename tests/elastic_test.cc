// Elastic jobs (--nnodes MIN:MAX, app/elastic.h): three emulated nodes, each one aiacc_train
// launcher with one worker (--nproc 1), on real JPEGs; they share this host, so their ranks
// talk over shared memory (and over Gloo with --noshm). Node 2's worker is SIGKILLed once the job
// trains; the other two go on from the most advanced survivor's state and share out the rest of
// the epoch; with --max-restarts its launcher starts it again and it rejoins. Every step's
// samples go to a log (AIACC_TEST_SAMPLE_LOG): no sample of the epoch is trained twice, and none
// is missed beyond the tail every epoch drops (whole batches only).
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
#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

constexpr int kClasses = 6, kPerClass = 40;  // 240 training images
constexpr int kBatch = 8;

// What the sample logs say about epoch 0: how often each sample was trained, counting a step only
// if no later generation restored a state from before it (a step some rank applied that the
// others did not is trained again); *trained: the images of every such step, all epochs.
std::map<int64_t, int> epochZeroCounts(const std::string& dir, std::string* restores, int64_t* trained) {
  std::map<int64_t, int64_t> restored;  // generation -> the step it went on from
  struct Step {
    int64_t generation, step, epoch;
    std::vector<int64_t> samples;
  };
  std::vector<Step> steps;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().filename().string().rfind("samples.", 0) != 0) continue;
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string kind;
      words >> kind;
      if (kind == "restore") {
        int64_t g = 0, s = 0;
        words >> g >> s;
        restored[g] = s;
        continue;
      }
      Step st;
      words >> st.generation >> st.step >> st.epoch;
      for (int64_t id; words >> id;) st.samples.push_back(id);
      steps.push_back(std::move(st));
    }
  }
  for (const auto& [g, s] : restored) *restores += strCat("generation ", g, " from step ", s, "; ");
  std::map<int64_t, int> counts;
  for (const Step& st : steps) {
    bool redone = false;
    for (const auto& [g, s] : restored) redone = redone || (g > st.generation && st.step > s);
    if (!redone) *trained += static_cast<int64_t>(st.samples.size());
    if (redone || st.epoch != 0) continue;
    for (int64_t id : st.samples) ++counts[id];
  }
  return counts;
}

struct Job {
  std::string out;
  Json report;
  std::map<int64_t, int> counts;
  std::string restores;
  int64_t trained = 0;  // images of the steps kept, all epochs (the sample logs)
};

// Three nodes of one job; node 2's worker SIGKILLed after rank 0's first metrics line. (The
// first generation waits up to 10 s for all three, --rdzv-last-call: with the default 1 s a node
// slow to start on a loaded machine joins later as a newcomer, and the fault meets a job the test
// did not mean, as it once did in CI.)
// `act`: what is done to the worker, $W (default: SIGKILL; $L0..$L2 are the nodes' launchers).
// `kubeflow`: each node's aiacc_train gets Kubeflow's PET_* variables instead of the launch flags
// (an elastic PyTorchJob's pods). `server`: the store is served by a standalone
// `aiacc_train --rendezvous-server` (its exit code and log in the output as rcS and logS), every
// node names it with --rdzv-endpoint and writes a report (r<node>.json; job.report: node 1's).
// `again` (not with `server`): once all three launchers ended, nodes 0 and 1 run the same job again
// with --nnodes `again` --resume auto (exit codes again0=, again1=; job.report: theirs).
// `when`: a shell test the act waits for (default: rank 0's first metrics line).
Job runKilledJob(const test::TempDir& d, const std::string& extra, const std::string& nnodes = "2:3",
                 const std::string& act = "kill -KILL $W", bool kubeflow = false, bool server = false,
                 const std::string& again = "", const std::string& when = "[ -s m.jsonl ]") {
  const std::string data = d / "ds";
  const auto made = test::runTrain(strCat("--make-sample ", data, " --sample-classes ", kClasses,
                                          " --sample-shapes 3 --sample-train-per-class ", kPerClass,
                                          " --sample-val-per-class 5 --sample-min-side 40 --sample-max-side 64"));
  EXPECT_EQ(made.first, 0) << made.second;
  const std::string port = std::to_string(test::freePort());
  const std::string metrics = d / "m.jsonl";
  std::string script = "cd " + d.path() + "; ";
  if (server) {
    script += strCat(AIACC_TRAIN_BIN, " --rendezvous-server --rdzv-endpoint 127.0.0.1:", port, " > logS 2>&1 & S=$!; ");
  }
  auto node = [&](int n, const std::string& range, const std::string& more, const std::string& log) {
    const std::string launch = kubeflow ? strCat("PET_NNODES=", range, " PET_NODE_RANK=", n,
                                                 " PET_NPROC_PER_NODE=1 PET_MASTER_ADDR=127.0.0.1 ",
                                                 "PET_MASTER_PORT=", port, " ")
                                        : std::string();
    const std::string flags = kubeflow ? std::string()
                                       : strCat(" --nproc 1 --nnodes ", range, " --node-rank ", n,
                                                server ? " --rdzv-endpoint 127.0.0.1:" : " --master 127.0.0.1:", port);
    return strCat(launch, "AIACC_TEST_SAMPLE_LOG=", d / "samples", " ", AIACC_TRAIN_BIN, " --data ", data,
                  " --arch resnet18 --image-size 32 --rdzv-timeout 60 --rdzv-last-call 10 --batch-size ", kBatch,
                  " --epochs 2 --warmup-epochs 0 --threads 1 --workers 1 --log-every 2 --comm-timeout 60", flags, " ",
                  extra, more, n == 0 ? strCat(" --metrics-file ", metrics) : std::string(),
                  n == 0 || server ? strCat(" --report-file ", d / (n == 0 ? "r.json" : strCat("r", n, ".json")))
                                   : std::string(),
                  " > ", log, " 2>&1 & L", n, "=$!; ");
  };
  for (int n = 0; n < 3; ++n) script += node(n, nnodes, "", strCat("log", n));
  // (A launcher that has ended already ends the wait: its job failed before the act, and the
  // output below says how.)
  script += "for i in $(seq 600); do " + when +
            " && break; kill -0 $L0 $L1 $L2 2> /dev/null || break; sleep 0.1; done; " + "W=$(pgrep -P $L2); " + act +
            "; "
            "wait $L0; echo rc0=$?; wait $L1; echo rc1=$?; wait $L2; echo rc2=$?; " +
            (server ? "wait $S; echo rcS=$?; cat logS; " : "") + "cat log0 log1 log2; ";
  if (!again.empty()) {
    // (Both nodes are MIN: no last call to wait for a third.)
    for (int n = 0; n < 2; ++n) script += node(n, again, " --resume auto --rdzv-last-call 0", strCat("again", n));
    script += "wait $L0; echo again0=$?; wait $L1; echo again1=$?; cat again0 again1";
  }
  test::writeText(d / "job.sh", script + "\n");
  Job job;
  job.out = test::runShell("timeout 300 bash " + d.path() + "/job.sh 2>&1").second;
  const std::string report = d / (server ? "r1.json" : "r.json");
  if (std::filesystem::exists(report)) job.report = test::readJson(report);
  job.counts = epochZeroCounts(d.path(), &job.restores, &job.trained);
  return job;
}

// No sample twice; unseen only the tail whole batches leave (under `world` ranks of kBatch, at
// most world x (kBatch - 1) + world - 1 samples of the epoch), in each world the epoch had.
void expectEachSampleOnce(const Job& job, int worlds_tail) {
  int twice = 0;
  for (const auto& [id, n] : job.counts) twice += n > 1 ? 1 : 0;
  EXPECT_EQ(twice, 0) << job.restores << job.out;
  const int unseen = kClasses * kPerClass - static_cast<int>(job.counts.size());
  EXPECT_GE(unseen, 0);
  EXPECT_LE(unseen, worlds_tail) << job.restores << job.out;
}

// Over shared memory (the emulated nodes share this host) and over Gloo (--noshm).
class ElasticTransports : public ::testing::TestWithParam<bool> {};

TEST_P(ElasticTransports, AKilledNodeLeavesTheOthersTrainingWithNoSampleLostOrRepeated) {
  const bool shm = GetParam();
#if !AIACC_WITH_GLOO
  if (!shm) GTEST_SKIP() << "this build has no GlooTransport";
#endif
  test::TempDir d;
  // No metrics line before the epoch's end (--log-every 100): the steps trained before the kill
  // are still to be counted when the ranks regroup. The kill comes once each rank applied 2 steps.
  const Job job = runKilledJob(d, shm ? "--log-every 100" : "--noshm --log-every 100", "2:3", "kill -KILL $W", false,
                               false, "", "[ \"$(cat samples.* 2> /dev/null | grep -c ^step)\" -ge 6 ]");
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
  if (shm) {
    EXPECT_NE(job.out.find("shm: rank 2 died (its process is gone)"), std::string::npos) << job.out;
  }
}

INSTANTIATE_TEST_SUITE_P(Elastic, ElasticTransports, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "SharedMemory" : "Gloo"); });

TEST(Elastic, AKilledWorkerStartedAgainRejoinsTheRunningJob) {
  test::TempDir d;
  const Job job = runKilledJob(d, "--max-restarts 1");
  EXPECT_NE(job.out.find("rc0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc2=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("starting it again to join the running job (restart 1 of 1)"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("elastic: joined generation"), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("membership")) << job.out;
  EXPECT_EQ(job.report.at("membership").back().at("world_after"), 3) << job.report.at("membership");
  EXPECT_EQ(job.report.at("world_size"), 3);
  expectEachSampleOnce(job, 3 * (kBatch - 1) + 2);
}

// The store served by a standalone aiacc_train --rendezvous-server: node 0 (its launcher and its
// worker, rank 0) SIGKILLed; nodes 1 and 2 regroup and finish the job, each sample of the epoch
// seen once, and the server ends by itself when the job's last rank 0 says the job ended.
TEST(Elastic, WithAStandaloneStoreTheJobOutlivesNodeZero) {
  test::TempDir d;
  const Job job = runKilledJob(d, "", "2:3", "kill -KILL $(pgrep -P $L0) $L0", false, /*server=*/true);
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
// they form a generation with no survivor, and each starts from the newest valid checkpoint
// (--resume auto); the job ends at its last step.
TEST(Elastic, WithNoSurvivorTheNewestCheckpointContinuesTheJob) {
  test::TempDir d;
  // (A last call of 5 s: the three restarted workers form one generation however slowly they start.)
  const Job job = runKilledJob(d,
                               strCat("--max-restarts 1 --rdzv-last-call 5 --resume auto --checkpoint-every 2 "
                                      "--checkpoint-dir ",
                                      d / "ck"),
                               "2:3",
                               "for i in $(seq 600); do ls ck/step-*.manifest > /dev/null 2>&1 && break; sleep 0.05; "
                               "done; kill -KILL $(pgrep -P $L0) $(pgrep -P $L1) $(pgrep -P $L2)");
  EXPECT_NE(job.out.find("rc0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc2=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("resumed from " + d / "ck/step-"), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("epochs")) << job.out;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
}

// --nnodes 3:3: with one node lost the others are below MIN. They wait --rdzv-timeout, then the
// first to come back saves its state, and both exit 75 (preempted, resumable) saying so.
// --rdzv-timeout bounds the first generation's wait too: 2 s failed once on a loaded machine
// (a node's worker started later than that, and the job never began); 8 s.
TEST(Elastic, BelowMinTheSurvivorsSaveTheStateAndStopResumable) {
  test::TempDir d;
  const Job job = runKilledJob(d, strCat("--rdzv-timeout 8 --checkpoint-dir ", d / "ckpt"), "3:3");
  EXPECT_NE(job.out.find("rc0=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("only 2 of at least 3 processes arrived for generation 1 within 8 s"), std::string::npos)
      << job.out;
  const size_t saved = job.out.find("; saved " + (d / "ckpt") + "/step-");
  ASSERT_NE(saved, std::string::npos) << job.out;
  EXPECT_NE(job.out.find("run the job again with --resume auto to continue"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("one surviving rank saves its state"), std::string::npos) << job.out;
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
  const Job job = runKilledJob(d, strCat("--rdzv-timeout 8 --checkpoint-dir ", d / "ckpt"), "3:3", "kill -KILL $W",
                               false, false, "2:3");
  EXPECT_NE(job.out.find("rc0=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=75"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("again0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("again1=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("resume: the checkpoint was written by 3 ranks, this generation has 2: the rest of epoch 1 "
                         "is shared out among them"),
            std::string::npos)
      << job.out;
  ASSERT_TRUE(job.report.contains("epochs")) << job.out;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
  EXPECT_EQ(job.report.at("world_size"), 2);
  expectEachSampleOnce(job, 3 * (kBatch - 1) + 2 + 2 * (kBatch - 1) + 1);
}

// SIGSTOP: the worker's sockets stay open and nothing comes. Its neighbours name it within the
// heartbeat timeout (3 s), and the others go on without it. After SIGCONT its step fails (the
// others closed their transports), it comes back as a process of an old generation, waits for
// the next one, and is let in at a step boundary with the running group's state: the group is
// never corrupted (no sample twice, the parameter hash checked after every regroup).
TEST(Elastic, AStoppedWorkerIsLeftOutAndRejoinsAfterItContinues) {
  test::TempDir d;
  // (4 epochs: the job still runs when the worker continues.)
  const Job job = runKilledJob(d, "--epochs 4", "2:3", "kill -STOP $W; sleep 4; kill -CONT $W");
  EXPECT_NE(job.out.find("rc0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc2=0"), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("membership")) << job.out;
  const Json& left = job.report.at("membership").at(0);
  EXPECT_EQ(left.at("world_after"), 2) << left;
  // (Named by its neighbours on the heartbeat ring; rank 0 may see rank 1's abort first.)
  EXPECT_NE(job.out.find(": rank 2 stopped responding: no heartbeat for"), std::string::npos) << job.out;
  EXPECT_LT(left.at("detect_s").get<double>(), 6) << left;  // the 3 s heartbeat timeout, not --comm-timeout
  EXPECT_EQ(job.report.at("membership").back().at("world_after"), 3) << job.report.at("membership");
  expectEachSampleOnce(job, 3 * (kBatch - 1) + 2);
}

// Kubeflow's elastic PyTorchJob: PET_NNODES=2:3, aiacc_train as each pod's command (its node's
// launcher). The same recovery, and --max-restarts works there too.
TEST(Elastic, UnderAnElasticPyTorchJobAKilledWorkerRejoins) {
  test::TempDir d;
  const Job job = runKilledJob(d, "--max-restarts 1", "2:3", "kill -KILL $W", /*kubeflow=*/true);
  EXPECT_NE(job.out.find("rc0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc2=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("elastic: joined generation"), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("membership")) << job.out;
  EXPECT_EQ(job.report.at("world_size"), 3);
  expectEachSampleOnce(job, 3 * (kBatch - 1) + 2);
}

TEST(Elastic, NodeRangeIsParsedAndBadOnesAreRefused) {
  auto out = test::runTrain("--nnodes 3:2 --data synthetic");
  EXPECT_NE(out.second.find("--nnodes 3:2: MIN must not exceed MAX"), std::string::npos) << out.second;
  out = test::runTrain("--nnodes 2:x --data synthetic");
  EXPECT_NE(out.second.find("--nnodes must be N or MIN:MAX"), std::string::npos) << out.second;
  out = test::runTrain("--max-restarts 2 --data synthetic");
  EXPECT_NE(out.second.find("--max-restarts needs an elastic job"), std::string::npos) << out.second;
  // A rank of an elastic job not started by aiacc's launcher: the store would die with rank 0.
  out = test::runShell(strCat("env AIACC_RANK=0 AIACC_WORLD_SIZE=2 AIACC_LOCAL_RANK=0 AIACC_LOCAL_SIZE=2 ",
                              AIACC_TRAIN_BIN, " --nnodes 1:2 --data synthetic 2>&1"));
  EXPECT_NE(out.second.find("needs the rendezvous store outside the workers"), std::string::npos) << out.second;
}

}  // namespace
}  // namespace aiacc::app
