// An elastic job on the emulated cluster (scripts/netlab.sh): three nodes, each a network
// namespace with its own 1 Gbit/s link, one aiacc_train launcher and one worker each, ranks over
// Gloo (no shared memory between namespaces), --nnodes 2:3. Node 2's link goes down while the job
// trains, as a pulled cable or a dead switch port: its process lives on, the others' sockets to
// it stay open and nothing arrives. Heartbeats name it, the other two regroup and finish the job,
// and no sample of the epoch is trained twice. Needs root (CI runs as root).
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "aiacc/config.h"
#include "tests/comm_test_util.h"  // AIACC_SKIP_WITHOUT_GLOO
#include "tests/elastic_job.h"

namespace aiacc::app {
namespace {

using test_elastic::expectEachSampleOnce;
using test_elastic::expectTwoOfThreeWentOn;
using test_elastic::Job;
using test_elastic::JobSpec;
using test_elastic::kBatch;
using test_elastic::runKilledJob;

TEST(ElasticLab, ANodeWhoseLinkGoesDownIsLeftOutAndTheOthersGoOn) {
  AIACC_SKIP_WITHOUT_GLOO();
  if (::geteuid() != 0) GTEST_SKIP() << "not root: the lab needs network namespaces (NetLab.* checks the refusal)";
  // The lab's own names and subnet (NetLab.* uses aiacc-test and 10.232.0; scripts/bench_lab.sh the defaults).
  const std::string lab = "env AIACC_NETLAB_PREFIX=aiacc-el AIACC_NETLAB_SUBNET=10.233.0 bash " + test::sourceDir() +
                          "/scripts/netlab.sh";
  struct Down {  // whatever happens below, the lab goes (and every process in it)
    std::string cmd;
    ~Down() { test::runShell(cmd); }
  } down{lab + " down > /dev/null 2>&1"};
  const auto [rc, out] = test::runShell(lab + " up --nodes 3 --bw 1gbit 2>&1");
  ASSERT_EQ(rc, 0) << out;
  test::TempDir d;
  JobSpec spec;
  spec.extra = "--noshm";
  spec.node_prefix = lab + " run %N --";
  spec.master_host = "10.233.0.1";  // node 0's launcher hosts the store
  // Once nodes 0 and 1 have ended, node 2 (cut off, waiting out its own timeouts) is killed.
  spec.act =
      "ip -n aiacc-el-n2 link set eth0 down; "
      "(while kill -0 $L0 2> /dev/null || kill -0 $L1 2> /dev/null; do sleep 0.2; done; kill -KILL $W $L2) & K=$!";
  const Job job = runKilledJob(d, spec);
  const Json change = expectTwoOfThreeWentOn(job);
  if (change.is_null()) return;
  EXPECT_LE(change.at("steps_lost").get<int>(), 1) << change;
  EXPECT_LT(change.at("detect_s").get<double>(), 10) << change;  // heartbeats (3 s), not --comm-timeout (60 s)
  EXPECT_NE(job.out.find(": rank 2 stopped responding: no heartbeat for"), std::string::npos) << job.out;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
  EXPECT_EQ(job.report.at("images_seen").get<int64_t>(), job.trained) << job.restores;
  expectEachSampleOnce(job, 2 * (kBatch - 1) + 1);
}

}  // namespace
}  // namespace aiacc::app
