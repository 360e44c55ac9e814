// aiacc_train: trains ResNet v1.5 on an ImageNet-layout folder and reports time to a target
// accuracy, DAWNBench style. This file only dispatches, after the flags are read, to one of
// aiacc_train's commands (app/command.h): a tool (sample dataset, weights conversion), the
// rendezvous store server, the launcher, or a worker that trains.
#include <glog/logging.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "aiacc/common/error.h"
#include "app/cli.h"
#include "app/command.h"
#include "app/command_launch.h"
#include "app/command_tools.h"
#include "app/command_train.h"
#include "app/dry_run.h"
#include "app/exit_code.h"
#include "app/flags.h"
#include "app/heap.h"
#include "app/launcher.h"
#include "app/worker_end.h"

int main(int argc, char** argv) {
  using namespace aiacc::app;
  setUpProcess();  // before any thread starts
  const auto start = std::chrono::steady_clock::now();
  // Line-buffered even into a pipe: a launcher (ours, torchrun) shows each line when it is written.
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "-help")) {
      printHelp(argv[0]);
      return 0;
    }
  }
  const std::vector<std::string> rest = parseCommandLine(argc, argv,
                                                         "trains ResNet v1.5 to a target accuracy; see --help");
  if (rest.size() > 1) {
    std::cerr << "aiacc_train: error: unexpected argument '" << rest[1] << "' (flags start with --; see --help)\n";
    return kExitUsage;
  }
  if (keepFreedMemoryFlag() && !aiacc::keepFreedMemoryInHeap()) {
    LOG(WARNING) << "--keep-freed-memory: not supported by this C library; using its defaults";
  }
  try {
    const bool dry_run = dryRunFlag();
    if (toolRequested()) return runTool(dry_run);
    RunOptions options;
    try {
      options = runOptionsFromFlags();
    } catch (const aiacc::InputError& e) {
      std::cerr << "aiacc_train: error: " << e.what() << "\n";
      return exitCode(Ending{Ending::How::kUsage});
    }
    const DistSpec& dist = options.dist;
    if (dry_run) {
      std::cout << (dist.rendezvous_server
                        ? "aiacc_train --dry-run: would serve the rendezvous store at " + dist.launch.master + "\n"
                        : describeRun(options.plan, dist, options.config));
      return 0;
    }
    if (dist.rendezvous_server) {
      return serveRendezvous(dist.launch.master,
                             std::chrono::milliseconds(static_cast<int64_t>(dist.timeout_s * 1000)));
    }
    runAsJobStepIfUnderABatchShell(options.launch_env, options.plan, argc, argv);
    if (options.plan.role == LaunchPlan::Role::kSpawn) return runLauncher(options, argc, argv);
    return runWorker(options, start);
  } catch (...) {
    return errorExit(std::current_exception(), std::cerr);
  }
}
