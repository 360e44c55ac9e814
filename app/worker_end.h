// How a worker of aiacc_train ends (runWorker, app/command_train.cc; tests/elastic_threads.cc
// with ranks as threads): its line, rank 0's report, the job's end recorded in an elastic job's
// store, and the exit code (app/exit_code.h), from the Trainer's Report or from the error that
// ended it.
#pragma once

#include <exception>
#include <ostream>

#include "aiacc/comm/job_end.h"
#include "app/config.h"
#include "app/report.h"

namespace aiacc::app {

class ElasticJob;

// From the Report of Trainer::run: an elastic job that ended without this process
// (Report::job_ended), a survivor's stop (Report::survivor_stop; recorded as the job's end, saved
// or not), a stop request (Report::preempted), or the end of the run (rank 0 prints the report to
// `out` and writes Config's report files). Lines go to `err`. `rank`: this process's rank in the
// launcher's world (an elastic job's final rank comes from `elastic`, null for a job of fixed
// size). Returns the exit code.
int endOfRun(const Report& report, const Config& config, ElasticJob* elastic, int rank, std::ostream& out,
             std::ostream& err);

// A process of an elastic job that ended (comm::JobEnded) before it was let in: its line on
// `err`, and its code as the job ended (endingOf).
int endedWithoutThisProcess(const comm::JobEnded& ended, std::ostream& err);

// A worker that `error` ended: said in an elastic job's store (ElasticJob::markFailed; null: a
// job of fixed size), then errorExit.
int endWithError(const std::exception_ptr& error, ElasticJob* elastic, std::ostream& err);

// The exit code of a command that threw `error` (1, app/exit_code.h), said in one line on `err`:
// an aiacc::Error's message (a CommError's with the flag that sets what it names), or anything
// else's first line as an internal error. (A bad option is a usage error only where
// runOptionsFromFlags finds it.) Every command of aiacc_train ends so on an error.
int errorExit(const std::exception_ptr& error, std::ostream& err);

}  // namespace aiacc::app
