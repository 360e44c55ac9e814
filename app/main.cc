// aiacc_train: trains ResNet v1.5 on an ImageNet-layout folder and reports time to a target
// accuracy, DAWNBench style. Reads top-down: flags -> (sample generation | launcher) -> worker:
// communication set-up -> trainer -> report.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <torch/cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

#include "app/cli.h"
#include "app/dry_run.h"
#include "app/elastic.h"
#include "app/exit_code.h"
#include "app/flags.h"
#include "app/heap.h"
#include "app/job_settings.h"
#include "app/launch_env.h"
#include "app/launcher.h"
#include "app/option_names.h"
#include "app/report.h"
#include "app/run_records.h"
#include "app/stop_signal.h"
#include "app/binary_hooks.h"
#include "app/trainer.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/membership.h"
#include "aiacc/comm/process_group.h"
#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "models/torch_format.h"
#include "data/sample_gen.h"

namespace {

// The rendezvous store, kept for the whole job (rank 0 hosts it): a process of another job
// that reaches the port later is refused with a message instead of timing out as it connects.
using StoreSlot = std::shared_ptr<c10::intrusive_ptr<c10d::Store>>;

// World size 1: LocalSync. Otherwise: rendezvous through the TCPStore (rank 0's, or torchrun's
// agent's), the agreement of every rank's settings, the transports, and DataParallel around
// the model.
// An elastic job: each call makes the current generation's (its world, its key prefix).
aiacc::app::SyncFactory makeSyncFactory(const aiacc::comm::WorldInfo& launched, const aiacc::app::DistSpec& dist,
                                        const aiacc::app::StoreAddress& address,
                                        std::shared_ptr<aiacc::comm::Timeline> timeline, StoreSlot keep,
                                        std::shared_ptr<aiacc::app::ElasticJob> elastic) {
  if (launched.world == 1 && !elastic) return aiacc::app::localSync();
  return [launched, dist, address, timeline, keep,
          elastic](std::shared_ptr<torch::nn::Module> model,
                   const aiacc::comm::Settings& job) -> std::unique_ptr<aiacc::comm::GradientSync> {
    const aiacc::comm::WorldInfo world = elastic ? elastic->generation().world() : launched;
    if (world.world == 1) return std::make_unique<aiacc::comm::LocalSync>();
    const auto [host, port] = aiacc::app::parseHostPort(address.master);
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(dist.timeout_s * 1000));
    aiacc::comm::TransportSpec ts;
    ts.world = world;
    ts.timeout = timeout;
    // --streams auto: the tuner picks among 1, 2, 4 channels (2 without it).
    ts.channels = dist.streams > 0 ? dist.streams : (dist.dp.autotune ? 4 : 2);
    ts.timeline = timeline;
    if (world.rank == 0) ts.log = [](const std::string& line) { LOG(INFO) << line; };
    if (!dist.bind_host.empty()) {
      ts.bind_host = dist.bind_host;
    } else if (!aiacc::comm::isLoopbackHost(host)) {
      ts.bind_host = aiacc::app::localAddressToward(host);  // the interface that reaches the master
    }
    ts.gpu = dist.gpus > 0;
    if (ts.gpu)
      ts.device = aiacc::app::gpuForLocalRank(world.local_rank, static_cast<int>(torch::cuda::device_count()));
    ts.shm = dist.shm;
    ts.hierarchical = dist.hierarchical;
    ts.ranks_per_node = dist.ranks_per_node;
    // Two-level auto between nodes: the tuner chooses (or it is on when the tuner is off).
    ts.tune_two_level = dist.hierarchical == aiacc::comm::TwoLevelMode::kAuto && dist.dp.autotune;
    aiacc::comm::ProcessGroupOptions pg;
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
    for (auto& x : aiacc::app::distSettings(dist, world)) pg.settings.push_back(std::move(x));
    // The library's own set-up (comm/process_group.h): the layout checked on every rank before
    // the rendezvous, the store, the agreement, the transports.
    aiacc::comm::ProcessGroup group = aiacc::comm::connectProcessGroup(pg);
    *keep = group.store;
    const aiacc::comm::Transports& transports = group.transports;
    if (world.rank == 0) LOG(INFO) << "communication: " << transports.why;
    aiacc::comm::DataParallelOptions dp = dist.dp;  // the flags' and the AIACC_* variables'
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
    return std::make_unique<aiacc::comm::DataParallel>(model, transports.primary, world, dp);
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
aiacc::app::Ending preemptedEnd(const aiacc::app::Report& r, const aiacc::app::Config& c, int rank) {
  const std::string by = r.stop_signal != 0 ? aiacc::app::signalName(r.stop_signal) : "a stop request on another rank";
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
  aiacc::app::Ending e{aiacc::app::Ending::How::kStopped};
  e.saved = saved;
  e.signal = r.stop_signal != 0 ? r.stop_signal : SIGTERM;  // (another rank's: the launchers' usual)
  return e;
}

// The name of this process's parent (/proc/PPID/comm), "" when it cannot be read.
std::string parentProcessName() {
  std::ifstream comm("/proc/" + std::to_string(::getppid()) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

// The path of what /proc/self/<link> names, or "" ("fd/1": standard output, "" unless a regular file).
std::string linkOf(const std::string& link, bool regular_file) {
  std::error_code ec;
  const std::filesystem::path path = std::filesystem::read_symlink("/proc/self/" + link, ec);
  if (ec || (regular_file && !std::filesystem::is_regular_file(path, ec))) return "";
  return path.string();
}

// A batch script's aiacc_train run by its shell starts itself again as a job step (srun), which
// Slurm's cancel and the job's end stop with SIGTERM (app/launch_env.h: batchScriptWarning, srunAsJobStep);
// returns only where it does not, having said so, and then stops on its shell's death.
void runAsJobStepIfUnderABatchShell(const aiacc::app::LaunchEnv& env, const aiacc::app::LaunchPlan& plan, int argc,
                                    char** argv) {
  if (!env.slurm_batch) return;
  const std::string parent = parentProcessName();
  const std::string warning = aiacc::app::batchScriptWarning(env, parent, false);
  if (warning.empty()) return;
  const aiacc::app::JobStep step = aiacc::app::srunAsJobStep(env, plan, parent, aiacc::app::currentEnvironment(),
                                                             linkOf("exe", false),
                                                             std::vector<std::string>(argv + 1, argv + argc),
                                                             linkOf("fd/1", true), linkOf("fd/2", true));
  if (step.argv.empty()) {
    std::cerr << "aiacc_train: warning: " << warning << "\n";
  } else {
    std::cerr << "aiacc_train: warning: " << aiacc::app::batchScriptWarning(env, parent, true) << "\n";
    std::cout.flush();
    std::cerr.flush();
    for (const std::string& name : step.unset) ::unsetenv(name.c_str());
    std::vector<char*> args;
    for (const std::string& a : step.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::cerr << "aiacc_train: warning: cannot run srun (" << std::strerror(errno)
              << "): going on under the shell, which proctrack/cgroup kills unsaved with it; put srun on PATH, or "
                 "`exec aiacc_train ...` in the script\n";
  }
  // Should Slurm's signal kill the script's shell, this process stops as signalled
  // (app/stop_signal.h). (Slurm names a batch script's shell slurm_script.)
  if (parent == "slurm_script") aiacc::app::stopWhenParentDies();
}

}  // namespace

int main(int argc, char** argv) {
  aiacc::app::setUpProcess();  // before any thread starts
  const auto start = std::chrono::steady_clock::now();
  // Line-buffered even into a pipe: a launcher (ours, torchrun) shows each line when it is written.
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "-help")) {
      aiacc::app::printHelp(argv[0]);
      return 0;
    }
  }
  const std::vector<std::string> rest =
      aiacc::app::parseCommandLine(argc, argv, "trains ResNet v1.5 to a target accuracy; see --help");
  if (rest.size() > 1) {
    std::cerr << "aiacc_train: error: unexpected argument '" << rest[1] << "' (flags start with --; see --help)\n";
    return aiacc::app::kExitUsage;
  }
  if (aiacc::app::keepFreedMemoryFlag() && !aiacc::keepFreedMemoryInHeap()) {
    LOG(WARNING) << "--keep-freed-memory: not supported by this C library; using its defaults";
  }
  // An elastic job's membership (--nnodes MIN:MAX), once joined. A worker that ends with an error
  // says so in the store (failElastic): once every rank of its generation has (the error is
  // everyone's: settings, data, build), the job has ended, and node 0's launcher stops serving the
  // store instead of waiting --rdzv-timeout; one rank's own error leaves the others going on.
  std::shared_ptr<aiacc::app::ElasticJob> elastic;
  // (A survivor that stops below MIN says so: another survivor still waiting then stops as it did,
  // resumable, and saves what it holds if it came first; comm/membership.h.)
  auto endElastic = [&](aiacc::comm::JobEnd how) {
    try {
      if (elastic) elastic->markEnded(how);
    } catch (const std::exception&) {  // the store is gone already: nothing to tell
    }
  };
  auto failElastic = [&] {
    try {
      if (elastic) elastic->markFailed();
    } catch (const std::exception&) {  // the store is gone already: nothing to tell
    }
  };
  try {
    const bool dry_run = aiacc::app::dryRunFlag();
    if (!aiacc::app::makeSampleFlag().empty()) {
      const aiacc::data::SampleSpec spec = aiacc::app::sampleSpecFromFlags();
      if (dry_run) {
        std::cout << "aiacc_train --dry-run: would write the sample dataset to " << aiacc::app::makeSampleFlag()
                  << "\n";
        return 0;
      }
      aiacc::data::makeSampleDataset(aiacc::app::makeSampleFlag(), spec);
      std::cout << "wrote sample dataset to " << aiacc::app::makeSampleFlag() << " (" << spec.classes << " classes, "
                << spec.train_per_class << " train + " << spec.val_per_class << " val images per class)\n";
      return 0;
    }
    if (const auto [in, out] = aiacc::app::convertWeightsFlags(); !in.empty()) {
      if (out.empty()) {
        std::cerr << "aiacc_train: error: --convert-weights needs --save-weights OUT (the file to write)\n";
        return exitCode(aiacc::app::Ending{aiacc::app::Ending::How::kUsage});
      }
      if (dry_run) {
        std::cout << "aiacc_train --dry-run: would convert " << in << " to " << out << "\n";
        return 0;
      }
      const size_t n = aiacc::models::convertWeightsFile(in, out);
      std::cout << "wrote " << n << " tensors from " << in << " to " << out << "\n";
      return 0;
    }
    // The options, and who started this process (torchrun, Kubeflow, srun, mpirun, horovodrun, our
    // own launcher, or nobody) and what that makes it: a single process, a launcher, or one rank.
    // Parsed once before anything starts (the launcher checks them for its workers): a bad value,
    // an incomplete set of launcher variables or a flag that contradicts them is a usage error.
    struct Options {
      aiacc::app::Recipe recipe;
      aiacc::app::DistSpec dist;
      aiacc::app::Config config;
      aiacc::app::LaunchEnv launch_env;
      aiacc::app::LaunchPlan plan;
    };
    std::optional<Options> options;
    try {
      aiacc::app::Recipe recipe = aiacc::app::applyRecipeFlag();  // before any option is built
      aiacc::app::DistSpec d = aiacc::app::distSpecFromFlags();
      aiacc::app::Config c = aiacc::app::configFromFlags(recipe);
      aiacc::app::LaunchEnv env;
      aiacc::app::LaunchPlan p;
      // The store server of a job is no rank of it, whatever launched it (a batch script, say).
      if (!d.rendezvous_server) {
        aiacc::app::requireData(c);
        env = aiacc::app::detectLaunch(aiacc::app::currentEnvironment());
        p = aiacc::app::planLaunch(env, d.launch_flags);
        AIACC_CHECK_INPUT(d.launch.max_restarts == 0 || p.role == aiacc::app::LaunchPlan::Role::kWorker ||
                              (p.role == aiacc::app::LaunchPlan::Role::kSpawn && p.spawn.min_nodes > 0),
                          "--max-restarts needs an elastic job (--nnodes MIN:MAX): without one a lost rank ends "
                          "the job");
      }
      options = Options{std::move(recipe), std::move(d), std::move(c), std::move(env), std::move(p)};
    } catch (const aiacc::InputError& e) {
      std::cerr << "aiacc_train: error: " << e.what() << "\n";
      return exitCode(aiacc::app::Ending{aiacc::app::Ending::How::kUsage});
    }
    const aiacc::app::DistSpec& dist = options->dist;
    if (dry_run) {
      std::cout << (dist.rendezvous_server
                        ? "aiacc_train --dry-run: would serve the rendezvous store at " + dist.launch.master + "\n"
                        : aiacc::app::describeRun(options->plan, dist, options->config));
      return 0;
    }
    if (dist.rendezvous_server) {
      return aiacc::app::serveRendezvous(dist.launch.master,
                                         std::chrono::milliseconds(static_cast<int64_t>(dist.timeout_s * 1000)));
    }
    const aiacc::app::LaunchEnv& launch_env = options->launch_env;
    const aiacc::app::LaunchPlan& plan = options->plan;
    runAsJobStepIfUnderABatchShell(launch_env, plan, argc, argv);
    if (plan.role == aiacc::app::LaunchPlan::Role::kSpawn) {
      if (dist.gpus > 0) aiacc::app::requireVisibleGpus(plan.spawn.nproc);
      aiacc::app::LaunchSpec spec = plan.spawn;
      spec.host_store = !spec.external_store;  // the rendezvous outlives any one worker
      spec.store_timeout = std::chrono::milliseconds(static_cast<int64_t>(dist.timeout_s * 1000));
      return aiacc::app::launchWorkers(spec, std::vector<std::string>(argv, argv + argc));
    }
    // An elastic job: the world is the membership's first generation (or, for a process started
    // later, the generation it joins), not the launcher's.
    if ((dist.elastic() || plan.min_nodes > 0) && plan.role == aiacc::app::LaunchPlan::Role::kWorker) {
      elastic = aiacc::app::startElasticJob(dist, plan);
    }
    const aiacc::comm::WorldInfo world = elastic ? elastic->generation().world() : plan.world;
    if (world.rank == 0 && plan.source != aiacc::app::LaunchSource::kNone &&
        plan.source != aiacc::app::LaunchSource::kAiacc) {
      LOG(INFO) << "launched by " << aiacc::app::sourceName(plan.source) << ": " << world.world << " ranks, "
                << world.local_size << " per node, store at " << plan.store.master
                << (plan.store.agent_hosted ? " (hosted by the launcher's agent)" : " (hosted by rank 0)");
    }
    const aiacc::app::Config& config = options->config;
    // From here a stop signal only sets a flag: the ranks agree on a step and stop there.
    aiacc::app::installStopSignalHandlers();
    if (world.rank == 0) {
      makeOutputFolders({config.report_file, config.metrics_file, config.save_weights, dist.timeline});
    }
    std::shared_ptr<aiacc::comm::Timeline> timeline;
    if (!dist.timeline.empty() && world.rank == 0) timeline = std::make_shared<aiacc::comm::Timeline>(dist.timeline);
    auto store = std::make_shared<c10::intrusive_ptr<c10d::Store>>();
    aiacc::app::Trainer trainer(config, world, makeSyncFactory(world, dist, plan.store, timeline, store, elastic),
                                start);
    trainer.setTimeline(timeline);
    if (elastic) trainer.setElastic(elastic);
    {
      const aiacc::app::TestHooks hooks = aiacc::app::hooksOfThisBinary();  // none but in aiacc_train_hooked
      trainer.setTestHooks(hooks);
      if (world.rank == 0) {
        for (const std::string& note : hooks.notes) LOG(WARNING) << note;
      }
      // A rank lost in a job of fixed size: the first survivor to add to this key saves its state.
      if (hooks.survivor_save) {
        trainer.setSurvivorClaim([store] { return *store && (*store)->add("survivor/writes", 1) == 1; });
      }
    }
    aiacc::app::Report report = trainer.run();
    if (timeline) timeline->flush();
    // (The store may be gone while every rank lived on: the job's end is its report all the same.)
    if (elastic && elastic->generation().rank == 0) {
      endElastic(aiacc::app::jobEndOf(report.preempted, report.saved_step));
    }
    const int final_rank = elastic ? elastic->generation().rank : world.rank;  // (an elastic job's may change)
    if (report.preempted) return exitCode(preemptedEnd(report, config, final_rank));
    if (final_rank == 0) {
      aiacc::app::printReport(report, std::cout);
      if (!config.report_file.empty()) {
        aiacc::writeFileAtomic(config.report_file, aiacc::app::reportJson(report, config) + "\n");
        aiacc::app::writeRunRecords(config.report_file, report, config.resolved_flags, config.given_flags);
      }
      if (!config.dawnbench_dir.empty()) aiacc::app::writeDawnbench(config.dawnbench_dir, report, config);
    }
    // A run that missed its target finished all the same: the report says so.
    return exitCode(aiacc::app::Ending{aiacc::app::Ending::How::kFinished});
  } catch (const aiacc::app::SurvivorStop& e) {  // ranks lost (elastic: below MIN, or the store gone)
    endElastic(e.onDisk() ? aiacc::comm::JobEnd::kStopped : aiacc::comm::JobEnd::kStoppedUnsaved);
    std::cerr << "aiacc_train: " << e.what() << "; stopped; "
              << (e.checkpoint().empty()
                      ? e.unsaved()
                      : "saved " + e.checkpoint() + "; run the job again with --resume auto to continue")
              << "\n";
    aiacc::app::Ending end{aiacc::app::Ending::How::kStopped};
    end.saved = e.onDisk();
    return exitCode(end);
  } catch (const aiacc::comm::JobEndedError& e) {  // a process started again after the elastic job's end
    // It ends as the job did: finished, stopped with its state saved (resumable), or not.
    const aiacc::comm::JobEnd how = e.how();
    std::cerr << "aiacc_train: " << e.what() << "; nothing left to do"
              << (how == aiacc::comm::JobEnd::kStopped
                      ? " (its survivors saved its state: run the job again with --resume auto to continue)"
                  : how == aiacc::comm::JobEnd::kStoppedUnsaved ? " (nothing of its state was saved)"
                                                                : "")
              << "\n";
    aiacc::app::Ending end{how == aiacc::comm::JobEnd::kFinished ? aiacc::app::Ending::How::kFinished
                                                                 : aiacc::app::Ending::How::kStopped};
    end.saved = how == aiacc::comm::JobEnd::kStopped;
    return exitCode(end);
  } catch (const aiacc::comm::JobFailedError& e) {  // started again into a job that failed on every rank
    std::cerr << "aiacc_train: error: " << e.what() << "; nothing left to join\n";
    return exitCode(aiacc::app::Ending{aiacc::app::Ending::How::kError});
  } catch (const aiacc::comm::CommError& e) {  // the library names the setting; this adds our flag for it
    failElastic();
    std::cerr << "aiacc_train: error: " << e.what() << aiacc::app::flagHint(e.remedy()) << "\n";
    return exitCode(aiacc::app::Ending{aiacc::app::Ending::How::kError});
  } catch (const aiacc::Error& e) {
    failElastic();
    std::cerr << "aiacc_train: error: " << e.what() << "\n";
    return exitCode(aiacc::app::Ending{aiacc::app::Ending::How::kError});
  } catch (const std::exception& e) {
    failElastic();
    std::cerr << "aiacc_train: internal error: " << aiacc::firstLine(e.what()) << "\n";
    return exitCode(aiacc::app::Ending{aiacc::app::Ending::How::kError});
  }
}
