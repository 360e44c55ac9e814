#include "app/command_launch.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "app/launcher.h"
#include "app/stop_signal.h"
#include "app/trainer.h"

namespace aiacc::app {

namespace {

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

}  // namespace

void runAsJobStepIfUnderABatchShell(const LaunchEnv& env, const LaunchPlan& plan, int argc, char** argv) {
  if (!env.slurm_batch) return;
  const std::string parent = parentProcessName();
  const std::string warning = batchScriptWarning(env, parent, false);
  if (warning.empty()) return;
  const JobStep step = srunAsJobStep(env, plan, parent, currentEnvironment(), linkOf("exe", false),
                                     std::vector<std::string>(argv + 1, argv + argc), linkOf("fd/1", true),
                                     linkOf("fd/2", true));
  if (step.argv.empty()) {
    std::cerr << "aiacc_train: warning: " << warning << "\n";
  } else {
    std::cerr << "aiacc_train: warning: " << batchScriptWarning(env, parent, true) << "\n";
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
  if (parent == "slurm_script") stopWhenParentDies();
}

int runLauncher(const RunOptions& o, int argc, char** argv) {
  if (o.dist.gpus > 0) requireVisibleGpus(o.plan.spawn.nproc);
  LaunchSpec spec = o.plan.spawn;
  spec.host_store = !spec.external_store;  // the rendezvous outlives any one worker
  spec.store_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.dist.timeout_s * 1000));
  return launchWorkers(spec, std::vector<std::string>(argv, argv + argc));
}

}  // namespace aiacc::app
