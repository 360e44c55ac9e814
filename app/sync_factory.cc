#include "app/sync_factory.h"

#include <glog/logging.h>

#include <torch/cuda.h>

#include <string>
#include <utility>

#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/process_group.h"
#include "app/elastic.h"
#include "app/job_settings.h"
#include "app/launcher.h"

namespace aiacc::app {

// (World size 1 and not elastic: LocalSync. An elastic job: each call makes the current
// generation's.)
SyncFactory makeSyncFactory(SyncFactorySpec spec) {
  if (spec.launched.world == 1 && !spec.elastic) return localSync();
  return [spec](std::shared_ptr<torch::nn::Module> model,
                const comm::Settings& job) -> std::unique_ptr<comm::GradientSync> {
    const DistSpec& dist = spec.dist;
    const StoreAddress& address = spec.address;
    const std::shared_ptr<comm::Timeline>& timeline = spec.timeline;
    const std::shared_ptr<ElasticJob>& elastic = spec.elastic;
    const comm::WorldInfo world = elastic ? elastic->generation().world() : spec.launched;
    if (world.world == 1) return std::make_unique<comm::LocalSync>();
    // (A shared store has no address.)
    const auto [host, port] = spec.shared_store ? std::pair<std::string, int>{"127.0.0.1", 0}
                                                : parseHostPort(address.master);
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(dist.timeout_s * 1000));
    comm::TransportSpec ts;
    ts.world = world;
    ts.timeout = timeout;
    // --streams auto: the tuner picks among 1, 2, 4 channels (2 without it).
    ts.channels = dist.streams > 0 ? dist.streams : (dist.dp.autotune ? 4 : 2);
    ts.timeline = timeline;
    if (world.rank == 0) ts.log = [](const std::string& line) { LOG(INFO) << line; };
    if (!dist.bind_host.empty()) {
      ts.bind_host = dist.bind_host;
    } else if (!comm::isLoopbackHost(host)) {
      ts.bind_host = localAddressToward(host);  // the interface that reaches the master
    }
    ts.gpu = dist.gpus > 0;
    if (ts.gpu) ts.device = gpuForLocalRank(world.local_rank, static_cast<int>(torch::cuda::device_count()));
    ts.shm = dist.shm;
    ts.hierarchical = dist.hierarchical;
    ts.ranks_per_node = dist.ranks_per_node;
    // Two-level auto between nodes: the tuner chooses (or it is on when the tuner is off).
    ts.tune_two_level = dist.hierarchical == comm::TwoLevelMode::kAuto && dist.dp.autotune;
    comm::ProcessGroupOptions pg;
    pg.transports = ts;
    pg.store.host = host;
    pg.store.port = port;
    pg.store.port_tries = address.ports;
    pg.store.rank = world.rank;
    pg.store.world = world.world;
    pg.store.timeout = timeout;
    pg.store.prefix = address.key_prefix;
    if (elastic) {
      pg.store.prefix += "/" + elastic->generation().prefix();  // each generation its own keys,
      pg.store.key_log = elastic->keyLog();                     // deleted once the next has formed
    }
    pg.store.client_only = address.agent_hosted;
    pg.shared_store = spec.shared_store;
    pg.store.job = address.job;
    // Ranks started with different options or data stop there, all of them, naming the option.
    pg.settings = job;
    for (auto& x : distSettings(dist, world)) pg.settings.push_back(std::move(x));
    // The library's own set-up (comm/process_group.h): the layout checked on every rank before
    // the rendezvous, the store, the agreement, the transports.
    comm::ProcessGroup group = comm::connectProcessGroup(pg);
    *spec.keep = group.store;
    const comm::Transports& transports = group.transports;
    if (world.rank == 0) LOG(INFO) << "communication: " << transports.why;
    comm::DataParallelOptions dp = dist.dp;  // the flags' and the AIACC_* variables'
    // A generation with survivors restores from its rank 0 right after (Trainer's
    // restoreFromRank0): every rank's hash of its parameters and momentum is compared with rank
    // 0's there, and the whole state goes to every rank only when one differs (a joiner always
    // does). A broadcast here would send the model to every rank at every regroup (45 MiB for
    // resnet18) where it is usually in place already.
    dp.broadcast_parameters = !(elastic && elastic->generation().survivors() > 0);
    // The trainer finishes each step itself, after backward: it times the step and votes there.
    dp.finish_in_backward = false;
    dp.tune.try_two_level = transports.alternative != nullptr;
    dp.two_level = transports.alternative;
    dp.timeline = timeline;
    if (world.rank == 0) dp.log = [](const std::string& line) { LOG(INFO) << line; };
    return std::make_unique<comm::DataParallel>(model, transports.primary, world, dp);
  };
}

}  // namespace aiacc::app
