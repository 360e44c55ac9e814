// Stop requests from outside: the signals a cluster sends before it takes a node away
// (Kubernetes and Slurm: SIGTERM, then SIGKILL after a grace period; Slurm's --signal=USR1@T: a
// warning T seconds earlier; a user's Ctrl-C: SIGINT).
//
// The handler only records the first such signal's number (an atomic store: async-signal-safe);
// the training loop polls it at step boundaries and the ranks agree on one stop step
// (comm::GradientSync::voteFlags), then save a checkpoint and exit with kExitPreempted (75, app/launcher.h). Nothing
// else happens in the handler, so a signal during a collective, an evaluation or a checkpoint
// write is never lost and never interrupts them.
//
// The recorded number is the one piece of process-wide state here: a signal handler has nowhere
// else to put it.
#pragma once

#include <functional>
#include <string>

namespace aiacc::app {

// Installs the handler for SIGTERM, SIGINT and SIGUSR1 (SA_RESTART: interrupted system calls
// resume). Call once, in the worker process, before training starts.
void installStopSignalHandlers();

// Asks the kernel for SIGUSR1 when this process's parent dies (PR_SET_PDEATHSIG), at once when it
// died already: a Slurm batch script's shell killed by Slurm's signal then stops this process as
// a stop signal does, saving its step, instead of leaving it to train on outside the job. SIGUSR1,
// not SIGTERM: a launcher that a cancel sent SIGTERM already takes the same signal again as
// "kill now" (app/launcher.h), and another kind as one more stop request within the grace period.
void stopWhenParentDies();

// The first stop signal received since installStopSignalHandlers (0: none).
int stopSignalReceived();

// What the trainer polls: the signal number of a stop request, 0 while there is none. Tests
// inject their own (a request at a chosen step); aiacc_train passes stopSignalReceived.
using StopRequest = std::function<int()>;

// "SIGTERM", "SIGINT", "SIGUSR1", else "signal N".
std::string signalName(int sig);

}  // namespace aiacc::app
