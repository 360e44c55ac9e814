#include "app/command_train.h"

#include <glog/logging.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aiacc/comm/membership.h"
#include "aiacc/common/error.h"
#include "app/binary_hooks.h"
#include "app/elastic.h"
#include "app/exit_code.h"
#include "app/report.h"
#include "app/stop_signal.h"
#include "app/sync_factory.h"
#include "app/trainer.h"
#include "app/worker_end.h"

namespace aiacc::app {

namespace {

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

}  // namespace

int runWorker(const RunOptions& o, std::chrono::steady_clock::time_point start) {
  const DistSpec& dist = o.dist;
  const LaunchPlan& plan = o.plan;
  const Config& config = o.config;
  // An elastic job's membership (--nnodes MIN:MAX), once joined. A worker that ends with an error
  // says so in the store (markFailed): once every rank of its generation has (the error is
  // everyone's: settings, data, build), the job has ended, and node 0's launcher stops serving the
  // store instead of waiting --rdzv-timeout; one rank's own error leaves the others going on.
  std::shared_ptr<ElasticJob> elastic;
  try {
    // An elastic job: the world is the membership's first generation (or, for a process started
    // later, the generation it joins), not the launcher's.
    if ((dist.elastic() || plan.min_nodes > 0) && plan.role == LaunchPlan::Role::kWorker) {
      // (Held only once joined: a process whose first join failed is in no generation, and
      // says nothing of the job's end in the store.)
      std::shared_ptr<ElasticJob> job = makeElasticJob(dist, plan);
      if (std::optional<comm::JobEnded> ended = job->start()) return endedWithoutThisProcess(*ended, std::cerr);
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
    SyncFactorySpec sync;
    sync.launched = world;
    sync.dist = dist;
    sync.address = plan.store;
    sync.timeline = timeline;
    sync.elastic = elastic;
    const StoreSlot store = sync.keep;
    Trainer trainer(config, world, makeSyncFactory(std::move(sync)), start);
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
    const Report report = trainer.run();
    // (A survivor's stop leaves the --timeline to its destructor.)
    if (timeline && !report.survivor_stop && !report.job_ended) timeline->flush();
    return endOfRun(report, config, elastic.get(), world.rank, std::cout, std::cerr);
  } catch (...) {  // an error: said in the store (see above), then on stderr
    return endWithError(std::current_exception(), elastic.get(), std::cerr);
  }
}

}  // namespace aiacc::app
