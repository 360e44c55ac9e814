// The exit-code contract (app/exit_code.h) as tables: every way a process ends, the launcher's
// sum of its workers' ends, and the command-line problems that are usage errors (exit 2).
#include "app/exit_code.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>
#include <signal.h>

#include "app/cli.h"

namespace aiacc::app {
namespace {

using How = Ending::How;

Ending stopped(bool saved, int signal) {
  Ending e{How::kStopped};
  e.saved = saved;
  e.signal = signal;
  return e;
}

TEST(ExitCode, EveryEndingHasItsCode) {
  struct Row {
    const char* path;
    Ending ending;
    int code;
  };
  const Row rows[] = {
      {"finished (schedule, --max-steps, target reached or not)", Ending{How::kFinished}, 0},
      {"a job that had finished, joined late or left out", endingOf(comm::JobEnd::kFinished), 0},
      {"SIGTERM, the stop's checkpoint written", stopped(true, SIGTERM), 75},
      {"SIGUSR1 (Slurm's warning), saved", stopped(true, SIGUSR1), 75},
      {"SIGTERM, no --checkpoint-dir or its write failed", stopped(false, SIGTERM), 128 + SIGTERM},
      {"SIGINT, nothing saved", stopped(false, SIGINT), 128 + SIGINT},
      {"SIGUSR1, nothing saved", stopped(false, SIGUSR1), 128 + SIGUSR1},
      {"ranks lost below MIN, a survivor saved (this or another)", stopped(true, 0), 75},
      {"the store lost, saved in turn", stopped(true, 0), 75},
      {"a job that had stopped saved, joined late or left out", endingOf(comm::JobEnd::kStopped), 75},
      {"a job that had stopped unsaved, joined late or left out", endingOf(comm::JobEnd::kStoppedUnsaved), 1},
      {"ranks lost below MIN, no --checkpoint-dir", stopped(false, 0), 1},
      {"ranks lost, this rank's write failed", stopped(false, 0), 1},
      {"an error (data, settings, a lost rank without a saver)", Ending{How::kError}, 1},
      {"a job that failed on every rank, joined late or left out", endingOf(comm::JobEnd::kFailed), 1},
      {"a bad flag or argument", Ending{How::kUsage}, 2},
  };
  for (const Row& r : rows) EXPECT_EQ(exitCode(r.ending), r.code) << r.path;
  // 75 means "on disk, --resume auto continues it", whatever asked for the stop; a signal's code
  // never says that something was saved.
  for (int sig : {0, SIGINT, SIGTERM, SIGUSR1}) EXPECT_EQ(exitCode(stopped(true, sig)), kExitPreempted) << sig;
}

TEST(ExitCode, HelpListsEveryCode) {
  const std::string help = exitCodeHelp();
  for (const char* code : {"\n  0 ", "\n  75 ", "\n  128+N ", "\n  1 ", "\n  2 "}) {
    EXPECT_NE(help.find(code), std::string::npos) << code << " in\n" << help;
  }
  EXPECT_NE(help.find("--resume auto"), std::string::npos);
}

WorkerExit code(int c) { return WorkerExit{c, 0}; }
WorkerExit killed(int sig) { return WorkerExit{0, sig}; }

TEST(ExitCode, TheLauncherSumsItsWorkers) {
  struct Row {
    const char* path;
    std::vector<WorkerExit> workers;
    bool failed;
    int first_signal;
    int code;
    const char* line;  // a part of its line ("" : no line)
  };
  const Row rows[] = {
      {"every worker finished", {code(0), code(0)}, false, 0, 0, ""},
      {"finished before the forwarded stop came", {code(0), code(0)}, false, SIGTERM, 0, "had finished"},
      {"a forwarded stop, all saved", {code(75), code(75)}, false, SIGTERM, 75, "preempted by SIGTERM: 2 of 2"},
      {"some finished, some saved", {code(0), code(75)}, false, 0, 75, "1 of 2 worker(s) saved"},
      {"a forwarded stop, nothing saved", {code(143), code(143)}, false, SIGTERM, 143, "stopped by SIGTERM"},
      {"killed after the grace period", {killed(SIGKILL), code(75)}, false, SIGTERM, 143, "(exit code 143)"},
      {"a worker failed", {code(1), code(75)}, true, 0, 1, ""},
      {"a worker failed, then a signal", {code(1), code(143)}, true, SIGINT, 1, "stopped by SIGINT (exit code 1)"},
      {"a survivor that saved nothing", {code(1)}, true, 0, 1, ""},
      {"a worker's usage error", {code(2), code(143)}, true, 0, 1, ""},
  };
  for (const Row& r : rows) {
    const LauncherEnd end = launcherExitCode(r.workers, r.failed, r.first_signal);
    EXPECT_EQ(end.code, r.code) << r.path;
    if (*r.line == 0) {
      EXPECT_EQ(end.line, "") << r.path;
    } else {
      EXPECT_NE(end.line.find(r.line), std::string::npos) << r.path << ": " << end.line;
    }
  }
}

std::string problemOf(std::vector<std::string> args) {
  gflags::FlagSaver keep;  // (the values it checks are set)
  args.insert(args.begin(), "/usr/bin/aiacc_train");
  return commandLineProblem(args);
}

TEST(ExitCode, CommandLineProblemsAreUsageErrors) {
  EXPECT_EQ(problemOf({}), "");
  EXPECT_EQ(problemOf({"--epochs=3", "--lr", "0.1", "--amp", "--nochannels_last", "--checkpoint_dir", "/x"}), "");
  EXPECT_EQ(problemOf({"--epochs", "3", "positional", "--", "--nonsense"}), "");
  EXPECT_EQ(problemOf({"--epochz=3"}), "unknown flag --epochz");
  EXPECT_EQ(problemOf({"--no_such_thing"}), "unknown flag --no-such-thing");
  EXPECT_EQ(problemOf({"--noepochs"}), "unknown flag --noepochs");  // (not a boolean)
  EXPECT_EQ(problemOf({"--epochs"}), "flag --epochs needs a value");
  EXPECT_EQ(problemOf({"--epochs=three"}), "--epochs: 'three' is not a valid value (int32)");
  EXPECT_EQ(problemOf({"--lr", "fast"}), "--lr: 'fast' is not a valid value (double)");
  EXPECT_EQ(problemOf({"--amp=maybe"}), "--amp: 'maybe' is not a valid value (bool)");
  EXPECT_EQ(problemOf({"--undefok=epochz", "--epochz=3"}), "") << "gflags' leave";
  EXPECT_EQ(problemOf({"--noamp=1"}), "") << "gflags' to judge";
}

}  // namespace
}  // namespace aiacc::app
