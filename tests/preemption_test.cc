// Preemption: a stop request (a signal) ends the run at a step every rank agrees on, with that
// step's checkpoint; --resume auto continues the same epoch at its next batch, and the
// interrupted run and its continuation together are the uninterrupted run, bit for bit.
// In one process, with an injected stop request at a chosen step (as real aiacc_train processes
// under the --nproc launcher, with real signals: tests/preempted_job_test.cc).
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
#include "tests/checkpoint_tensors.h"
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
