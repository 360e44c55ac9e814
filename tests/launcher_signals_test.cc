// The --nproc launcher (app/launcher.h) under preemption, with small /bin/sh workers run through
// the same launchWorkers() as aiacc_train's (LaunchSpec::executable): SIGTERM / SIGUSR1 forwarded
// to workers that save and exit 75 (the launcher exits 75 with one line), workers that ignore the
// signal SIGKILLed after the grace period, the same signal twice SIGKILLs at once, a signal of
// another kind keeps the grace period, a worker exiting 75 by itself stops nobody, one exiting 3
// stops the job; the launcher hosts the store, which outlives rank 0. Each launcher runs in a
// forked child of the test (it blocks signals and reads them from a signalfd), its output in a
// file; the test signals that child alone.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/launcher.h"
#include "aiacc/common/error.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Polls `done` every 20 ms for up to `limit_s` seconds; whether it came true.
bool waitUntil(const std::function<bool()>& done, double limit_s) {
  const auto start = Clock::now();
  while (!done()) {
    if (secondsSince(start) > limit_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// launchWorkers(spec, {"sh", "-c", script}) for `nproc` workers, in a forked child of the test whose
// stdout and stderr go to `log`. Each worker has AIACC_RANK in its environment.
// `adjust` changes the spec further.
class Launched {
 public:
  Launched(const std::string& script, int nproc, int grace_seconds, const std::string& log,
           const std::function<void(LaunchSpec&)>& adjust = {}) {
    LaunchSpec spec;
    spec.nproc = nproc;
    spec.grace_seconds = grace_seconds;
    spec.executable = "/bin/sh";
    spec.job_id = "launcher-signals-test";
    if (adjust) adjust(spec);
    const std::vector<std::string> args = {"sh", "-c", script};
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      int rc = 100;
      try {
        rc = launchWorkers(spec, args);
      } catch (const std::exception& e) {
        std::cerr << "launchWorkers threw: " << e.what() << "\n";
      }
      ::_exit(rc);
    }
  }
  ~Launched() {
    if (pid_ > 0) {  // a test that failed before it ended: its workers die with it (PR_SET_PDEATHSIG)
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Launched(const Launched&) = delete;
  Launched& operator=(const Launched&) = delete;

  bool started() const { return pid_ > 0; }
  void signal(int sig) const { ::kill(pid_, sig); }

  // Waits up to `limit_s` seconds for the launcher to end: its exit code, -1 when killed by a
  // signal, nullopt when it has not ended.
  std::optional<int> wait(double limit_s) {
    if (pid_ <= 0) return std::nullopt;
    int status = 0;
    const bool ended = waitUntil([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, limit_s);
    if (!ended) return std::nullopt;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
};

// Shell: after its traps, a worker records its pid in DIR/ready-RANK (atomically).
std::string ready(const std::string& dir) {
  return "echo $$ > " + dir + "/tmp-$AIACC_RANK && mv " + dir + "/tmp-$AIACC_RANK " + dir + "/ready-$AIACC_RANK; ";
}
const char* const kForever = "while :; do sleep 0.05; done";

// Waits (up to 20 s) until every one of `n` workers has written DIR/NAME-RANK; whether they did.
bool allWrote(const test::TempDir& d, const std::string& name, int n) {
  auto wrote = [&] {
    for (int r = 0; r < n; ++r) {
      if (!std::filesystem::exists(d / (name + "-" + std::to_string(r)))) return false;
    }
    return true;
  };
  return waitUntil(wrote, 20);
}

// Whether a process of process group `pgid` is running (zombies do not count: nobody may reap
// an orphan in a container).
bool groupRunning(pid_t pgid) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;  // not a process
    const std::string stat = test::readText(e.path().string() + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pgid && state != 'Z') {
      return true;
    }
  }
  return false;
}

// Rank 0's pid: it leads the workers' process group.
pid_t workerGroup(const test::TempDir& d) { return static_cast<pid_t>(std::stol(test::readText(d / "ready-0"))); }

using test::contains;

constexpr const char* kPreemptedTail =
    "saved and stopped (exit 75); run the same command with --resume auto to continue\n";

// Kubernetes' or Slurm's SIGTERM: forwarded, the workers save and exit 75, and so does the
// launcher, with one line saying how to continue. The default grace period (25 s) is longer than
// the test waits: the workers' own exit ends the job.
TEST(LauncherSignals, SigtermToSavingWorkersExits75) {
  test::TempDir d;
  const std::string script = "trap 'echo saved rank $AIACC_RANK; exit 75' TERM; " + ready(d.path()) + kForever;
  Launched launcher(script, 2, kDefaultGraceSeconds, d / "log");
  ASSERT_TRUE(launcher.started());
  ASSERT_TRUE(allWrote(d, "ready", 2)) << test::readText(d / "log");
  launcher.signal(SIGTERM);
  const std::optional<int> rc = launcher.wait(20);
  const std::string log = test::readText(d / "log");
  ASSERT_TRUE(rc.has_value()) << log;
  EXPECT_EQ(*rc, kExitPreempted) << log;
  EXPECT_TRUE(contains(log,
                       "aiacc_train: received SIGTERM; forwarding it to the 2 worker(s), SIGKILL in 25 s if they do "
                       "not end\n"))
      << log;
  EXPECT_TRUE(contains(log, "[rank 0] saved rank 0\n")) << log;
  EXPECT_TRUE(contains(log, "[rank 1] saved rank 1\n")) << log;
  EXPECT_TRUE(contains(log, std::string("aiacc_train: preempted by SIGTERM: 2 of 2 worker(s) ") + kPreemptedTail))
      << log;
  EXPECT_FALSE(contains(log, "stopping the other")) << log;
  EXPECT_FALSE(contains(log, "stopped by")) << log;
}

// Slurm's --signal=USR1@T warning: the workers receive SIGUSR1 itself.
TEST(LauncherSignals, Sigusr1IsForwarded) {
  test::TempDir d;
  const std::string script = "trap 'echo USR1 > " + d.path() + "/got-$AIACC_RANK; exit 75' USR1; " + ready(d.path()) +
                             kForever;
  Launched launcher(script, 2, kDefaultGraceSeconds, d / "log");
  ASSERT_TRUE(allWrote(d, "ready", 2)) << test::readText(d / "log");
  launcher.signal(SIGUSR1);
  const std::optional<int> rc = launcher.wait(20);
  const std::string log = test::readText(d / "log");
  ASSERT_TRUE(rc.has_value()) << log;
  EXPECT_EQ(*rc, kExitPreempted) << log;
  EXPECT_EQ(test::readText(d / "got-0"), "USR1\n");
  EXPECT_EQ(test::readText(d / "got-1"), "USR1\n");
  EXPECT_TRUE(contains(log, "aiacc_train: received SIGUSR1; forwarding it to the 2 worker(s)")) << log;
  EXPECT_TRUE(contains(log, std::string("aiacc_train: preempted by SIGUSR1: 2 of 2 worker(s) ") + kPreemptedTail))
      << log;
}

// Workers that ignore SIGTERM are SIGKILLed once --grace-seconds (1) has run out, not before; the
// launcher exits 128 + 15 and nothing of the workers' process group is left.
TEST(LauncherSignals, WorkersIgnoringSigtermAreKilledAfterTheGrace) {
  test::TempDir d;
  const std::string script = "trap '' TERM; " + ready(d.path()) + kForever;
  Launched launcher(script, 2, 1, d / "log");
  ASSERT_TRUE(allWrote(d, "ready", 2)) << test::readText(d / "log");
  const pid_t group = workerGroup(d);
  const auto sent = Clock::now();
  launcher.signal(SIGTERM);
  const std::optional<int> rc = launcher.wait(15);
  const double took = secondsSince(sent);
  const std::string log = test::readText(d / "log");
  ASSERT_TRUE(rc.has_value()) << log;
  EXPECT_EQ(*rc, 128 + SIGTERM) << log;
  EXPECT_GE(took, 1.0) << log;
  EXPECT_TRUE(contains(log, "forwarding it to the 2 worker(s), SIGKILL in 1 s if they do not end\n")) << log;
  EXPECT_TRUE(contains(log,
                       "aiacc_train: sending SIGKILL to the 2 worker(s) still running after the 1 s grace period\n"))
      << log;
  EXPECT_TRUE(contains(log, "aiacc_train: stopped by SIGTERM (exit code 143)\n")) << log;
  EXPECT_FALSE(contains(log, "preempted")) << log;
  EXPECT_TRUE(waitUntil([&] { return !groupRunning(group); }, 5)) << "a worker process is left";
}

// The same signal twice (Ctrl-C Ctrl-C, or SIGTERM twice): the second SIGKILLs the workers at once,
// long before the 60 s grace period. The workers record each signal and go on; the second is sent
// once both have the first.
void expectSameSignalTwiceKillsAtOnce(int sig, const std::string& name) {
  test::TempDir d;
  const std::string script = "trap 'echo " + name + " >> " + d.path() + "/got-$AIACC_RANK' " + name.substr(3) + "; " +
                             ready(d.path()) + kForever;
  Launched launcher(script, 2, 60, d / "log");
  ASSERT_TRUE(allWrote(d, "ready", 2)) << test::readText(d / "log");
  const pid_t group = workerGroup(d);
  launcher.signal(sig);
  ASSERT_TRUE(allWrote(d, "got", 2)) << test::readText(d / "log");
  launcher.signal(sig);
  const std::optional<int> rc = launcher.wait(20);
  const std::string log = test::readText(d / "log");
  ASSERT_TRUE(rc.has_value()) << "still running 20 s after the second " << name << "\n" << log;
  EXPECT_EQ(*rc, 128 + sig) << log;
  EXPECT_TRUE(contains(log, "aiacc_train: received " + name + "; forwarding it to the 2 worker(s), SIGKILL in 60 s"))
      << log;
  EXPECT_TRUE(contains(log, "aiacc_train: received " + name + " again; sending SIGKILL to the 2 worker(s)\n")) << log;
  EXPECT_TRUE(contains(log, "aiacc_train: stopped by " + name + " (exit code " + std::to_string(128 + sig) + ")\n"))
      << log;
  EXPECT_FALSE(contains(log, "grace period\n")) << log;
  EXPECT_TRUE(waitUntil([&] { return !groupRunning(group); }, 5)) << "a worker process is left";
}

TEST(LauncherSignals, SameSigtermTwiceKillsAtOnce) { expectSameSignalTwiceKillsAtOnce(SIGTERM, "SIGTERM"); }

TEST(LauncherSignals, SameSigintTwiceKillsAtOnce) { expectSameSignalTwiceKillsAtOnce(SIGINT, "SIGINT"); }

// Slurm's SIGUSR1 warning, then its SIGTERM: both reach the workers, and the grace period that
// SIGUSR1 started is kept: the SIGKILL comes --grace-seconds (5) after SIGUSR1, not at SIGTERM
// (cut short) and not 5 s after SIGTERM (restarted). SIGTERM is sent at least 1.5 s after SIGUSR1.
TEST(LauncherSignals, AnotherSignalKeepsTheGracePeriod) {
  constexpr int kGrace = 5;
  test::TempDir d;
  const std::string script = "trap 'echo USR1 >> " + d.path() + "/usr1-$AIACC_RANK' USR1; trap 'echo TERM >> " +
                             d.path() + "/term-$AIACC_RANK' TERM; " + ready(d.path()) + kForever;
  Launched launcher(script, 2, kGrace, d / "log");
  ASSERT_TRUE(allWrote(d, "ready", 2)) << test::readText(d / "log");
  const auto usr1_sent = Clock::now();
  launcher.signal(SIGUSR1);
  ASSERT_TRUE(allWrote(d, "usr1", 2)) << test::readText(d / "log");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  launcher.signal(SIGTERM);
  const std::optional<int> rc = launcher.wait(20);
  const auto ended = Clock::now();
  const std::string log = test::readText(d / "log");
  ASSERT_TRUE(rc.has_value()) << log;
  EXPECT_EQ(*rc, 128 + SIGUSR1) << log;  // the first signal names the stop
  EXPECT_TRUE(contains(log,
                       "aiacc_train: received SIGTERM after SIGUSR1; forwarding it to the 2 worker(s), SIGKILL still "
                       "in "))
      << log;
  EXPECT_EQ(test::readText(d / "term-0"), "TERM\n") << log;
  EXPECT_EQ(test::readText(d / "term-1"), "TERM\n") << log;
  EXPECT_TRUE(contains(log,
                       "aiacc_train: sending SIGKILL to the 2 worker(s) still running after the 5 s grace period\n"))
      << log;
  EXPECT_TRUE(contains(log, "aiacc_train: stopped by SIGUSR1 (exit code 138)\n")) << log;
  // The launcher's grace period begins after usr1_sent.
  EXPECT_GE(std::chrono::duration<double>(ended - usr1_sent).count(), kGrace) << "SIGKILL before the grace ran out\n"
                                                                              << log;
  // The grace left at SIGTERM, as the launcher says it (its own clock, rounded up): SIGUSR1 reached
  // the launcher before the workers wrote their usr1 files, and SIGTERM came 1.5 s after those, so
  // at most 4 s are left; a grace restarted at SIGTERM would say 5.
  const std::string said = "SIGKILL still in ";
  const size_t at = log.find(said);
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_LE(std::atoi(log.c_str() + at + said.size()), kGrace - 1) << "the grace restarted at SIGTERM\n" << log;
}

// A worker that saved and stopped by itself (75; e.g. it got the cluster's SIGTERM directly) is
// not a failure: the other worker is not signalled and ends in its own time; the launcher exits 75.
// (Rank 0 exits once rank 1 has set its trap, so that a wrong SIGTERM shows as rank 1's marker.)
TEST(LauncherSignals, WorkerExiting75ByItselfStopsNobody) {
  test::TempDir d;
  const std::string script = "trap 'echo TERM > " + d.path() + "/got-$AIACC_RANK; exit 1' TERM; " + ready(d.path()) +
                             "if [ $AIACC_RANK = 0 ]; then while [ ! -e " + d.path() +
                             "/ready-1 ]; do sleep 0.02; done; exit 75; fi; while [ ! -e " + d.path() +
                             "/go ]; do sleep 0.05; done; exit 0";
  Launched launcher(script, 2, kDefaultGraceSeconds, d / "log");
  ASSERT_TRUE(allWrote(d, "ready", 2)) << test::readText(d / "log");
  const std::string rank0 = "/proc/" + std::to_string(workerGroup(d));
  // Rank 0 has exited and the launcher has reaped it (and acted on it: give it a moment more).
  ASSERT_TRUE(waitUntil([&] { return !std::filesystem::exists(rank0); }, 20)) << test::readText(d / "log");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  test::writeText(d / "go", "");
  const std::optional<int> rc = launcher.wait(20);
  const std::string log = test::readText(d / "log");
  ASSERT_TRUE(rc.has_value()) << log;
  EXPECT_EQ(*rc, kExitPreempted) << log;
  EXPECT_FALSE(std::filesystem::exists(d / "got-1")) << "rank 1 was signalled\n" << log;
  EXPECT_FALSE(contains(log, "stopping the other")) << log;
  EXPECT_TRUE(contains(log, std::string("aiacc_train: preempted: 1 of 2 worker(s) ") + kPreemptedTail)) << log;
}

// A worker that exits 3 still ends the job: the other is stopped (SIGTERM; it saves and exits 75)
// and the launcher exits 1, naming the rank.
TEST(LauncherSignals, WorkerExiting3StopsTheJob) {
  test::TempDir d;
  // Rank 0 fails once rank 1 has set its trap.
  const std::string script = "trap 'echo TERM > " + d.path() + "/got-$AIACC_RANK; exit 75' TERM; " + ready(d.path()) +
                             "if [ $AIACC_RANK = 0 ]; then while [ ! -e " + d.path() +
                             "/ready-1 ]; do sleep 0.02; done; exit 3; fi; " + kForever;
  Launched launcher(script, 2, kDefaultGraceSeconds, d / "log");
  const std::optional<int> rc = launcher.wait(20);
  const std::string log = test::readText(d / "log");
  ASSERT_TRUE(rc.has_value()) << log;
  EXPECT_EQ(*rc, 1) << log;
  EXPECT_TRUE(contains(log, "aiacc_train: rank 0 exited with code 3; stopping the other 1 local worker(s)\n")) << log;
  EXPECT_EQ(test::readText(d / "got-1"), "TERM\n") << log;
  EXPECT_FALSE(contains(log, "preempted")) << log;
}

// The launcher hosts the rendezvous store (LaunchSpec::host_store, as aiacc_train sets it): the
// workers connect as clients (AIACC_LAUNCHER_STORE=1), and the store outlives rank 0. Here rank 0
// writes its pid and exits; rank 1 waits until that process is gone, then still sets and reads a
// key. With the store in rank 0's process, rank 1 would find it gone.
TEST(LauncherStore, TheStoreOutlivesRankZero) {
  test::TempDir d;
  const std::string port = std::to_string(test::freePort());
  const std::string py = "import os, sys, time\n"
                         "from torch.distributed import TCPStore\n"
                         "host, port = os.environ['AIACC_MASTER'].rsplit(':', 1)\n"
                         "assert os.environ['AIACC_LAUNCHER_STORE'] == '1', os.environ['AIACC_LAUNCHER_STORE']\n"
                         "store = TCPStore(host, int(port), 2, False)\n"
                         "if os.environ['AIACC_RANK'] == '0':\n"
                         "    store.set('rank0', str(os.getpid()))\n"
                         "    sys.exit(0)\n"
                         "pid = store.get('rank0').decode()\n"
                         "def running():\n"
                         "    try:\n"
                         "        return open('/proc/' + pid + '/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'\n"
                         "    except OSError:\n"
                         "        return False\n"
                         "while running():\n"
                         "    time.sleep(0.05)\n"
                         "store.set('after', 'yes')\n"
                         "print('rank 0 gone, the store answers:', store.get('after').decode())\n";
  test::writeText(d / "worker.py", py);
  const std::string log = d / "log";
  Launched job("exec " + std::string(AIACC_GOLDEN_PYTHON) + " " + d.path() + "/worker.py", 2, 25, log,
               [&](LaunchSpec& spec) {
    spec.host_store = true;
    spec.master = "127.0.0.1:" + port;
  });
  ASSERT_TRUE(job.started());
  const std::optional<int> rc = job.wait(120);
  ASSERT_TRUE(rc.has_value()) << test::readText(log);
  EXPECT_EQ(*rc, 0) << test::readText(log);
  EXPECT_TRUE(contains(test::readText(log), "[rank 1] rank 0 gone, the store answers: yes")) << test::readText(log);
}

// --grace-seconds outside 1..3600: one line, before any worker starts; launchWorkers() itself
// refuses the same before it touches signals.
TEST(LauncherSignals, BadGraceSecondsIsOneLine) {
  for (const char* bad : {"0", "-5", "3601"}) {
    auto [rc, out] = test::runShell(std::string(AIACC_TRAIN_BIN) + " --nproc 2 --grace-seconds=" + bad +
                                    " --data synthetic --max-steps 1 2>&1");
    EXPECT_EQ(rc, 2) << out;  // a usage error
    EXPECT_EQ(out, std::string("aiacc_train: error: --grace-seconds must be 1..3600 (got ") + bad + ")\n") << out;
  }
  LaunchSpec spec;
  spec.grace_seconds = 0;
  EXPECT_THROW(launchWorkers(spec, {"true"}), InputError);
}

TEST(LauncherSignals, HelpExplainsGraceSeconds) {
  auto [rc, out] = test::runShell(std::string(AIACC_TRAIN_BIN) + " --help 2>&1");
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(contains(out, "--grace-seconds (int32, default 25)")) << out;
  EXPECT_TRUE(contains(out, "SIGUSR1")) << out;
  EXPECT_TRUE(contains(out, "\n" + exitCodeHelp())) << "the exit-code table ends --help\n" << out;
}

}  // namespace
}  // namespace aiacc::app
