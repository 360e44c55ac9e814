// aiacc_train as one rank of a job, or as the single process of one: an elastic job's membership
// (--nnodes MIN:MAX), the communication set-up, the trainer, the report. Every way the run can end
// is an exit code (app/exit_code.h): finished, stopped by a signal (saved or not), a survivor's
// stop (ranks lost below MIN, the store gone), a process started after its elastic job ended, an
// error.
#pragma once

#include <chrono>

#include "app/command.h"

namespace aiacc::app {

// Trains as o.plan says (role kWorker or kSingle); `start`: when the process started (the
// report's time to target counts from it). Returns the exit code; says the ending in one line.
int runWorker(const RunOptions& o, std::chrono::steady_clock::time_point start);

}  // namespace aiacc::app
