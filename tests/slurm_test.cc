// aiacc_train under a real Slurm (Debian's slurm-wlm, on this machine: scripts/slurmlab.sh starts
// munged, slurmctld and slurmd in a folder of the test's own) and a real Open MPI mpirun: the
// launchers as a cluster user runs them, not their variables set by hand (tests/launch_env_test.cc
// does that). Every Slurm test runs under proctrack/linuxproc and under proctrack/cgroup. Root only (SlurmUser=root;
// Open MPI's --allow-run-as-root); skipped where the packages are missing (scripts/setup.sh installs them).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <ostream>
#include <string>
#include <vector>

#include "aiacc/common/error.h"
#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc::test_slurm {
namespace {

using test::contains;
using test::readText;

// A short CPU job: the narrowed resnet18, batch 8, 32 px, `steps` steps (4 an epoch on 2 ranks); bin:
// aiacc_train, or aiacc_train_hooked for a job held at a step (heldAt).
std::string job(int steps, const std::string& bin = AIACC_TRAIN_BIN) {
  return strCat(bin,
                " --data synthetic --arch resnet18-w16 --synthetic-classes 2 --synthetic-images 64 --batch-size 8 "
                "--image-size 32 --warmup-epochs 0 --threads 1 --noautotune --epochs ",
                (steps + 3) / 4, " --max-steps ", steps);
}

// A job to stop: aiacc_train_hooked with `steps` steps, whose 2 ranks wait as step 3 ends until
// the file `release` exists (AIACC_TEST_HOLD_AT_STEP, app/test_hooks.h), so that Slurm's signal
// finds it training however fast its steps are. `prefix` goes before the command (exec, a
// variable).
std::string heldAt(const std::string& release, const std::string& prefix, int steps) {
  return strCat("export AIACC_TEST_HOLD_AT_STEP=3:", release, "\n", prefix, job(steps, AIACC_HOOKED_TRAIN_BIN));
}

bool haveCommand(const std::string& name) { return test::runShell("command -v " + name + " > /dev/null").first == 0; }

// How Slurm tracks a job's processes: by their parents (proctrack/linuxproc), or by the job's
// cgroup (proctrack/cgroup, what most clusters run), which is also how it kills them.
enum class Proctrack { kLinuxproc, kCgroup };
void PrintTo(Proctrack p, std::ostream* os) {
  *os << (p == Proctrack::kCgroup ? "proctrack/cgroup" : "proctrack/linuxproc");
}

// A single-node Slurm of the test's own, up for the test's life, with either proctrack plugin.
// Each test runs in a process of its own (ctest -j2 runs two at once): the lab's folder sets its
// Slurm ports, and a slot of its own among the Slurm tests running at once (kSlots files, one
// locked by each) its job ids: aiacc_train under srun meets at port 29500 + job id % 1000, and the
// slot's kSlotPorts ports, from 30100, are no other test's. Every srun and mpirun is bounded
// (timeout 180), so that a hung job fails its test instead of outliving it.
class Slurm : public ::testing::TestWithParam<Proctrack> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "not root: the lab runs slurmd as root";
    if (!haveCommand("slurmctld") || !haveCommand("munged")) GTEST_SKIP() << "no slurm-wlm/munge (scripts/setup.sh)";
    cgroup_ = GetParam() == Proctrack::kCgroup;
    // (Slurm 22.05's proctrack/cgroup on this machine: a cgroup v1 freezer hierarchy.)
    if (cgroup_ && ::access("/sys/fs/cgroup/freezer", W_OK) != 0) {
      GTEST_SKIP() << "no writable /sys/fs/cgroup/freezer: proctrack/cgroup cannot run here";
    }
    const int slot = takeSlot();
    ASSERT_GE(slot, 0) << "all " << kSlots << " slots of the Slurm tests are taken (" << kSlotFile << "N)";
    first_job_ = 1000 * (1 + ::getpid() % 50) + 600 + kSlotPorts * slot;
    up_ = true;  // (down stops whatever a failed up started)
    const auto [rc, out] = test::runShell(strCat(test::sourceDir(), "/scripts/slurmlab.sh up ", lab_.path(),
                                                 cgroup_ ? " --cgroup" : "", " --first-job-id ", first_job_, " 2>&1"));
    ASSERT_EQ(rc, 0) << out;
    env_ = "SLURM_CONF=" + (lab_ / "etc/slurm.conf") + " ";
  }
  void TearDown() override {
    if (up_) test::runShell(strCat(test::sourceDir(), "/scripts/slurmlab.sh down ", lab_.path(), " > /dev/null 2>&1"));
    if (slot_fd_ >= 0) ::close(slot_fd_);  // (the slot's lock goes with it)
  }
  // The job ids of a slot: the first 4 jobs' stores (jobs after them use free ports), each of 8
  // ports (comm::kJobPortTries) from its own.
  static constexpr int kSlots = 24, kSlotPorts = 12;
  static constexpr const char* kSlotFile = "/tmp/aiacc-slurm-test-slot-";
  // The first slot whose file this process could lock (flock, held while the file is open; not
  // inherited by what it runs), or -1.
  int takeSlot() {
    for (int slot = 0; slot < kSlots; ++slot) {
      const int fd = ::open(strCat(kSlotFile, slot).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
      if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        slot_fd_ = fd;
        return slot;
      }
      if (fd >= 0) ::close(fd);
    }
    return -1;
  }
  // A command with the lab's SLURM_CONF; its exit code and output.
  std::pair<int, std::string> slurm(const std::string& cmd) { return test::runShell(env_ + cmd + " 2>&1"); }
  // Writes a batch script and submits it: its job id ("" when sbatch failed).
  std::string submit(const std::string& name, const std::string& body, const std::string& options) {
    test::writeText(lab_ / name, "#!/bin/bash\n" + body + "\n");
    const auto [rc,
                out] = slurm(strCat("sbatch --parsable ", options, " -o ", lab_ / (name + ".out"), " ", lab_ / name));
    EXPECT_EQ(rc, 0) << out;
    return rc == 0 ? out.substr(0, out.find_first_of(";\n")) : "";
  }
  // Waits until job `id` has ended, its processes too (squeue lists it no longer, not even as
  // completing; at most 120 s); its last line of DIR/log/jobcomp.txt (a requeued job has one a run).
  std::string ended(const std::string& id) {
    const std::string comp = lab_ / "log/jobcomp.txt";
    for (int i = 0; i < 1200; ++i) {
      const auto [rc, queued] = slurm("squeue -h -j " + id);
      if (rc == 0 && queued.find_first_not_of(" \n") == std::string::npos) {
        std::string last;
        for (const std::string& line : lines(readText(comp))) {
          if (contains(line, "JobId=" + id + " ")) last = line;
        }
        if (!last.empty()) return last;
      }
      ::usleep(100000);
    }
    return "job " + id + " never ended";
  }
  // Waits (at most 120 s) until both ranks of a heldAt job wait for `release`.
  static bool held(const std::string& release) {
    const std::string both_held = test::shellHeld(release, 2);
    return test::runShell(test::shellWaitUntil(both_held) + both_held).first == 0;
  }
  // Once aiacc_train's launcher has forwarded a stop signal to its workers (its line in `log`;
  // at most 120 s), lets a heldAt job go on, to stop within the step vote's 2 steps of step 3.
  static void releaseOnceSignalled(const std::string& log, const std::string& release) {
    for (int i = 0; i < 2400 && !contains(readText(log), test::kForwardedLine); ++i) ::usleep(50000);
    test::writeText(release, "");
  }
  static std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    for (size_t at = 0; at < text.size();) {
      const size_t end = text.find('\n', at);
      out.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
      at = end == std::string::npos ? text.size() : end + 1;
    }
    return out;
  }
  test::TempDir lab_;
  bool up_ = false;
  int first_job_ = 0;  // the lab's first job id
  int slot_fd_ = -1;
  bool cgroup_ = false;  // proctrack/cgroup (what most clusters run) instead of proctrack/linuxproc
  std::string env_;
};

INSTANTIATE_TEST_SUITE_P(Proctrack, Slurm, ::testing::Values(Proctrack::kLinuxproc, Proctrack::kCgroup),
                         [](const ::testing::TestParamInfo<Proctrack>& p) {
  return p.param == Proctrack::kCgroup ? "Cgroup" : "Linuxproc";
});

// srun -n2 and srun -n2 --mpi=pmi2 (PMI_RANK, PMI_SIZE beside the step's variables): one job of
// world 2 read from the Slurm step, its store on the step's first host.
TEST_P(Slurm, SrunTasksWithAndWithoutPmi2FormOneJob) {
  for (const std::string mpi : {"", " --mpi=pmi2"}) {
    const std::string report = lab_ / "report.json";
    const auto [rc, out] = slurm(strCat("timeout 180 srun -n2 -c1", mpi, " ", job(3), " --report-file ", report));
    ASSERT_EQ(rc, 0) << mpi << "\n" << out;
    EXPECT_TRUE(contains(out, "launched by the Slurm job step: 2 ranks")) << mpi << "\n" << out;
    EXPECT_EQ(test::readJson(report).at("world_size"), 2) << mpi;
  }
}

// sbatch -n2 whose script runs aiacc_train alone: refused, saying what to type, exit 2 (a usage
// error, found before anything starts). The script's shell is said too: run so, Slurm's signals
// would not reach aiacc_train.
TEST_P(Slurm, ABatchScriptOfTwoTasksRunAloneIsRefused) {
  const std::string id = submit("alone.sh", job(3), "-n2 -c1");
  const std::string line = ended(id);
  EXPECT_TRUE(contains(line, "ExitCode=2:0")) << line;
  const std::string out = readText(lab_ / "alone.sh.out");
  EXPECT_TRUE(contains(out, "aiacc_train: error: SLURM_NTASKS=2: this Slurm job has 2 tasks, but aiacc_train runs "
                            "here as one process"))
      << out;
  EXPECT_TRUE(contains(out, "`srun aiacc_train ...`")) << out;
}

// A batch script that exec's aiacc_train --nproc 2: scancel stops it at a step every rank
// agrees on, with that step's checkpoint, and the same script submitted again resumes there
// and ends; no warning (its parent is the batch step). A script that runs aiacc_train without
// exec is warned about at start (its parent: the script's shell, which Slurm names slurm_script).
TEST_P(Slurm, ExecInABatchScriptSavesOnScancelAndTheSameScriptResumes) {
  const std::string ck = lab_ / "ck", release = lab_ / "release";
  const std::string body = strCat(heldAt(release, "exec ", 30), " --nproc 2 --checkpoint-dir ", ck, " --resume auto");
  const std::string id = submit("exec.sh", body, "-n1 -c2");
  ASSERT_NE(id, "");
  ASSERT_TRUE(held(release)) << readText(lab_ / "exec.sh.out");
  slurm("scancel " + id);
  releaseOnceSignalled(lab_ / "exec.sh.out", release);
  ended(id);
  const std::string out = readText(lab_ / "exec.sh.out");
  EXPECT_FALSE(contains(out, "warning: aiacc_train runs under")) << out;
  EXPECT_TRUE(contains(out, "2 of 2 worker(s) saved and stopped (exit 75)")) << out;
  const std::string saved = test::newestCheckpoint(ck);
  ASSERT_NE(saved, "") << out;
  const size_t at = out.find("; saved " + saved);
  ASSERT_NE(at, std::string::npos) << out;
  const std::string stopped = out.substr(out.rfind("after step ", at) + 11, at - out.rfind("after step ", at) - 11);
  // The same script again: it resumes at the saved step and trains to the end.
  const std::string again = submit("exec.sh", body, "-n1 -c2");
  EXPECT_TRUE(contains(ended(again), "ExitCode=0:0"));
  const std::string out2 = readText(lab_ / "exec.sh.out");
  EXPECT_TRUE(contains(out2, "resumed from " + saved + " at step " + stopped)) << out2;
  EXPECT_TRUE(contains(out2, ", 30 steps, ")) << out2;
  const std::string plain = submit("plain.sh", job(3), "-n1 -c1");
  EXPECT_TRUE(contains(ended(plain), "ExitCode=0:0"));
  EXPECT_TRUE(contains(readText(lab_ / "plain.sh.out"), "warning: aiacc_train runs under its Slurm batch script's "
                                                        "shell (slurm_script), not as the batch step"))
      << readText(lab_ / "plain.sh.out");
}

// A job requeued while it trains (`scontrol requeue`, as a preemption or a node's failure would;
// --requeue --open-mode=append, as docs recommend) is stopped with SIGTERM: it saves, and its
// next run, the same script, resumes at the saved step and ends, no step run twice. (Slurm holds
// a requeued job back for a while; the test releases it at once.)
TEST_P(Slurm, ARequeuedJobSavesAndItsNextRunResumesThere) {
  const std::string ck = lab_ / "ck", release = lab_ / "release";
  const std::string body = strCat(heldAt(release, "exec ", 30), " --nproc 2 --checkpoint-dir ", ck, " --resume auto");
  const std::string id = submit("rq.sh", body, "-n1 -c2 --requeue --open-mode=append");
  ASSERT_NE(id, "");
  ASSERT_TRUE(held(release)) << readText(lab_ / "rq.sh.out");
  ASSERT_EQ(slurm("scontrol requeue " + id).first, 0);
  releaseOnceSignalled(lab_ / "rq.sh.out", release);  // (its next run passes step 3 at once)
  bool released = false;                              // (pending again, its start two minutes ahead: now)
  for (int i = 0; i < 600 && !released; ++i) {
    ::usleep(100000);
    const auto [rc, state] = slurm("squeue -h -o %T -j " + id);
    if (rc == 0 && contains(state, "PENDING"))
      released = slurm("scontrol update JobId=" + id + " StartTime=now").first == 0;
  }
  ASSERT_TRUE(released) << readText(lab_ / "rq.sh.out");
  EXPECT_TRUE(contains(ended(id), "ExitCode=0:0"));
  const std::string out = readText(lab_ / "rq.sh.out");  // both runs' (appended)
  EXPECT_TRUE(contains(out, "2 of 2 worker(s) saved and stopped (exit 75)")) << out;
  const size_t at = out.find("; saved ");
  ASSERT_NE(at, std::string::npos) << out;
  const size_t from = out.rfind("after step ", at) + 11;
  const std::string stopped = out.substr(from, at - from);
  const std::string saved = out.substr(at + 8, out.find(';', at + 8) - at - 8);
  EXPECT_TRUE(contains(out, "resumed from " + saved + " at step " + stopped)) << out;
  EXPECT_TRUE(contains(out, ", 30 steps, ")) << out;
}

// Slurm's warning before the time limit (--signal=USR1@50 with --time=1; Slurm's timer sends it
// 10 to 40 s into the job) to the tasks of an exec'd srun: they stop at one step, save it, and the
// job ends with 75 before its limit (not TIMEOUT). (Its 100000 steps outlast the limit.)
TEST_P(Slurm, TheTimeLimitsWarningSavesBeforeTheLimit) {
  const std::string ck = lab_ / "ck";
  const std::string id = submit("warn.sh", strCat("exec srun -n2 -c1 ", job(100000), " --checkpoint-dir ", ck),
                                "-n2 -c1 --time=1 --signal=USR1@50");
  ASSERT_NE(id, "");
  const std::string line = ended(id);
  const std::string out = readText(lab_ / "warn.sh.out");
  EXPECT_TRUE(contains(line, "ExitCode=75:0")) << line << "\n" << out;
  EXPECT_FALSE(contains(line, "JobState=TIMEOUT")) << line;
  EXPECT_TRUE(contains(out, "aiacc_train: stopped by SIGUSR1 after step ")) << out;
  EXPECT_NE(test::newestCheckpoint(ck), "") << out;
}

// Two jobs on one node at once, in each mode that picks the rendezvous port: srun with a task
// per rank (the job id's port; rank 0 hosts the store), srun with one task per node (the same
// port; node 0's launcher hosts it) and a batch script's --nproc (a free port, said to the
// workers). Each forms its own world of 2; neither meets the other's store. In both srun pairs,
// the first job's port is held by a store of no job (a --rendezvous-server): that job's store
// takes the next free port of its 8, and its ranks find it there. (The holders hold both ports
// while both pairs run.)
TEST_P(Slurm, TwoJobsOnOneNodeAtOnceEachFormTheirOwn) {
  const int held[2] = {29500 + first_job_ % 1000, 29500 + (first_job_ + 2) % 1000};  // jobs J, J + 2
  std::string hold;
  for (int port : held) {
    hold += strCat(AIACC_TRAIN_BIN, " --rendezvous-server --rdzv-endpoint 127.0.0.1:", port,
                   " > /dev/null 2>&1 & h=\"$h $!\"; ", "for i in $(seq 100); do (exec 3<> /dev/tcp/127.0.0.1/", port,
                   ") 2> /dev/null && break; sleep 0.1; done; ");
  }
  const auto pair = [&](const std::string& srun, const std::string& flags, const std::string& a, const std::string& b) {
    return strCat("timeout 180 ", srun, " ", job(3), flags, " --report-file ", lab_ / (a + ".json"), " > ", lab_ / a,
                  " 2>&1 & a=$!; timeout 180 ", srun, " ", job(3), flags, " --report-file ", lab_ / (b + ".json"),
                  " > ", lab_ / b, " 2>&1 & b=$!; wait $a; r=$(( r | $? )); wait $b; r=$(( r | $? )); ");
  };
  const auto [rc, out] = slurm(strCat("bash -c 'r=0; ", hold, pair("srun -n2 -c1", "", "a", "b"),
                                      pair("srun -N1 -n1 -c2", " --nproc 2", "c", "d"), "kill $h; exit $r'"));
  // (Each pair in jobs J, J + 1 and J + 2, J + 3: slurm's ids count up from the lab's first.)
  const std::string logs = readText(lab_ / "a") + readText(lab_ / "b") + readText(lab_ / "c") + readText(lab_ / "d");
  EXPECT_EQ(rc, 0) << out << logs;
  for (const char* name : {"a", "b", "c", "d"}) {
    EXPECT_EQ(test::readJson(lab_ / (std::string(name) + ".json")).at("world_size"), 2) << name << "\n" << logs;
  }
  EXPECT_TRUE(contains(logs, strCat("aiacc_train: port ", held[1], " of job slurm-", first_job_ + 2,
                                    ".0 is taken; its rendezvous store is at ")))
      << logs;
  const std::string one = submit("one.sh", strCat("exec ", job(3), " --nproc 2 --report-file ", lab_ / "e.json"),
                                 "-n1 -c2");
  const std::string two = submit("two.sh", strCat("exec ", job(3), " --nproc 2 --report-file ", lab_ / "f.json"),
                                 "-n1 -c2");
  EXPECT_TRUE(contains(ended(one), "ExitCode=0:0")) << readText(lab_ / "one.sh.out");
  EXPECT_TRUE(contains(ended(two), "ExitCode=0:0")) << readText(lab_ / "two.sh.out");
  for (const char* name : {"e.json", "f.json"}) EXPECT_EQ(test::readJson(lab_ / name).at("world_size"), 2) << name;
}

// A script that runs aiacc_train --nproc 2 without exec: Slurm's signal for the batch step
// (scancel --batch --signal=USR1, as --signal=B:USR1@T would) kills the shell, and the job ends;
// with proctrack/linuxproc aiacc_train's processes used to train on outside it, and with
// proctrack/cgroup Slurm kills them with the shell, before any save. aiacc_train, run by the
// shell, now runs itself as a job step (srun), which the job's end stops with SIGTERM: it saves
// the step, says so in the script's output, and no process of it is left. Plain scancel (SIGTERM
// to every step) saves as well. Where it cannot run srun (none on its PATH) it says so and stays
// the shell's child, stopping on its death: under proctrack/linuxproc that saves too.
TEST_P(Slurm, AScriptsShellKilledBySlurmsSignalLeavesItsJobSavedAndNoProcess) {
  struct Case {
    std::string name, cancel, path;
  };
  std::vector<Case> cases = {{"usr1", "scancel --batch --signal=USR1 ", ""}, {"plain", "scancel ", ""}};
  if (!cgroup_) cases.push_back({"nosrun", "scancel --batch --signal=USR1 ", "PATH=/nonexistent "});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string ck = lab_ / (c.name + "-ck"), release = lab_ / (c.name + "-release");
    const std::string log = lab_ / (c.name + ".sh.out");
    const std::string id = submit(c.name + ".sh",
                                  strCat(heldAt(release, c.path, 400), " --nproc 2 --checkpoint-dir ", ck,
                                         " --resume auto"),
                                  "-n1 -c2");
    ASSERT_NE(id, "");
    ASSERT_TRUE(held(release)) << readText(log);
    slurm(c.cancel + id);
    releaseOnceSignalled(log, release);
    ended(id);
    std::string out;
    for (int i = 0; i < 600 && !contains(out, "worker(s) saved and stopped"); ++i) {
      ::usleep(100000);
      out = readText(log);
    }
    EXPECT_TRUE(contains(out, "aiacc_train: warning: aiacc_train runs under its Slurm batch script's shell")) << out;
    EXPECT_EQ(contains(out, "aiacc_train: warning: cannot run srun (No such file or directory): going on under "
                            "the shell"),
              !c.path.empty())
        << out;
    EXPECT_TRUE(contains(out, "2 of 2 worker(s) saved and stopped (exit 75)")) << out;
    EXPECT_NE(test::newestCheckpoint(ck), "");
    // Every process of the job ends with it (the checkpoint folder is on each one's command line;
    // "[-]" keeps pgrep's own shell, whose command line holds the pattern, from matching it).
    std::string left = "?";
    for (int i = 0; i < 100 && !left.empty(); ++i) {
      left = test::runShell("pgrep -a -f -- '[-]-checkpoint-dir " + ck + " '").second;
      if (!left.empty()) ::usleep(100000);
    }
    EXPECT_EQ(left, "") << "processes left after the job";
  }
}

// mpirun -np 2 (outside Slurm): one job of world 2.
TEST(OpenMpi, MpirunTwoRanksFormOneJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "not root (the test runs mpirun --allow-run-as-root)";
  if (!haveCommand("mpirun")) GTEST_SKIP() << "no openmpi-bin (scripts/setup.sh)";
  test::TempDir d;
  const std::string report = d / "report.json";
  // (A free port: the job id's, 29500-30499, could meet a port another test names.)
  const auto [rc, out] = test::runShell(strCat("timeout 180 mpirun -np 2 --allow-run-as-root --oversubscribe -x "
                                               "MASTER_ADDR=127.0.0.1 -x MASTER_PORT=",
                                               test::freePort(), " ", job(3), " --report-file ", report, " 2>&1"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "launched by Open MPI: 2 ranks")) << out;
  EXPECT_EQ(test::readJson(report).at("world_size"), 2);
}

// Two mpirun jobs on one node at once, neither given a port: each forms its own job of world 2, at
// its job id's port or, when another job holds that one (a Slurm lab's, or the other's, however
// unlikely), the next free one of its 8 (tests/store_test.cc makes them meet on one).
TEST(OpenMpi, TwoJobsOnOneNodeAtOnceEachFormTheirOwn) {
  if (::geteuid() != 0) GTEST_SKIP() << "not root (the test runs mpirun --allow-run-as-root)";
  if (!haveCommand("mpirun")) GTEST_SKIP() << "no openmpi-bin (scripts/setup.sh)";
  test::TempDir d;
  std::string cmd;
  for (int j = 1; j <= 2; ++j) {
    cmd += strCat("timeout 180 mpirun -np 2 --allow-run-as-root --oversubscribe ", job(30), " --report-file ",
                  d / strCat("report", j, ".json"), " > ", d / strCat("out", j), " 2>&1 & ");
  }
  const auto [rc, out] = test::runShell(cmd + "wait %1; a=$?; wait %2; echo rc1=$a rc2=$?");
  ASSERT_EQ(rc, 0) << out;
  for (int j = 1; j <= 2; ++j) {
    const std::string log = readText(d / strCat("out", j));
    EXPECT_TRUE(contains(out, strCat("rc", j, "=0"))) << out << "\njob " << j << ":\n" << log;
    EXPECT_TRUE(contains(log, "launched by Open MPI: 2 ranks")) << log;
    EXPECT_EQ(test::readJson(d / strCat("report", j, ".json")).at("world_size"), 2) << log;
  }
}

}  // namespace
}  // namespace aiacc::test_slurm
