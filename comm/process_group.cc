#include "aiacc/comm/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "aiacc/comm/agreement.h"
#include "aiacc/comm/data_parallel_options.h"
#include "aiacc/comm/factory.h"
#include "aiacc/comm/launch_env.h"
#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {
namespace {

std::string thisHost() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return strCat(name, "/", boot);
}

// Whether every rank runs on rank 0's host, through the store: rank 0 publishes its host, each
// rank adds 1 to "same" when it shares it and then says it arrived; once all have, every rank
// reads "same". A few store requests a rank, whatever the world; a rank that never comes is a
// CommError naming it (waitForRanks).
WorldInfo findLocalRanks(c10d::Store& store, const WorldInfo& w, const std::string& host,
                         std::chrono::milliseconds timeout) {
  const std::string k = "local_layout/";
  if (w.rank == 0) store.set(k + "host/0", std::vector<uint8_t>(host.begin(), host.end()));
  waitForRanks(store, k + "host", 1, timeout);
  const std::vector<uint8_t> host0 = store.get(k + "host/0");
  if (std::string(host0.begin(), host0.end()) == host) store.add(k + "same", 1);
  store.set(strCat(k, "arrived/", w.rank), std::vector<uint8_t>{1});
  waitForRanks(store, k + "arrived", w.world, timeout);
  if (store.add(k + "same", 0) != w.world) return w;  // several hosts: one rank each, as before
  WorldInfo local = w;
  local.local_rank = w.rank;
  local.local_size = w.world;
  return local;
}

}  // namespace

std::string ProcessGroup::describe() const {
  return strCat("rank ", world.rank, " of ", world.world, " (", sourceName(source), "; ", world.local_size,
                " on this host): ", transports.why.empty() ? "no transport" : transports.why);
}

ProcessGroup connectProcessGroup(const ProcessGroupOptions& options) {
  const WorldInfo& w = options.transports.world;
  AIACC_CHECK_INPUT(options.store.rank == w.rank && options.store.world == w.world, "the store's rank and world (",
                    options.store.rank, " of ", options.store.world, ") are not the transports' (", w.rank, " of ",
                    w.world, ")");
  // (With find_local_ranks the layout is known only once the store is there.)
  if (!options.find_local_ranks) checkLayoutSupported(options.transports);
  ProcessGroup g;
  g.world = w;
  g.store = options.shared_store ? storeUnderPrefix(options.store, options.shared_store) : makeTcpStore(options.store);
  TransportSpec transports = options.transports;
  if (options.find_local_ranks && w.world > 1) {
    g.world = transports.world = findLocalRanks(*g.store, w, options.host_id.empty() ? thisHost() : options.host_id,
                                                options.store.timeout);
    checkLayoutSupported(transports);
  }
  agreeAcrossRanks(*g.store, g.world, options.settings, options.store.timeout);
  g.transports = makeTransports(g.store, transports);
  return g;
}

ProcessGroup initProcessGroup(ProcessGroupOptions options, const EnvMap& env) {
  const LaunchEnv launch = detectLaunch(env);
  AIACC_CHECK_INPUT(launch.per_process, sourceName(launch.source), "'s variables describe a node, not a rank (",
                    launch.nodes_from,
                    "): start this program under a launcher that starts one process per rank (torchrun reads "
                    "these variables)");
  // AIACC_STREAMS asks DataParallel to stripe over that many channels: the transports get them.
  const DataParallelOptions from_env = optionsFromEnvironment(env);
  options.transports.channels = std::max(options.transports.channels, from_env.striping.channels);
  if (launch.source == LaunchSource::kNone || launch.world.world == 1) {
    ProcessGroup g;
    g.source = launch.source;
    options.transports.world = g.world;  // world 1
    g.store = makeHashStore();
    g.transports = makeTransports(g.store, options.transports);
    return g;
  }
  const WorldInfo& w = launch.world;
  const std::string master = launch.master.empty() ? strCat("127.0.0.1:", kDefaultStorePort) : launch.master;
  const auto [host, port] = parseHostPort(master, strCat("the store address from ", sourceName(launch.source)));
  if ((launch.master.empty() || launch.master_is_default) && isLoopbackHost(host)) {
    // As aiacc_train's launch plan: ranks known to span hosts cannot meet at a loopback address
    // nobody named (the default, or an MPI job's port on loopback).
    const bool several_hosts = launch.nnodes > 1 || (!launch.local_from.empty() && w.local_size < w.world);
    AIACC_CHECK_INPUT(!several_hosts, sourceName(launch.source), " gives ", launch.world_from, " on several hosts (",
                      launch.local_from.empty() ? launch.nodes_from : launch.local_from,
                      ") and no store address: export MASTER_ADDR and MASTER_PORT (rank 0's host and a free port) "
                      "to every rank");
  }
  options.transports.world = w;
  // Left at its default, Gloo listens on the interface that reaches the store's host.
  if (!isLoopbackHost(host) && options.transports.bind_host == TransportSpec{}.bind_host) {
    options.transports.bind_host = localAddressToward(host);
  }
  options.store.host = host;
  options.store.port = port;
  options.store.port_tries = launch.master_ports;  // > 1 only for a port derived from a job id
  options.store.rank = w.rank;
  options.store.world = w.world;
  options.store.client_only = launch.agent_store;
  if (!launch.job_key.empty()) options.store.prefix += "/" + launch.job_key;
  if (options.store.job.empty()) options.store.job = defaultJobId(launch);
  options.find_local_ranks = launch.local_from.empty();  // the launcher did not say
  ProcessGroup g = connectProcessGroup(options);
  g.source = launch.source;
  return g;
}

}  // namespace aiacc::comm
