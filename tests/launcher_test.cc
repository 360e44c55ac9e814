// Real processes under real launchers: torchrun (the torch.distributed.run of the PyTorch release
// aiacc is built against, AIACC_GOLDEN_PYTHON: TCPStore's wire protocol changed in 2.x, and a
// 2.11 client is reset by a 1.13 agent's store) starts two
// aiacc_train ranks that meet at its agent's store and train one job; aiacc_train's own launcher
// prefixes or files its workers' output, forwards SIGTERM, and leaves no worker behind when it
// is SIGKILLed; three ranks without a launcher end at once, naming the cause, when one is killed
// or stopped; a process of another job is refused by a running job's store.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "aiacc/config.h"
#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

const auto run = test::runShell;
using test::freePort;

// A short CPU job: 2 ranks x 8 images x `steps` steps.
std::string smallJob(int steps) {
  return " --data synthetic --arch resnet18-w16 --synthetic-classes 4 --synthetic-images 128 --batch-size 8 "
         "--image-size 32 --epochs 1 --warmup-epochs 0 --threads 1 --max-steps " +
         std::to_string(steps);
}

// A job that runs until stopped.
std::string longJob() {
  return " --data synthetic --arch resnet18-w16 --synthetic-classes 4 --synthetic-images 100000 --batch-size 4 "
         "--image-size 32 --epochs 1 --warmup-epochs 0 --threads 1 --comm-timeout 30";
}

// Shell: waits (up to 60 s) until FILE is non-empty, i.e. the job has trained a step.
std::string waitForFile(const std::string& file) {
  return "for i in $(seq 300); do [ -s " + file + " ] && break; sleep 0.2; done; ";
}

// Shell: waits up to 5 s for the pids in $W to be gone (a zombie counts as gone: nobody may
// reap it in a container), then prints "left:PID" for each still running.
const char* kWorkersGone =
    "for i in $(seq 50); do n=0; for w in $W; do s=$(awk '{print $3}' /proc/$w/stat 2>/dev/null); "
    "[ -n \"$s\" ] && [ \"$s\" != Z ] && n=1; done; [ $n = 0 ] && break; sleep 0.1; done; "
    "for w in $W; do s=$(awk '{print $3}' /proc/$w/stat 2>/dev/null); "
    "[ -n \"$s\" ] && [ \"$s\" != Z ] && echo left:$w; done; ";

bool haveTorchrun() {
  return run(std::string(AIACC_GOLDEN_PYTHON) + " -c 'import torch.distributed.run' >/dev/null 2>&1 && echo yes")
             .second == "yes\n";
}

// torchrun --no_python: the agent hosts the TCPStore at MASTER_ADDR:MASTER_PORT; the two ranks
// connect to it as clients and train one job of world 2.
TEST(Torchrun, TwoRanksTrainOneJobAtTheAgentsStore) {
  if (!haveTorchrun()) GTEST_SKIP() << "no torch.distributed.run in " << AIACC_GOLDEN_PYTHON;
  test::TempDir d;
  // Debian's torch 1.13 under Python 3.11 fails on -r 0 / -t 0 (its defaults): pass 1 and a log dir.
  const std::string cmd = "cd " + d.path() + " && " + AIACC_GOLDEN_PYTHON +
                          " -m torch.distributed.run --no_python --nnodes 1 "
                          "--nproc_per_node 2 -r 1 -t 1 --log_dir " +
                          d.path() + "/tr --master_port " + std::to_string(freePort()) + " " + AIACC_TRAIN_BIN +
                          smallJob(4) + " --report-file " + d.path() + "/r.json 2>&1";
  auto [rc, out] = run(cmd);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("launched by torchrun: 2 ranks, 2 per node"), std::string::npos) << out;
  EXPECT_NE(out.find("(hosted by the launcher's agent)"), std::string::npos) << out;
  const Json json = test::readJson(d / "r.json");
  EXPECT_EQ(json.at("world_size"), 2) << json;
  EXPECT_EQ(json.at("images_seen"), 64) << json;  // 4 steps x 8 x 2 ranks
  // Both ranks ran to the end: each wrote its stdout through torchrun's redirect.
  int logs = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(d / "tr")) {
    logs += f.path().filename() == "stdout.log";
  }
  EXPECT_EQ(logs, 2);
}

// Each launcher's variables, as it would set them for rank R of 2 on one host (P: the port).
struct LauncherVars {
  const char* name;
  const char* vars;    // R and P are replaced
  const char* flags;   // extra aiacc_train flags
  const char* said;    // rank 0's log line ("" when its workers are aiacc's own)
  bool apart = false;  // the variables put the ranks on different hosts (no shared memory)
};
const LauncherVars kLaunchers[] = {
    {"PyTorchJob", "RANK=R WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P", "",
     "launched by the environment (PyTorchJob/JobSet): 2 ranks", true},
    {"OpenMpi",
     "OMPI_COMM_WORLD_RANK=R OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=R "
     "OMPI_COMM_WORLD_LOCAL_SIZE=2",
     "--master 127.0.0.1:P", "launched by Open MPI: 2 ranks, 2 per node"},
    {"Mpich", "PMI_RANK=R PMI_SIZE=2 MPI_LOCALRANKID=R MPI_LOCALNRANKS=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P", "",
     "launched by MPICH/PMI: 2 ranks, 2 per node"},
    {"Horovod",
     "HOROVOD_RANK=R HOROVOD_SIZE=2 HOROVOD_LOCAL_RANK=R HOROVOD_LOCAL_SIZE=2 HOROVOD_CROSS_RANK=0 "
     "HOROVOD_CROSS_SIZE=1 HOROVOD_GLOO_RENDEZVOUS_ADDR=127.0.0.1 HOROVOD_GLOO_RENDEZVOUS_PORT=1 "
     "HOROVOD_CONTROLLER=gloo HOROVOD_CPU_OPERATIONS=gloo",
     "--master 127.0.0.1:P", "launched by horovodrun: 2 ranks, 2 per node"},
    {"SlurmStep",
     "SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_PROCID=R SLURM_LOCALID=R SLURM_NODEID=0 SLURM_STEP_NUM_TASKS=2 "
     "SLURM_STEP_NUM_NODES=1 SLURM_STEP_TASKS_PER_NODE=2 SLURM_STEP_NODELIST=localhost MASTER_PORT=P",
     "", "launched by the Slurm job step: 2 ranks, 2 per node, store at localhost:"},
    // Kubeflow's PET_* on two "pods": each process starts its node's one worker.
    {"KubeflowPet", "PET_NNODES=2 PET_NODE_RANK=R PET_NPROC_PER_NODE=1 PET_MASTER_ADDR=127.0.0.1 PET_MASTER_PORT=P", "",
     "", true},
};

void PrintTo(const LauncherVars& l, std::ostream* os) { *os << l.name; }

class UnderLauncher : public ::testing::TestWithParam<LauncherVars> {};

// Replaces the values "R" (rank) and "P" (port) after '=' or ':' in a list of words.
std::string substitute(const std::string& s, int rank, int port) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool value = i > 0 && (s[i - 1] == '=' || s[i - 1] == ':') && (i + 1 == s.size() || s[i + 1] == ' ');
    if (value && s[i] == 'R') {
      out += std::to_string(rank);
    } else if (value && s[i] == 'P') {
      out += std::to_string(port);
    } else {
      out += s[i];
    }
  }
  return out;
}

// Two real processes with the launcher's variables meet and train one job of world 2.
TEST_P(UnderLauncher, TwoProcessesTrainOneJob) {
  const LauncherVars& l = GetParam();
  test::TempDir d;
  const int port = freePort();
  auto command = [&](int rank) {
    return "env " + substitute(l.vars, rank, port) + " " + AIACC_TRAIN_BIN + smallJob(2) + " " +
           substitute(l.flags, rank, port) + " --report-file " + d.path() + "/r" + std::to_string(rank) + ".json";
  };
  auto [rc, out] = run("(" + command(1) + " > " + d.path() + "/log1 2>&1; echo $? > " + d.path() + "/rc1) & " +
                       command(0) + " 2>&1; echo rc0=$?; wait; echo rc1=$(cat " + d.path() + "/rc1); cat " + d.path() +
                       "/log1");
#if !AIACC_WITH_GLOO
  if (l.apart) {  // CPU ranks on two hosts need Gloo: refused, saying so, on both
    EXPECT_EQ(out.find("rc0=0"), std::string::npos) << out;
    EXPECT_NE(out.find("need GlooTransport"), std::string::npos) << out;
    return;
  }
#endif
  EXPECT_NE(out.find("rc0=0"), std::string::npos) << out;
  EXPECT_NE(out.find("rc1=0"), std::string::npos) << out;
  EXPECT_NE(out.find(l.said), std::string::npos) << out;
  const Json json = test::readJson(d / "r0.json");
  EXPECT_EQ(json.at("world_size"), 2) << json << out;
  EXPECT_EQ(json.at("images_seen"), 32) << json;  // 2 steps x 8 x 2 ranks
}

INSTANTIATE_TEST_SUITE_P(Launchers, UnderLauncher, ::testing::ValuesIn(kLaunchers),
                         [](const ::testing::TestParamInfo<LauncherVars>& i) { return std::string(i.param.name); });

TEST(Launcher, HelpNamesLogDir) {
  auto [rc, out] = run(std::string(AIACC_TRAIN_BIN) + " --help 2>&1");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("--log-dir (string"), std::string::npos) << out;
  EXPECT_NE(out.find("Under a launcher"), std::string::npos) << out;
}

// A launcher variable against a contradicting flag: one line naming both, before anything starts.
TEST(Torchrun, ConflictingFlagIsOneLine) {
  auto [rc, out] = run("env RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 "
                       "MASTER_PORT=1 TORCHELASTIC_RUN_ID=x TORCHELASTIC_USE_AGENT_STORE=True " +
                       std::string(AIACC_TRAIN_BIN) + " --nproc 3" + smallJob(1) + " 2>&1");
  EXPECT_EQ(rc, 2) << "a usage error";
  EXPECT_NE(out.find("aiacc_train: error: LOCAL_WORLD_SIZE=2 from torchrun conflicts with --nproc 3: drop --nproc "
                     "under a launcher\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

// Workers' lines carry their rank; --log-dir puts them in one file per rank instead.
TEST(Launcher, OutputPrefixedByRankOrFiledPerRank) {
  test::TempDir d;
  const std::string master = " --master 127.0.0.1:" + std::to_string(freePort());
  auto [rc, out] = run(std::string(AIACC_TRAIN_BIN) + " --nproc 2" + master + smallJob(2) + " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[rank 0] "), std::string::npos) << out;
  EXPECT_NE(out.find("\n[rank 0] "), std::string::npos) << out;
  const std::string logs = d / "logs";
  std::tie(rc, out) = run(std::string(AIACC_TRAIN_BIN) + " --nproc 2" + master + smallJob(2) + " --log-dir " + logs +
                          " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("worker output in " + logs), std::string::npos) << out;
  EXPECT_EQ(out.find("[rank "), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(logs + "/rank-1.log"));
  EXPECT_NE(test::readText(logs + "/rank-0.log").find("(2 processes)"), std::string::npos);
}

// Two one-node jobs at once on one machine, neither given --master (a batch script's --nproc on
// a shared node): each launcher hosts its store at a free port and tells its workers, and both
// train (they met on 127.0.0.1:29500, and the second failed, before).
TEST(Launcher, TwoOneNodeJobsAtOnceEachHostTheirOwnStore) {
  test::TempDir d;
  const std::string job = std::string(AIACC_TRAIN_BIN) + " --nproc 2" + smallJob(3);
  const auto [rc, out] = run("(" + job + " > " + (d / "a.log") + " 2>&1; echo a=$?) & (" + job + " > " + (d / "b.log") +
                             " 2>&1; echo b=$?) & wait");
  EXPECT_NE(out.find("a=0"), std::string::npos) << out << test::readText(d / "a.log");
  EXPECT_NE(out.find("b=0"), std::string::npos) << out << test::readText(d / "b.log");
}

// SIGKILL to the launcher: its workers die with it (PR_SET_PDEATHSIG), none is left after 5 s.
TEST(Launcher, SigkilledLauncherLeavesNoWorker) {
  test::TempDir d;
  const std::string metrics = d / "m.jsonl";
  const std::string script = std::string(AIACC_TRAIN_BIN) +
                             " --nproc 2 --master 127.0.0.1:" + std::to_string(freePort()) + longJob() +
                             " --metrics-file " + metrics + " > " + d.path() + "/log 2>&1 & L=$!; " +
                             waitForFile(metrics) + "W=$(pgrep -P $L | tr '\\n' ' '); echo workers=$W; kill -9 $L; " +
                             kWorkersGone + "cat " + d.path() + "/log";
  test::writeText(d / "kill.sh", script + "\n");
  const std::string out = run("bash " + d.path() + "/kill.sh").second;
  ASSERT_NE(out.find("workers="), std::string::npos) << out;
  const std::string line = out.substr(out.find("workers="),
                                      out.find('\n', out.find("workers=")) - out.find("workers="));
  EXPECT_GE(std::count(line.begin(), line.end(), ' '), 1) << "two workers were running: " << line << "\n" << out;
  EXPECT_EQ(out.find("left:"), std::string::npos) << out;
}

// SIGTERM to the launcher: forwarded to the workers, which end; the launcher says so and exits
// non-zero (128 + 15).
TEST(Launcher, SigtermIsForwardedAndEndsTheJob) {
  test::TempDir d;
  const std::string metrics = d / "m.jsonl";
  const std::string script = std::string(AIACC_TRAIN_BIN) +
                             " --nproc 2 --master 127.0.0.1:" + std::to_string(freePort()) + longJob() +
                             " --metrics-file " + metrics + " > " + d.path() + "/log 2>&1 & L=$!; " +
                             waitForFile(metrics) +
                             "W=$(pgrep -P $L | tr '\\n' ' '); echo workers=$W; kill -TERM $L; wait $L; "
                             "echo rc=$?; " +
                             kWorkersGone + "cat " + d.path() + "/log";
  test::writeText(d / "term.sh", script + "\n");
  const std::string out = run("bash " + d.path() + "/term.sh").second;
  EXPECT_NE(out.find("rc=143"), std::string::npos) << out;
  EXPECT_NE(out.find("aiacc_train: received SIGTERM; forwarding it to the 2 worker(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("aiacc_train: stopped by SIGTERM"), std::string::npos) << out;
  EXPECT_EQ(out.find("left:"), std::string::npos) << out;
}

// A process of another job pointed at a running job's store (here: rank 1 of a job whose id
// differs, as after a port collision) is refused at once, saying so, and the running job goes
// on to train every step it was asked for.
TEST(Launcher, ProcessOfAnotherJobIsRefusedAndTheJobGoesOn) {
  test::TempDir d;
  const std::string metrics = d / "m.jsonl";
  const std::string port = std::to_string(freePort());
  const std::string job = " --data synthetic --arch resnet18 --synthetic-classes 4 --synthetic-images 2400 "
                          "--batch-size 8 --image-size 32 --epochs 1 --warmup-epochs 0 --threads 1 --max-steps 60";
  const std::string script =
      std::string(AIACC_TRAIN_BIN) + " --nproc 2 --master 127.0.0.1:" + port + job + " --metrics-file " + metrics +
      " --report-file " + d.path() + "/r.json > " + d.path() + "/log 2>&1 & L=$!; " + waitForFile(metrics) +
      "env AIACC_RANK=1 AIACC_WORLD_SIZE=2 AIACC_LOCAL_RANK=1 AIACC_LOCAL_SIZE=2 AIACC_MASTER=127.0.0.1:" + port +
      " AIACC_JOB_ID=intruder " + AIACC_TRAIN_BIN + job + " 2>&1; echo intruder=$?; wait $L; echo rc=$?; cat " +
      d.path() + "/log";
  test::writeText(d / "other.sh", script + "\n");
  const std::string out = run("bash " + d.path() + "/other.sh").second;
  EXPECT_NE(out.find("belongs to another job ('aiacc-"), std::string::npos) << out;
  EXPECT_NE(out.find("this process is job 'intruder')"), std::string::npos) << out;
  EXPECT_NE(out.find("intruder=1"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out;
  const Json json = test::readJson(d / "r.json");
  EXPECT_EQ(json.at("images_seen"), 960) << json << out;  // 60 steps x 8 x 2 ranks
}

// Three real aiacc_train ranks (no launcher: as under Kubernetes, nobody stops the others); rank
// 2 is SIGKILLed or SIGSTOPped once the job trains. Ranks 0 and 1 must exit with an error naming
// the cause long before --comm-timeout (60 s): over shared memory a dead peer's liveness lock is
// free, over Gloo its sockets close; a stopped one's heartbeats stop (3 s). Neither transport may
// wait out the timeout.
struct LostRankCase {
  const char* name;
  bool shm;
  const char* signal;
  const char* cause;  // in a survivor's error (the other may name the first one's abort instead)
};
class LostRank : public ::testing::TestWithParam<LostRankCase> {};

TEST_P(LostRank, OthersExitAtOnceNamingTheCause) {
  const LostRankCase c = GetParam();
#if !AIACC_WITH_GLOO
  if (!c.shm) GTEST_SKIP() << "this build has no GlooTransport";
#endif
  test::TempDir d;
  const std::string port = std::to_string(test::freePort());
  const std::string metrics = d / "m.jsonl";
  auto rank = [&](int r) {
    return "env AIACC_RANK=" + std::to_string(r) + " AIACC_WORLD_SIZE=3 AIACC_LOCAL_RANK=" + std::to_string(r) +
           " AIACC_LOCAL_SIZE=3 AIACC_MASTER=127.0.0.1:" + port + " " + AIACC_TRAIN_BIN +
           " --data synthetic --arch resnet18 --synthetic-classes 4 --synthetic-images 100000 --batch-size 4 "
           "--image-size 32 --epochs 1 --warmup-epochs 0 --threads 1 --comm-timeout 60" +
           (c.shm ? "" : " --noshm") + (r == 0 ? " --metrics-file " + metrics : std::string()) + " > " + d.path() +
           "/log" + std::to_string(r) + " 2>&1 & P" + std::to_string(r) + "=$!; ";
  };
  const std::string script = rank(0) + rank(1) + rank(2) + "for i in $(seq 300); do [ -s " + metrics +
                             " ] && break; sleep 0.2; done; kill -" + c.signal +
                             " $P2; s=$(date +%s%N); wait $P0; echo rc0=$?; wait $P1; echo rc1=$?; "
                             "echo took_ms=$(( ($(date +%s%N) - s) / 1000000 )); kill -KILL $P2; kill -CONT $P2; "
                             "wait $P2; cat " +
                             d.path() + "/log0 " + d.path() + "/log1";
  test::writeText(d / "lost.sh", script + "\n");
  const std::string out = test::runShell("bash " + d.path() + "/lost.sh 2>&1").second;
  EXPECT_NE(out.find("rc0=1"), std::string::npos) << out;
  EXPECT_NE(out.find("rc1=1"), std::string::npos) << out;
  EXPECT_NE(out.find(c.cause), std::string::npos) << out;
  EXPECT_EQ(out.find("did not reach the barrier within"), std::string::npos) << out;
  EXPECT_EQ(out.find("timed out after"), std::string::npos) << out;    // the store's wait
  EXPECT_EQ(out.find("Timed out waiting"), std::string::npos) << out;  // a Gloo collective's
  const size_t at = out.find("took_ms=");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_LT(std::stod(out.substr(at + 8)), 30 * 1000) << out;  // half the timeout: no wait for it
}

const LostRankCase kLostRankCases[] = {
    {"SharedMemoryKilled", true, "KILL", "shm: rank 2 died (its process is gone)"},
    {"SharedMemoryStopped", true, "STOP", "shm: rank 2 stopped responding: no heartbeat for"},
    {"GlooKilled", false, "KILL", "Connection"},
    {"GlooStopped", false, "STOP", "gloo: rank 2 stopped responding: no heartbeat for"},
};
INSTANTIATE_TEST_SUITE_P(Transports, LostRank, ::testing::ValuesIn(kLostRankCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace aiacc::app
