// comm::initProcessGroup and connectProcessGroup (comm/process_group.h): a process group from a
// launcher's variables, given as an EnvMap so that each case sets exactly what a launcher would;
// ranks as threads of this process, meeting through a real TCPStore on a free loopback port.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>
#include <vector>

#include "aiacc/comm/process_group.h"
#include "aiacc/config.h"
#include "aiacc/common/error.h"
#include "tests/comm_test_util.h"
#include "tests/test_util.h"

namespace aiacc::comm {
namespace {

// What torchrun --standalone sets for a rank of `world` on one host (without its agent store).
EnvMap torchrunRank(int rank, int world, int port) {
  const std::string r = std::to_string(rank), w = std::to_string(world);
  return {{"RANK", r},
          {"WORLD_SIZE", w},
          {"LOCAL_RANK", r},
          {"LOCAL_WORLD_SIZE", w},
          {"GROUP_RANK", "0"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"TORCHELASTIC_RUN_ID", "pg-test"}};
}

ProcessGroupOptions quick() {
  ProcessGroupOptions o;
  o.store.timeout = o.transports.timeout = std::chrono::seconds(20);
  return o;
}

TEST(ProcessGroup, WithoutALauncherIsAGroupOfOne) {
  const ProcessGroup g = initProcessGroup(quick(), EnvMap{{"HOME", "/root"}});
  EXPECT_EQ(g.world.rank, 0);
  EXPECT_EQ(g.world.world, 1);
  EXPECT_EQ(g.source, LaunchSource::kNone);
  ASSERT_NE(g.transports.primary, nullptr);
  EXPECT_EQ(g.transports.primary->size(), 1);
  at::Tensor t = at::arange(4, at::kFloat);
  g.transports.primary->allreduce(t)->wait();
  EXPECT_TRUE(t.equal(at::arange(4, at::kFloat)));
}

// AIACC_STREAMS gives the transports the channels DataParallel will stripe over.
TEST(ProcessGroup, AiaccStreamsGivesTheTransportsTheirChannels) {
  EXPECT_EQ(initProcessGroup(quick(), EnvMap{{"AIACC_STREAMS", "3"}}).transports.primary->channels(), 3);
  EXPECT_EQ(initProcessGroup(quick(), EnvMap{}).transports.primary->channels(), TransportSpec{}.channels);
  EXPECT_THROW(initProcessGroup(quick(), EnvMap{{"AIACC_STREAMS", "x"}}), InputError);
}

TEST(ProcessGroup, TwoRanksFromTorchrunsVariablesReduceTogether) {
  const int port = aiacc::test::freePort();
  std::vector<ProcessGroup> groups(2);
  const auto errors = test::runThreads(2, [&](int r) {
    groups[r] = initProcessGroup(quick(), torchrunRank(r, 2, port));
    at::Tensor t = at::full({3}, static_cast<float>(r + 1));
    groups[r].transports.primary->allreduce(t)->wait();
    EXPECT_TRUE(t.equal(at::full({3}, 3.0f))) << "rank " << r;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(groups[r].world.rank, r);
    EXPECT_EQ(groups[r].world.world, 2);
    EXPECT_EQ(groups[r].world.local_size, 2);
    EXPECT_EQ(groups[r].source, LaunchSource::kTorchrun);
    EXPECT_NE(groups[r].describe().find("torchrun"), std::string::npos) << groups[r].describe();
  }
}

// Plain RANK/WORLD_SIZE/MASTER_* without LOCAL_*: the ranks find through the store that they share
// a host, and reduce over shared memory; given different hosts, they keep one rank per host.
TEST(ProcessGroup, RanksWithoutLocalVariablesFindTheirHost) {
  for (const bool one_host : {true, false}) {
    SCOPED_TRACE(one_host ? "one host" : "two hosts");
#if !AIACC_WITH_GLOO
    if (!one_host) continue;  // CPU ranks across hosts need Gloo
#endif
    const int port = aiacc::test::freePort();
    std::vector<ProcessGroup> groups(2);
    const auto errors = test::runThreads(2, [&](int r) {
      ProcessGroupOptions o = quick();
      o.host_id = one_host ? "host-a" : (r == 0 ? "host-a" : "host-b");
      groups[r] = initProcessGroup(o, EnvMap{{"RANK", std::to_string(r)},
                                             {"WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "127.0.0.1"},
                                             {"MASTER_PORT", std::to_string(port)}});
      at::Tensor t = at::full({3}, static_cast<float>(r + 1));
      groups[r].transports.primary->allreduce(t)->wait();
      EXPECT_TRUE(t.equal(at::full({3}, 3.0f))) << "rank " << r;
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(errors[r], "") << "rank " << r;
      EXPECT_EQ(groups[r].world.local_size, one_host ? 2 : 1);
      EXPECT_EQ(groups[r].world.local_rank, one_host ? r : 0);
      EXPECT_EQ(groups[r].transports.why.find("shared memory") != std::string::npos, one_host)
          << groups[r].transports.why;
    }
  }
}

// torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True): every rank, rank 0
// included, connects as a client (rank 0 hosting a second server on the port would fail), claims
// the store for the run id, and keeps its keys under the run and restart (a restarted attempt
// must not meet the last one's keys).
TEST(ProcessGroup, TorchrunsAgentStoreIsJoinedNotHosted) {
  const int port = aiacc::test::freePort();
  c10d::TCPStoreOptions agent_options;
  agent_options.port = static_cast<std::uint16_t>(port);
  agent_options.isServer = true;
  agent_options.waitWorkers = false;
  agent_options.timeout = std::chrono::seconds(20);
  auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", agent_options);
  std::vector<ProcessGroup> groups(2);
  const auto errors = test::runThreads(2, [&](int r) {
    EnvMap env = torchrunRank(r, 2, port);
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    env["TORCHELASTIC_RESTART_COUNT"] = "1";
    groups[r] = initProcessGroup(quick(), env);
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  const std::vector<uint8_t> job = agent->get("aiacc/job");
  EXPECT_EQ(std::string(job.begin(), job.end()), "pg-test");
  EXPECT_TRUE(agent->check({"aiacc/pg-test/1/agree/count"}));
  EXPECT_FALSE(agent->check({"aiacc/agree/count"}));
}

TEST(ProcessGroup, RanksWithDifferentSettingsAreRefusedAtTheRendezvous) {
  const int port = aiacc::test::freePort();
  const auto errors = test::runThreads(2, [&](int r) {
    ProcessGroupOptions o = quick();
    o.settings = {{"batch size", r == 0 ? "32" : "64"}};
    initProcessGroup(o, torchrunRank(r, 2, port));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("batch size"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

TEST(ProcessGroup, VariablesThatDoNotDescribeARankAreRefused) {
  // Kubeflow's PET_* describe a node, whose launcher would start the ranks.
  const EnvMap kubeflow{{"PET_NNODES", "2"},
                        {"PET_NODE_RANK", "0"},
                        {"PET_NPROC_PER_NODE", "2"},
                        {"PET_MASTER_ADDR", "10.0.0.1"},
                        {"PET_MASTER_PORT", "29500"}};
  try {
    initProcessGroup(quick(), kubeflow);
    FAIL() << "accepted a node's variables";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("describe a node, not a rank"), std::string::npos) << e.what();
  }
  // Open MPI ranks on two hosts with no store address.
  const EnvMap mpi{{"OMPI_COMM_WORLD_RANK", "0"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  try {
    initProcessGroup(quick(), mpi);
    FAIL() << "accepted ranks on several hosts without a store address";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("export MASTER_ADDR and MASTER_PORT"), std::string::npos) << e.what();
  }
  // The same with Open MPI's job id, whose port on loopback serves one host only.
  EnvMap with_id = mpi;
  with_id["OMPI_MCA_ess_base_jobid"] = "2745499649";
  try {
    initProcessGroup(quick(), with_id);
    FAIL() << "accepted ranks on several hosts at the job's loopback port";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("export MASTER_ADDR and MASTER_PORT"), std::string::npos) << e.what();
  }
  // A malformed port.
  EnvMap bad = torchrunRank(0, 2, 1);
  bad["MASTER_PORT"] = "99999";
  EXPECT_THROW(initProcessGroup(quick(), bad), InputError);
}

TEST(ProcessGroup, TheStoreAndTheTransportsMustBeTheSameRank) {
  ProcessGroupOptions o = quick();
  o.transports.world = {1, 2, 1, 2};
  o.store.rank = 0;
  o.store.world = 2;
  EXPECT_THROW(connectProcessGroup(o), InputError);
}

}  // namespace
}  // namespace aiacc::comm
