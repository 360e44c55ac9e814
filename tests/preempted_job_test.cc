// Preemption as real aiacc_train processes under the --nproc launcher: real signals (SIGTERM,
// SIGUSR1, to the launcher or to each worker), a rank killed first, a signal during a checkpoint
// write; the job stops at one step, saves it, and --resume auto continues it exactly. (The same
// decisions in one process, with an injected stop request: tests/preemption_test.cc.)
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "models/torch_format.h"
#include "tests/checkpoint_tensors.h"
#include "tests/comm_test_util.h"  // AIACC_SKIP_WITHOUT_GLOO
#include "tests/json_util.h"
#include "tests/test_util.h"

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
  const auto a = test::checkpointTensors(test::newestCheckpoint(d / "whole/ck"), 4),
             b = test::checkpointTensors(test::newestCheckpoint(d / "ck"), 4);
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
  EXPECT_EQ(test::newestCheckpoint(d / "ck"), d / ("ck/step-" + std::string(12 - last.size(), '0') + last + ".ckpt"));
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
  const std::string ckpt = test::newestCheckpoint(d / "ck");
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
  EXPECT_EQ(test::newestCheckpoint(d / "ck"), saved);
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
