// aiacc_train as a launcher (--nproc N, and the nodes of a job with --nnodes): it starts this
// node's workers and reports the job's end (app/launcher.h); and, first, the one thing every
// non-server run does under a Slurm batch script's shell: run itself as a job step.
#pragma once

#include "app/command.h"

namespace aiacc::app {

// A batch script's aiacc_train run by its shell starts itself again as a job step (srun), which
// Slurm's cancel and the job's end stop with SIGTERM (app/launch_env.h: batchScriptWarning,
// srunAsJobStep): exec's and does not return. Returns where it does not apply, or (having said
// so) where srun cannot run, and then stops on its shell's death.
void runAsJobStepIfUnderABatchShell(const LaunchEnv& env, const LaunchPlan& plan, int argc, char** argv);

// Starts this node's workers with the same command line (argv) and waits for the job: its exit
// code (app/launcher.h). For plan.role == kSpawn.
int runLauncher(const RunOptions& o, int argc, char** argv);

}  // namespace aiacc::app
