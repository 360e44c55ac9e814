#include "app/command_train.h"

#include <glog/logging.h>
#include <signal.h>

#include <torch/cuda.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/membership.h"
#include "aiacc/comm/process_group.h"
#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "app/binary_hooks.h"
#include "app/elastic.h"
#include "app/exit_code.h"
#include "app/job_settings.h"
#include "app/report.h"
#include "app/run_records.h"
#include "app/stop_signal.h"
#include "app/trainer.h"

namespace aiacc::app {

namespace {

// The rendezvous store, kept for the whole job (rank 0 hosts it): a process of another job
// that reaches the port later is refused with a message instead of timing out as it connects.
using StoreSlot = std::shared_ptr<c10::intrusive_ptr<c10d::Store>>;

// World size 1: LocalSync. Otherwise: rendezvous through the TCPStore (rank 0's, or torchrun's
// agent's), the agreement of every rank's settings, the transports, and DataParallel around
// the model.
// An elastic job: each call makes the current generation's (its world, its key prefix).
SyncFactory makeSyncFactory(const comm::WorldInfo& launched, const DistSpec& dist, const StoreAddress& address,
                            std::shared_ptr<comm::Timeline> timeline, StoreSlot keep,
                            std::shared_ptr<ElasticJob> elastic) {
  if (launched.world == 1 && !elastic) return localSync();
  return [launched, dist, address, timeline, keep,
          elastic](std::shared_ptr<torch::nn::Module> model,
                   const comm::Settings& job) -> std::unique_ptr<comm::GradientSync> {
    const comm::WorldInfo world = elastic ? elastic->generation().world() : launched;
    if (world.world == 1) return std::make_unique<comm::LocalSync>();
    const auto [host, port] = parseHostPort(address.master);
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
    pg.store.job = address.job;
    // Ranks started with different options or data stop there, all of them, naming the option.
    pg.settings = job;
    for (auto& x : distSettings(dist, world)) pg.settings.push_back(std::move(x));
    // The library's own set-up (comm/process_group.h): the layout checked on every rank before
    // the rendezvous, the store, the agreement, the transports.
    comm::ProcessGroup group = comm::connectProcessGroup(pg);
    *keep = group.store;
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

// The folders of the files rank 0 writes, made before anything trains: a folder found missing
// only at the end would lose a finished run's report, trace or weights.
void makeOutputFolders(const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    const std::filesystem::path dir = std::filesystem::path(f).parent_path();
    if (f.empty() || dir.empty()) continue;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    AIACC_CHECK_INPUT(!ec, "cannot create the folder of '", f, "': ", ec.message());
  }
}

// After a stop request: one line (rank 0) naming the saved step and how to go on, or each other
// rank's line; how the process ended: saved (exit 75) when rank 0 wrote the stop's checkpoint
// (every rank knows: Report::saved_step), else stopped by the signal with nothing saved.
Ending preemptedEnd(const Report& r, const Config& c, int rank) {
  const std::string by = r.stop_signal != 0 ? signalName(r.stop_signal) : "a stop request on another rank";
  const bool saved = r.saved_step >= 0;
  const std::string unsaved = c.checkpoint_dir.empty() ? "no --checkpoint-dir" : "the checkpoint write failed";
  if (rank != 0) {  // each rank says where it stopped: the same step on every rank
    std::cerr << "aiacc_train: rank " << rank << " stopped by " << by << " after step " << r.steps
              << (saved ? " (rank 0 saved the checkpoint)\n" : " (nothing saved: " + unsaved + ")\n");
  } else if (saved) {
    std::cerr << "aiacc_train: stopped by " << by << " after step " << r.steps << "; saved " << r.checkpoint
              << "; run the same command with --resume auto to continue\n";
  } else {
    std::cerr << "aiacc_train: stopped by " << by << " after step " << r.steps << "; nothing saved (" << unsaved
              << ")\n";
  }
  Ending e{Ending::How::kStopped};
  e.saved = saved;
  e.signal = r.stop_signal != 0 ? r.stop_signal : SIGTERM;  // (another rank's: the launchers' usual)
  return e;
}

// A process of an elastic job that ended (comm::JobEnded) before it was let in: its line, and
// its code as the job ended (endingOf).
int endedWithoutThisProcess(const comm::JobEnded& ended) {
  if (ended.how == comm::JobEnd::kFailed) {
    std::cerr << "aiacc_train: error: " << ended.what << "; nothing left to join\n";
  } else {
    std::cerr << "aiacc_train: " << ended.what << "; nothing left to do"
              << (ended.how == comm::JobEnd::kStopped
                      ? " (its survivors saved its state: run the job again with --resume auto to continue)"
                  : ended.how == comm::JobEnd::kStoppedUnsaved ? " (nothing of its state was saved)"
                                                               : "")
              << "\n";
  }
  return exitCode(endingOf(ended.how));
}

}  // namespace

int runWorker(const RunOptions& o, std::chrono::steady_clock::time_point start) {
  const DistSpec& dist = o.dist;
  const LaunchPlan& plan = o.plan;
  const Config& config = o.config;
  // An elastic job's membership (--nnodes MIN:MAX), once joined. A worker that ends with an error
  // says so in the store (failElastic): once every rank of its generation has (the error is
  // everyone's: settings, data, build), the job has ended, and node 0's launcher stops serving the
  // store instead of waiting --rdzv-timeout; one rank's own error leaves the others going on.
  std::shared_ptr<ElasticJob> elastic;
  // (A survivor that stops below MIN says so: another survivor still waiting then stops as it did,
  // resumable, and saves what it holds if it claims the save first; comm/membership.h.)
  auto endElastic = [&](comm::JobEnd how) {
    try {
      if (elastic) elastic->markEnded(how);
    } catch (const std::exception&) {  // the store is gone already: nothing to tell
    }
  };
  try {
    // An elastic job: the world is the membership's first generation (or, for a process started
    // later, the generation it joins), not the launcher's.
    if ((dist.elastic() || plan.min_nodes > 0) && plan.role == LaunchPlan::Role::kWorker) {
      // (Held only once joined: a process whose first join failed is in no generation, and
      // says nothing of the job's end in the store.)
      std::shared_ptr<ElasticJob> job = makeElasticJob(dist, plan);
      if (std::optional<comm::JobEnded> ended = job->start()) return endedWithoutThisProcess(*ended);
      elastic = std::move(job);
    }
    const comm::WorldInfo world = elastic ? elastic->generation().world() : plan.world;
    if (world.rank == 0 && plan.source != LaunchSource::kNone && plan.source != LaunchSource::kAiacc) {
      LOG(INFO) << "launched by " << sourceName(plan.source) << ": " << world.world << " ranks, " << world.local_size
                << " per node, store at " << plan.store.master
                << (plan.store.agent_hosted ? " (hosted by the launcher's agent)" : " (hosted by rank 0)");
    }
    // From here a stop signal only sets a flag: the ranks agree on a step and stop there.
    installStopSignalHandlers();
    if (world.rank == 0) {
      makeOutputFolders({config.report_file, config.metrics_file, config.save_weights, dist.timeline});
    }
    std::shared_ptr<comm::Timeline> timeline;
    if (!dist.timeline.empty() && world.rank == 0) timeline = std::make_shared<comm::Timeline>(dist.timeline);
    auto store = std::make_shared<c10::intrusive_ptr<c10d::Store>>();
    Trainer trainer(config, world, makeSyncFactory(world, dist, plan.store, timeline, store, elastic), start);
    trainer.setTimeline(timeline);
    if (elastic) trainer.setElastic(elastic);
    {
      const TestHooks hooks = hooksOfThisBinary();  // none but in aiacc_train_hooked
      trainer.setTestHooks(hooks);
      if (world.rank == 0) {
        for (const std::string& note : hooks.notes) LOG(WARNING) << note;
      }
      // A rank lost in a job of fixed size: the survivor that claims it first saves its state (the
      // job's one election, comm::claimSave; such a job is generation 0 for good).
      if (hooks.survivor_save) {
        trainer.setSurvivorClaim([store] { return *store && comm::claimSave(**store, 0); });
      }
    }
    Report report = trainer.run();
    if (report.job_ended) return endedWithoutThisProcess(*report.job_ended);
    // Ranks lost (a job of fixed size; an elastic regroup below MIN, failed twice, or without its
    // store): this rank's line and exit code. (A --timeline is written by its destructor.)
    if (const std::optional<SurvivorStop>& stop = report.survivor_stop) {
      endElastic(stop->onDisk() ? comm::JobEnd::kStopped : comm::JobEnd::kStoppedUnsaved);
      std::cerr << "aiacc_train: " << stop->why() << "; stopped; "
                << (stop->checkpoint().empty()
                        ? stop->unsaved()
                        : "saved " + stop->checkpoint() + "; run the job again with --resume auto to continue")
                << "\n";
      Ending end{Ending::How::kStopped};
      end.saved = stop->onDisk();
      return exitCode(end);
    }
    if (timeline) timeline->flush();
    // (The store may be gone while every rank lived on: the job's end is its report all the same.)
    if (elastic && elastic->generation().rank == 0) {
      endElastic(jobEndOf(report.preempted, report.saved_step));
    }
    const int final_rank = elastic ? elastic->generation().rank : world.rank;  // (an elastic job's may change)
    if (report.preempted) return exitCode(preemptedEnd(report, config, final_rank));
    if (final_rank == 0) {
      printReport(report, std::cout);
      if (!config.report_file.empty()) {
        aiacc::writeFileAtomic(config.report_file, reportJson(report, config) + "\n");
        writeRunRecords(config.report_file, report, config.resolved_flags, config.given_flags);
      }
      if (!config.dawnbench_dir.empty()) writeDawnbench(config.dawnbench_dir, report, config);
    }
    // A run that missed its target finished all the same: the report says so.
    return exitCode(Ending{Ending::How::kFinished});
  } catch (...) {  // an error: said in the store (see above), then on stderr
    try {
      if (elastic) elastic->markFailed();
    } catch (const std::exception&) {  // the store is gone already: nothing to tell
    }
    return errorExit(std::current_exception());
  }
}

}  // namespace aiacc::app
