// Preemption: a stop request (a signal) ends the run at a step every rank agrees on, with that
// step's checkpoint; --resume auto continues the same epoch at its next batch, and the
// interrupted run and its continuation together are the uninterrupted run, bit for bit.
// In one process (an injected stop request at a chosen step) and as real aiacc_train processes
// under the --nproc launcher (real signals).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "app/trainer.h"
#include "models/torch_format.h"
#include "tests/checkpoint_tensors.h"
#include "tests/comm_test_util.h"  // AIACC_SKIP_WITHOUT_GLOO
#include "tests/json_util.h"
#include "tests/test_util.h"
#include "tests/train_problem.h"

namespace aiacc::app {
namespace {

const auto newest = test::newestCheckpoint;
using test::expectSameTensors;

class Preemption : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    test::makeLearnableSample(*dir_ / "ds");
  }
  static void TearDownTestSuite() { delete dir_; }
  static Config config() {
    Config c = test::learnableConfig(*dir_ / "ds");
    c.epochs = 2;             // 20 steps each
    c.arch = "resnet18-w16";  // (what a stop and a resume keep does not depend on the model's size)
    return c;
  }
  static test::TempDir* dir_;
};
test::TempDir* Preemption::dir_ = nullptr;

// A stop request at step 27 (epoch 2, batch 7): the run stops there with that step's checkpoint;
// resumed with --resume auto it continues at batch 8 of epoch 2. Losses, parameters, BN
// statistics and momentum equal the uninterrupted run's exactly; every batch of every epoch is
// trained once; the report continues (steps, evaluations).
TEST_F(Preemption, StopMidEpochAndResumeIsTheUninterruptedRun) {
  test::TempDir d;
  Config whole = config();
  whole.checkpoint_dir = d / "whole";
  whole.metrics_file = d / "whole.jsonl";
  const Report full = Trainer(whole, {}, localSync(), Trainer::Clock::now()).run();
  ASSERT_FALSE(full.preempted);
  ASSERT_EQ(full.steps, 40);

  Config first = config();
  first.checkpoint_dir = d / "ck";
  first.metrics_file = d / "parts.jsonl";
  Trainer interrupted(first, {}, localSync(), Trainer::Clock::now());
  int polls = 0;  // once a step, and once per batch of epoch 1's evaluation (5 of 16 images)
  interrupted.setStopRequest([&] { return ++polls >= 20 + 5 + 7 ? SIGTERM : 0; });
  const Report part = interrupted.run();
  EXPECT_TRUE(part.preempted);
  EXPECT_EQ(part.stop_signal, SIGTERM);
  EXPECT_EQ(part.steps, 27) << "alone, the vote answers at once: the stop is at the requested step";
  EXPECT_EQ(part.saved_step, 27);
  EXPECT_EQ(part.checkpoint, first.checkpoint_dir + "/step-000000000027.ckpt");
  EXPECT_EQ(part.evals.size(), 1u) << "epoch 1's evaluation";

  Config second = first;
  second.resume = "auto";
  const Report rest = Trainer(second, {}, localSync(), Trainer::Clock::now()).run();
  EXPECT_FALSE(rest.preempted);
  EXPECT_EQ(rest.steps, 40);
  EXPECT_EQ(rest.images_seen, full.images_seen);
  ASSERT_EQ(rest.evals.size(), 2u) << "the report covers the whole run";
  EXPECT_EQ(rest.evals[0].top1, full.evals[0].top1);
  EXPECT_EQ(rest.evals[1].top1, full.evals[1].top1);
  EXPECT_EQ(rest.evals[1].loss, full.evals[1].loss);

  const auto want = test::metricValues(whole.metrics_file, "step", "loss");
  const auto got = test::metricValues(first.metrics_file, "step", "loss");  // both parts, appended
  ASSERT_EQ(want.size(), 40u);
  EXPECT_EQ(got, want) << "per-step losses of the two parts equal the uninterrupted run's";
  const auto steps = test::metricValues(first.metrics_file, "step", "step");
  const auto epochs = test::metricValues(first.metrics_file, "step", "epoch");
  const auto batches = test::metricValues(first.metrics_file, "step", "batch");
  ASSERT_EQ(batches.size(), 40u);
  std::set<std::pair<int, int>> seen;  // (epoch, batch): every batch of each epoch once
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(steps[i], static_cast<double>(i + 1));
    const int epoch = static_cast<int>(std::ceil(epochs[i]) - 1);
    EXPECT_TRUE(seen.insert({epoch, static_cast<int>(batches[i])}).second) << "batch trained twice at step " << i + 1;
  }
  EXPECT_EQ(seen.size(), 40u);
  expectSameTensors(newest(whole.checkpoint_dir), newest(first.checkpoint_dir), 8);
  EXPECT_EQ(newest(first.checkpoint_dir), first.checkpoint_dir + "/step-000000000040.ckpt");
}

// A stop request during an evaluation ends it unrecorded; the checkpoint is the step's, and
// the resumed run evaluates that point first, then goes on: the same history as without stop.
TEST_F(Preemption, StopDuringEvaluationResumesWithThatEvaluation) {
  test::TempDir d;
  Config whole = config();
  whole.epochs = 1;
  whole.eval_every = 8;
  const Report full = Trainer(whole, {}, localSync(), Trainer::Clock::now()).run();
  ASSERT_EQ(full.evals.size(), 3u);  // steps 8, 16, 20

  Config first = whole;
  first.checkpoint_dir = d / "ck";
  Trainer interrupted(first, {}, localSync(), Trainer::Clock::now());
  int polls = 0;  // 8 steps, then the evaluation's batches (5 of 16 images): stop in its 3rd
  interrupted.setStopRequest([&] { return ++polls >= 8 + 3 ? SIGUSR1 : 0; });
  const Report part = interrupted.run();
  EXPECT_TRUE(part.preempted);
  EXPECT_EQ(part.stop_signal, SIGUSR1);
  EXPECT_EQ(part.steps, 8);
  EXPECT_TRUE(part.evals.empty()) << "the interrupted evaluation is not recorded";

  Config second = first;
  second.resume = "auto";
  const Report rest = Trainer(second, {}, localSync(), Trainer::Clock::now()).run();
  ASSERT_EQ(rest.evals.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rest.evals[i].step, full.evals[i].step);
    EXPECT_EQ(rest.evals[i].loss, full.evals[i].loss) << "evaluation " << i;
  }
}

// --resume auto over a damaged newest checkpoint (truncated, one byte flipped): the one before
// it (step 10, mid-epoch), which is whole, is taken, and the run goes on from there to the same
// end.
TEST_F(Preemption, ResumeAutoPassesOverADamagedNewestCheckpoint) {
  for (const bool truncate : {true, false}) {
    test::TempDir d;
    Config c = config();
    c.epochs = 1;
    c.checkpoint_dir = d / "ck";
    c.checkpoint_every_steps = 10;
    c.metrics_file = d / "m.jsonl";
    const Report full = Trainer(c, {}, localSync(), Trainer::Clock::now()).run();
    ASSERT_EQ(full.steps, 20);
    const std::string last = newest(c.checkpoint_dir);
    ASSERT_EQ(last, c.checkpoint_dir + "/step-000000000020.ckpt");
    std::string bytes = test::readText(last);
    if (truncate) {
      bytes.resize(bytes.size() / 2);
    } else {
      bytes[bytes.size() / 3] ^= 0x10;
    }
    test::writeText(last, bytes);
    Config again = c;
    again.resume = "auto";
    again.metrics_file = d / "again.jsonl";
    const Report rest = Trainer(again, {}, localSync(), Trainer::Clock::now()).run();
    EXPECT_EQ(rest.steps, 20) << (truncate ? "truncated" : "flipped");
    const auto steps = test::metricValues(again.metrics_file, "step", "step");
    ASSERT_EQ(steps.size(), 10u) << "from the checkpoint of step 10";
    EXPECT_EQ(steps.front(), 11);
    const auto losses = test::metricValues(c.metrics_file, "step", "loss");
    EXPECT_EQ(test::metricValues(again.metrics_file, "step", "loss"),
              std::vector<double>(losses.begin() + 10, losses.end()));
  }
}

// --checkpoint-every 7 (steps) over 2 epochs of 20: checkpoints at steps 7 and 14, the epoch end
// (20), then 21, 28, 35 and the end (40); --keep-checkpoints 3 leaves the newest three. A run
// resumed from the mid-epoch one of step 35 (the newer removed) ends as the uninterrupted one.
// Each step waits (in its stop poll, before that step's checkpoint is decided) until the writes
// submitted before it have ended (the writer's kWriterIdle), as a fast disk would: none is
// skipped, whatever this box's speed.
TEST_F(Preemption, CheckpointEveryStepsIsExactMidEpoch) {
  test::TempDir d;
  Config c = config();
  c.checkpoint_dir = d / "ck";
  c.checkpoint_every_steps = 7;
  c.metrics_file = d / "m.jsonl";
  const std::vector<int64_t> saved_at{7, 14, 20, 21, 28, 35, 40};
  std::mutex mu;
  std::condition_variable cv;
  int64_t ended = 0;
  Trainer t(c, {}, localSync(), Trainer::Clock::now());
  t.setCheckpointFaultHook([&](CheckpointPhase phase, int64_t) {
    if (phase != CheckpointPhase::kWriterIdle) return;
    std::lock_guard<std::mutex> lock(mu);
    ++ended;
    cv.notify_all();
  });
  t.setStopRequest([&] {
    // The step just trained: its metrics line is written (and flushed) before the stop poll. An
    // evaluation's polls see the step it evaluates.
    const int64_t step = static_cast<int64_t>(test::metricValues(c.metrics_file, "step", "step").size());
    const auto before = std::count_if(saved_at.begin(), saved_at.end(), [&](int64_t s) { return s < step; });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(300), [&] { return ended >= before; });
    return 0;
  });
  const Report full = t.run();
  EXPECT_EQ(full.checkpoint_skips, 0);
  ASSERT_EQ(full.steps, 40);
  std::vector<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(c.checkpoint_dir)) {
    if (f.path().extension() == ".ckpt") files.push_back(f.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files,
            (std::vector<std::string>{"step-000000000028.ckpt", "step-000000000035.ckpt", "step-000000000040.ckpt"}));
  std::filesystem::remove(c.checkpoint_dir + "/step-000000000040.ckpt");
  std::filesystem::remove(c.checkpoint_dir + "/step-000000000040.manifest");
  std::filesystem::remove(c.checkpoint_dir + "/latest");
  Config again = c;
  again.resume = "auto";
  again.checkpoint_dir = c.checkpoint_dir;
  again.metrics_file = d / "again.jsonl";
  const Report rest = Trainer(again, {}, localSync(), Trainer::Clock::now()).run();
  EXPECT_EQ(rest.steps, 40);
  const auto losses = test::metricValues(c.metrics_file, "step", "loss");
  EXPECT_EQ(test::metricValues(again.metrics_file, "step", "loss"),
            std::vector<double>(losses.begin() + 35, losses.end()));
  EXPECT_EQ(test::metricValues(again.metrics_file, "step", "batch"), (std::vector<double>{15, 16, 17, 18, 19}));
}

// A slow disk: the write of step 2 blocks until training has reached step 12. Steps go on
// meanwhile; the checkpoints due then (every 2 steps) are skipped and counted, not queued; the
// blocked write completes, and so do the ones after it.
TEST_F(Preemption, StepsGoOnWhileACheckpointIsWritten) {
  test::TempDir d;
  Config c = config();
  c.epochs = 1;
  c.checkpoint_dir = d / "ck";
  c.checkpoint_every_steps = 2;
  c.keep_checkpoints = 20;
  Trainer t(c, {}, localSync(), Trainer::Clock::now());
  std::atomic<int> polls{0};  // the stop request is polled once a step: a step counter
  t.setStopRequest([&] {
    ++polls;
    return 0;
  });
  std::atomic<int> step_when_released{0};
  t.setCheckpointFaultHook([&](CheckpointPhase phase, int64_t step) {
    if (step != 2 || phase != CheckpointPhase::kBeforePayload) return;
    for (int i = 0; i < 30000 && polls < 12; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    step_when_released = polls.load();
  });
  const Report r = t.run();
  EXPECT_GE(step_when_released, 12) << "training went on while the write of step 2 was held";
  EXPECT_GE(r.checkpoint_skips, 4) << "steps 4..10 fell due while it was held";
  EXPECT_EQ(r.checkpoint_failures, 0);
  EXPECT_TRUE(std::filesystem::exists(c.checkpoint_dir + "/step-000000000002.ckpt"));
  EXPECT_EQ(newest(c.checkpoint_dir), c.checkpoint_dir + "/step-000000000020.ckpt");
}

// --checkpoint-every by time (here: always due): rank 0's request comes back through the vote
// and a checkpoint is taken at that step, or counted as skipped when the previous write is still
// going (how many of each depends on the disk's speed; their sum does not). The run's end, within
// its epoch, writes one more: step 5 with its final evaluation.
TEST_F(Preemption, CheckpointEveryTimeTakesCheckpoints) {
  test::TempDir d;
  Config c = config();
  c.epochs = 1;
  c.max_steps = 5;
  c.checkpoint_dir = d / "ck";
  c.checkpoint_every_s = 1e-9;
  c.keep_checkpoints = 10;
  std::mutex mu;
  std::vector<int64_t> writes;  // the step of each write, in order
  Trainer t(c, {}, localSync(), Trainer::Clock::now());
  t.setCheckpointFaultHook([&](CheckpointPhase phase, int64_t step) {
    if (phase != CheckpointPhase::kBeforePayload) return;
    std::lock_guard<std::mutex> lock(mu);
    writes.push_back(step);
  });
  const Report r = t.run();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(writes.empty());
  EXPECT_EQ(writes.back(), 5) << "the end's checkpoint";
  EXPECT_EQ(static_cast<int64_t>(writes.size()) - 1 + r.checkpoint_skips, 5)
      << "alone, the vote answers at once: every step asks for a checkpoint";
  EXPECT_EQ(writes.front(), 1) << "the first request finds the writer idle";
  EXPECT_EQ(r.checkpoint_failures, 0);
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(c.checkpoint_dir)) n += f.path().extension() == ".ckpt";
  EXPECT_EQ(n, static_cast<int>(std::set<int64_t>(writes.begin(), writes.end()).size()));
}

// Stopped at the last step --max-steps allows (the stop vote comes before that limit): the
// resumed run trains no further step, evaluates the end and reports it.
TEST_F(Preemption, ResumedAtMaxStepsTrainsNoFurther) {
  test::TempDir d;
  Config c = config();
  c.max_steps = 5;
  c.checkpoint_dir = d / "ck";
  Trainer t(c, {}, localSync(), Trainer::Clock::now());
  int polls = 0;
  t.setStopRequest([&] { return ++polls >= 5 ? SIGTERM : 0; });
  const Report part = t.run();
  ASSERT_TRUE(part.preempted);
  ASSERT_EQ(part.saved_step, 5);
  Config again = c;
  again.resume = "auto";
  const Report rest = Trainer(again, {}, localSync(), Trainer::Clock::now()).run();
  EXPECT_FALSE(rest.preempted);
  EXPECT_EQ(rest.steps, 5);
  ASSERT_EQ(rest.evals.size(), 1u);
  EXPECT_EQ(rest.evals.back().step, 5);
}

// A run that ends within an epoch at --max-steps (issue: resubmitting a finished job redid steps
// from the last epoch's checkpoint) leaves a checkpoint of its last step, its final evaluation in
// it: the same command run again trains nothing, evaluates nothing and writes nothing.
TEST_F(Preemption, AMaxStepsRunEndsSavedAndRunAgainDoesNothing) {
  test::TempDir d;
  Config c = config();
  c.max_steps = 7;  // within the first epoch of 20 steps
  c.checkpoint_dir = d / "ck";
  c.resume = "auto";
  const Report first = Trainer(c, {}, localSync(), Trainer::Clock::now()).run();
  ASSERT_FALSE(first.preempted);
  ASSERT_EQ(first.evals.size(), 1u);
  EXPECT_EQ(first.evals.back().step, 7);
  const std::string saved = newest(c.checkpoint_dir);
  ASSERT_NE(saved.find("step-000000000007"), std::string::npos) << saved;
  const auto names = test::namesIn(c.checkpoint_dir);
  const std::string bytes = test::readText(saved);
  const Report again = Trainer(c, {}, localSync(), Trainer::Clock::now()).run();
  EXPECT_EQ(again.steps, 7);
  ASSERT_EQ(again.evals.size(), 1u) << "the saved evaluation, not another";
  EXPECT_EQ(again.evals.back().step, 7);
  EXPECT_EQ(test::namesIn(c.checkpoint_dir), names);
  EXPECT_EQ(test::readText(saved), bytes) << "written again";
}

// --resume auto with no checkpoint yet: a fresh start, said once; a checkpoint written with
// other settings that shape the continuation is refused, naming the setting.
TEST_F(Preemption, ResumeAutoStartsAfreshAndRefusesOtherSettings) {
  test::TempDir d;
  Config c = config();
  c.epochs = 1;
  c.max_steps = 3;
  c.checkpoint_dir = d / "ck";
  c.resume = "auto";
  Trainer t(c, {}, localSync(), Trainer::Clock::now());
  t.setStopRequest([] { return SIGTERM; });
  const Report r = t.run();
  EXPECT_TRUE(r.preempted);
  EXPECT_EQ(r.steps, 1);
  ASSERT_EQ(newest(c.checkpoint_dir), c.checkpoint_dir + "/step-000000000001.ckpt");
  Config other = c;
  other.seed = 6;
  try {
    Trainer(other, {}, localSync(), Trainer::Clock::now()).run();
    FAIL() << "resumed with another --seed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--seed 5, this run has 6"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace aiacc::app

namespace aiacc::app {
namespace {

// 2 ranks x batch 8 on 320 synthetic images: 20 steps an epoch, 2 epochs, of the narrowed
// resnet18 (its steps take milliseconds: a test that signals the job holds it at a step first,
// HeldJob); bin: aiacc_train, or aiacc_train_hooked for a test's fault (app/binary_hooks.h).
std::string twoRankJob(const std::string& dir, bool shm, const std::string& bin = AIACC_TRAIN_BIN) {
  return bin + " --nproc 2 --master 127.0.0.1:" + std::to_string(test::freePort()) +
         " --data synthetic --arch resnet18-w16 --synthetic-classes 4 --synthetic-images 320 --batch-size 8"
         " --image-size 32 --epochs 2 --warmup-epochs 0 --threads 1 --noautotune --streams 1 --progress-seconds 1000" +
         (shm ? "" : " --noshm") + " --checkpoint-dir " + dir + "/ck --metrics-file " + dir + "/m.jsonl";
}

// The hooked job held as step STEP ends (AIACC_TEST_HOLD_AT_STEP, app/test_hooks.h): `start`
// runs it in the background (its launcher's pid in $L, its output in LOG) and waits until both
// ranks are held; `go` lets them go. A signal sent in between reaches every rank at STEP, so
// the ranks agree to stop within the step vote's 2 steps of it, however fast the steps are.
struct HeldJob {
  std::string release;  // the file the ranks wait for
  std::string start, go;

  HeldJob(const std::string& job, int step, const std::string& log, const std::string& file) : release(file) {
    start = "AIACC_TEST_HOLD_AT_STEP=" + std::to_string(step) + ":" + release + " " + job + " > " + log +
            " 2>&1 & L=$!; " + test::shellWaitUntil(test::shellHeld(release, 2), 120, "kill -0 $L");
    go = "touch " + release + "; ";
  }
};

// Shell: waits (up to 120 s) until FILE has a line with TEXT.
std::string waitForText(const std::string& file, const std::string& text) {
  return test::shellWaitUntil("grep -q '" + text + "' " + file);
}

// The job's launcher has forwarded its signal to the workers (it signals them, then says so).
std::string waitForwarded(const std::string& log) { return waitForText(log, test::kForwardedLine); }

class PreemptedJob : public ::testing::TestWithParam<bool> {};

// SIGTERM to the launcher in the middle of epoch 1 (real processes): every rank stops at the same
// step, the job exits 75 with one line naming the saved step; the same command with --resume auto
// finishes, and the two runs' per-step losses are the uninterrupted run's. Parameters and momentum
// equal it too; the BatchNorm running statistics agree within float rounding (the stop's
// checkpoint averaged them over the ranks where the uninterrupted run did not: --bn-sync lazy).
TEST_P(PreemptedJob, SigtermToTheLauncherSavesAndResumesExactly) {
  const bool shm = GetParam();
  if (!shm) AIACC_SKIP_WITHOUT_GLOO();
  test::TempDir d;
  const std::string job = twoRankJob(d.path(), shm, AIACC_HOOKED_TRAIN_BIN);
  auto [rc, out] = test::runShell(twoRankJob(d / "whole", shm).replace(0, 0, "mkdir -p " + d.path() + "/whole && ") +
                                  " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  const HeldJob held(job, 6, d / "log", d / "release");
  const std::string script = held.start + "kill -TERM $L; " + waitForwarded(d / "log") + held.go +
                             "wait $L; echo rc=$?; cat " + d.path() + "/log";
  test::writeText(d / "term.sh", script + "\n");
  std::tie(rc, out) = test::runShell("bash " + d.path() + "/term.sh");
  ASSERT_NE(out.find("rc=75"), std::string::npos) << out;
  EXPECT_NE(out.find("aiacc_train: received SIGTERM; forwarding it to the 2 worker(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("; saved " + d.path() + "/ck/step-0000000000"), std::string::npos) << out;
  EXPECT_NE(out.find(".ckpt; run the same command with --resume auto to continue"), std::string::npos) << out;
  const auto steps_before = test::metricValues(d / "m.jsonl", "step", "step");
  ASSERT_FALSE(steps_before.empty());
  ASSERT_LT(steps_before.back(), 20) << "stopped in epoch 1: " << out;
  EXPECT_GE(steps_before.back(), 6) << out;
  EXPECT_LE(steps_before.back(), 8) << "stopped within 2 steps of the signal at step 6\n" << out;
  EXPECT_NE(out.find("after step " + std::to_string(static_cast<int>(steps_before.back())) + "; saved"),
            std::string::npos)
      << "the saved step is the last step trained\n"
      << out;

  std::tie(rc, out) = test::runShell(job + " --resume auto 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("resumed from " + d.path() + "/ck/step-"), std::string::npos) << out;
  EXPECT_NE(out.find(".ckpt at step " + std::to_string(static_cast<int>(steps_before.back())) + " (epoch 1, batch " +
                     std::to_string(static_cast<int>(steps_before.back())) + ")"),
            std::string::npos)
      << out;
  const auto want = test::metricValues(d / "whole/m.jsonl", "step", "loss");
  ASSERT_EQ(want.size(), 40u);
  EXPECT_EQ(test::metricValues(d / "m.jsonl", "step", "loss"), want);
  EXPECT_EQ(test::metricValues(d / "m.jsonl", "step", "step").size(), 40u) << "no step trained twice";
  const auto a = test::checkpointTensors(newest(d / "whole/ck"), 4), b = test::checkpointTensors(newest(d / "ck"), 4);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const bool running_stat = a[i].first.find("running_") != std::string::npos;
    if (running_stat) {
      EXPECT_TRUE(at::allclose(a[i].second, b[i].second, 1e-5, 1e-6)) << a[i].first;
    } else {
      EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first << " differs";
    }
  }
}

// SIGTERM to each worker directly, rank 0 first and rank 1 half a second later, as srun and
// Kubernetes signal each task on its own (the launcher forwards nothing). Rank 0's comes while the
// job is held at step 4: both ranks stop at the same step, within the vote's 2 steps (rank 1 told
// by the vote; by its own signal only where a loaded box delays the stop that long), rank 0 saves
// it, each exits 75, and so does the launcher. Rank 1's signal, later, changes nothing.
TEST(PreemptedJobSignals, SigtermToEachWorkerHalfASecondApart) {
  test::TempDir d;
  const HeldJob held(twoRankJob(d.path(), true, AIACC_HOOKED_TRAIN_BIN), 4, d / "log", d / "release");
  const std::string script = held.start +
                             "for r in 0 1; do for w in $(pgrep -P $L); do "
                             "tr '\\0' '\\n' < /proc/$w/environ | grep -qx AIACC_RANK=$r && kill -TERM $w; done; " +
                             held.go + "sleep 0.5; done; wait $L; echo rc=$?; cat " + d.path() + "/log";
  test::writeText(d / "term.sh", script + "\n");
  const std::string out = test::runShell("bash " + d.path() + "/term.sh").second;
  ASSERT_NE(out.find("rc=75"), std::string::npos) << out;
  EXPECT_NE(out.find("aiacc_train: preempted: 2 of 2 worker(s) saved and stopped (exit 75)"), std::string::npos) << out;
  const auto steps = test::metricValues(d / "m.jsonl", "step", "step");
  ASSERT_FALSE(steps.empty());
  const std::string last = std::to_string(static_cast<int>(steps.back()));
  EXPECT_NE(out.find("[rank 0] aiacc_train: stopped by SIGTERM after step " + last + "; saved "), std::string::npos)
      << out;
  EXPECT_NE(out.find("[rank 1] aiacc_train: rank 1 stopped by "), std::string::npos) << out;
  EXPECT_NE(out.find(" after step " + last + " (rank 0 saved the checkpoint)"), std::string::npos)
      << "every rank stopped at the step saved\n"
      << out;
  EXPECT_EQ(newest(d / "ck"), d / ("ck/step-" + std::string(12 - last.size(), '0') + last + ".ckpt"));
}

// SIGKILL to rank 0's worker mid-epoch, then SIGTERM to rank 1 (the launcher's store outlives
// rank 0): rank 1 writes its own state (no collective: it claims the job's store key), says so,
// and exits 75; the job started again with --resume auto continues from that step, trains each
// later step once, and ends. The checkpoint says its BatchNorm statistics are rank 1's own.
TEST(PreemptedJobSignals, Rank0KilledThenSigtermTheSurvivorSavesAndTheJobResumes) {
  test::TempDir d;
  const std::string job = twoRankJob(d.path(), true, AIACC_HOOKED_TRAIN_BIN);
  const HeldJob held(job, 4, d / "log", d / "release");
  const std::string rank_pid = "$(for w in $(pgrep -P $L); do tr '\\0' '\\n' < /proc/$w/environ | "
                               "grep -qx AIACC_RANK=R && echo $w; done)";
  auto pidOf = [&](int r) { return std::string(rank_pid).replace(rank_pid.find("=R"), 2, "=" + std::to_string(r)); };
  const std::string script = held.start + "R1=" + pidOf(1) + "; kill -KILL " + pidOf(0) +
                             "; sleep 0.3; kill -TERM $R1; " + held.go + "wait $L; echo rc=$?; cat " + d.path() +
                             "/log";
  test::writeText(d / "kill.sh", script + "\n");
  const std::string out = test::runShell("bash " + d.path() + "/kill.sh").second;
  ASSERT_EQ(out.find("rc=0"), std::string::npos) << "a worker was killed: the launcher reports it\n" << out;
  const size_t at = out.find("[rank 1] aiacc_train: ");
  ASSERT_NE(at, std::string::npos) << out;
  const size_t saved_at = out.find("; stopped; saved " + d.path() + "/ck/step-", at);
  ASSERT_NE(saved_at, std::string::npos) << "rank 1 saved its state\n" << out;
  EXPECT_NE(out.find("; run the job again with --resume auto to continue", saved_at), std::string::npos) << out;
  EXPECT_NE(out.find("it saves its own state"), std::string::npos) << out;
  const std::string ckpt = newest(d / "ck");
  ASSERT_EQ(out.find(ckpt, saved_at), saved_at + std::string("; stopped; saved ").size()) << out;
  const c10::impl::GenericDict state =
      models::readTorchSave(ckpt).value.toGenericDict().at("training_state").toGenericDict();
  EXPECT_TRUE(state.at("rank_local_buffers").toBool());
  const int64_t saved_step = state.at("step").toInt();
  const auto logged = test::metricValues(d / "m.jsonl", "step", "step");
  ASSERT_FALSE(logged.empty());
  EXPECT_GE(saved_step, static_cast<int64_t>(logged.back())) << "rank 1 holds every step rank 0 logged";
  EXPECT_LE(saved_step, static_cast<int64_t>(logged.back()) + 1) << "and at most the one rank 0 died in";

  const auto [rc, rest] = test::runShell(job + " --resume auto 2>&1");
  ASSERT_EQ(rc, 0) << rest;
  EXPECT_NE(rest.find("resumed from " + ckpt + " at step " + std::to_string(saved_step)), std::string::npos) << rest;
  const auto steps = test::metricValues(d / "m.jsonl", "step", "step");
  ASSERT_EQ(steps.back(), 40.0);
  const std::set<double> once(steps.begin(), steps.end());
  EXPECT_EQ(once.size(), steps.size()) << "no step logged twice";
  EXPECT_EQ(static_cast<int64_t>(std::count_if(steps.begin(), steps.end(),
                                               [&](double s) { return s > static_cast<double>(saved_step); })),
            40 - saved_step)
      << "every step after the saved one trained once";
}

// SIGUSR1 (Slurm's --signal=USR1@60 warning) to the launcher: the same stop, saved, exit 75,
// within a step plus the checkpoint write plus a few seconds of the signal.
TEST(PreemptedJobSignals, Sigusr1StopsAndSavesPromptly) {
  test::TempDir d;
  const HeldJob held(twoRankJob(d.path(), true, AIACC_HOOKED_TRAIN_BIN), 4, d / "log", d / "release");
  const std::string script = held.start + "t0=$(date +%s%N); kill -USR1 $L; " + waitForwarded(d / "log") + held.go +
                             "wait $L; echo rc=$?; echo ms=$(( ($(date +%s%N) - t0) / 1000000 )); cat " + d.path() +
                             "/log";
  test::writeText(d / "usr1.sh", script + "\n");
  const std::string out = test::runShell("bash " + d.path() + "/usr1.sh").second;
  ASSERT_NE(out.find("rc=75"), std::string::npos) << out;
  EXPECT_NE(out.find("aiacc_train: preempted by SIGUSR1: 2 of 2 worker(s) saved and stopped"), std::string::npos)
      << out;
  EXPECT_NE(out.find("[rank 0] aiacc_train: stopped by SIGUSR1 after step"), std::string::npos) << out;
  const auto at = out.find("ms=");
  ASSERT_NE(at, std::string::npos) << out;
  const int ms = std::atoi(out.c_str() + at + 3);
  std::cout << "SIGUSR1 to exit: " << ms << " ms\n";
  EXPECT_LT(ms, 15000) << "a step (milliseconds here) + the checkpoint write + 2 s, generously bounded on a loaded box";
}

// SIGTERM while a checkpoint is being written: the --checkpoint-every 4 write of step 4, held half
// way through its payload by the test hook (a disk that stalls: AIACC_TEST_HOLD_CHECKPOINT), and
// the launcher signalled then (the ranks held at step 6 meanwhile). Training goes on while the
// write is in flight, the ranks agree on a later step, and rank 0 says it will write that
// step's checkpoint once the write in flight has ended; the test then lets the held write go. Both
// checkpoints end whole, the stop's is the newest, every rank exits 75 at the step saved, and the
// same command with --resume auto finishes the job from it.
TEST(PreemptedJobSignals, SigtermDuringACheckpointWrite) {
  test::TempDir d;
  const std::string release = d / "release";
  const std::string job = twoRankJob(d.path(), true, AIACC_HOOKED_TRAIN_BIN) + " --checkpoint-every 4";
  // Training held at step 6 too, while step 4's write is held: the signal comes during that write.
  const HeldJob held("AIACC_TEST_HOLD_CHECKPOINT=4:" + release + " " + job, 6, d / "log", d / "release-step");
  const std::string script = held.start + "for i in $(seq 2400); do [ -f " + release +
                             ".held ] && break; sleep 0.05; done; kill -TERM $L; " + waitForwarded(d / "log") +
                             held.go + waitForText(d / "log", "writing its checkpoint") + "touch " + release +
                             "; wait $L; echo rc=$?; cat " + d.path() + "/log";
  test::writeText(d / "term.sh", script + "\n");
  std::string out = test::runShell("bash " + d.path() + "/term.sh").second;
  ASSERT_NE(out.find("rc=75"), std::string::npos) << out;
  EXPECT_NE(out.find("AIACC_TEST_HOLD_CHECKPOINT=4:" + release + ": a test's fault hook is set"), std::string::npos)
      << out;
  const auto steps = test::metricValues(d / "m.jsonl", "step", "step");
  ASSERT_FALSE(steps.empty());
  const int last = static_cast<int>(steps.back());
  EXPECT_GT(last, 4) << "the signal came during step 4's write: the stop is at a later step\n" << out;
  const std::string saved = d / ("ck/step-" + std::string(12 - std::to_string(last).size(), '0') +
                                 std::to_string(last) + ".ckpt");
  EXPECT_NE(out.find("[rank 0] aiacc_train: stopped by SIGTERM after step " + std::to_string(last) + "; saved " +
                     saved),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(" after step " + std::to_string(last) + " (rank 0 saved the checkpoint)"), std::string::npos)
      << "every rank stopped at the step saved\n"
      << out;
  EXPECT_NE(out.find("stop after step " + std::to_string(last) +
                     " (SIGTERM): writing its checkpoint once the write in flight has ended"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find(" not saved in "), std::string::npos) << "no write failed\n" << out;
  EXPECT_EQ(newest(d / "ck"), saved);
  EXPECT_TRUE(std::filesystem::exists(d / "ck/step-000000000004.manifest")) << "the held write ended whole";

  int rc = 0;
  std::tie(rc, out) = test::runShell(job + " --resume auto 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("resumed from " + saved), std::string::npos) << out;
  EXPECT_EQ(test::metricValues(d / "m.jsonl", "step", "step").size(), 40u) << "every step trained once";
}

INSTANTIATE_TEST_SUITE_P(Transports, PreemptedJob, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Shm" : "Gloo"; });

}  // namespace
}  // namespace aiacc::app
