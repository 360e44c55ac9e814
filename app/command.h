// What aiacc_train's commands share (app/main.cc dispatches to them): the options of a run,
// parsed once, and the one-line error and exit code of a command that failed.
//   tools   --make-sample, --convert-weights            app/command_tools.h
//   server  --rendezvous-server                         app/launcher.h (serveRendezvous)
//   launch  --nproc N (and the nodes of a job)          app/command_launch.h
//   train   one rank, or the single process             app/command_train.h
#pragma once

#include <exception>

#include "app/config.h"
#include "app/flags.h"
#include "app/launch_env.h"

namespace aiacc::app {

// The options of a run and who started this process (torchrun, Kubeflow, srun, mpirun,
// horovodrun, our own launcher, or nobody) and what that makes it: a single process, a launcher,
// or one rank. The store server of a job is no rank of it, whatever launched it (a batch script,
// say): with --rendezvous-server, launch_env and plan stay empty.
struct RunOptions {
  Recipe recipe;
  DistSpec dist;
  Config config;
  LaunchEnv launch_env;
  LaunchPlan plan;
};

// Parsed once, from the flags and the environment, before anything starts (the launcher checks
// them for its workers): InputError for a bad value, an incomplete set of launcher variables or
// a flag that contradicts them (a usage error).
RunOptions runOptionsFromFlags();

}  // namespace aiacc::app
