#include "app/worker_end.h"

#include <signal.h>

#include <optional>
#include <string>

#include "aiacc/comm/comm_error.h"
#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "app/elastic.h"
#include "app/exit_code.h"
#include "app/option_names.h"
#include "app/run_records.h"
#include "app/stop_signal.h"

namespace aiacc::app {

namespace {

// The job's end, in an elastic job's store (nothing for a job of fixed size).
void recordJobEnd(ElasticJob* elastic, comm::JobEnd how) {
  try {
    if (elastic) elastic->markEnded(how);
  } catch (const std::exception&) {  // the store is gone already: nothing to tell
  }
}

// After a stop request: one line (rank 0) naming the saved step and how to go on, or each other
// rank's line; how the process ended: saved (exit 75) when rank 0 wrote the stop's checkpoint
// (every rank knows: Report::saved_step), else stopped by the signal with nothing saved.
Ending preemptedEnd(const Report& r, const Config& c, int rank, std::ostream& err) {
  const std::string by = r.stop_signal != 0 ? signalName(r.stop_signal) : "a stop request on another rank";
  const bool saved = r.saved_step >= 0;
  const std::string unsaved = c.checkpoint_dir.empty() ? "no --checkpoint-dir" : "the checkpoint write failed";
  if (rank != 0) {  // each rank says where it stopped: the same step on every rank
    err << "aiacc_train: rank " << rank << " stopped by " << by << " after step " << r.steps
        << (saved ? " (rank 0 saved the checkpoint)\n" : " (nothing saved: " + unsaved + ")\n");
  } else if (saved) {
    err << "aiacc_train: stopped by " << by << " after step " << r.steps << "; saved " << r.checkpoint
        << "; run the same command with --resume auto to continue\n";
  } else {
    err << "aiacc_train: stopped by " << by << " after step " << r.steps << "; nothing saved (" << unsaved << ")\n";
  }
  Ending e{Ending::How::kStopped};
  e.saved = saved;
  e.signal = r.stop_signal != 0 ? r.stop_signal : SIGTERM;  // (another rank's: the launchers' usual)
  return e;
}

}  // namespace

int endedWithoutThisProcess(const comm::JobEnded& ended, std::ostream& err) {
  if (ended.how == comm::JobEnd::kFailed) {
    err << "aiacc_train: error: " << ended.what << "; nothing left to join\n";
  } else {
    err << "aiacc_train: " << ended.what << "; nothing left to do"
        << (ended.how == comm::JobEnd::kStopped
                ? " (its survivors saved its state: run the job again with --resume auto to continue)"
            : ended.how == comm::JobEnd::kStoppedUnsaved ? " (nothing of its state was saved)"
                                                         : "")
        << "\n";
  }
  return exitCode(endingOf(ended.how));
}

int endOfRun(const Report& report, const Config& config, ElasticJob* elastic, int rank, std::ostream& out,
             std::ostream& err) {
  if (report.job_ended) return endedWithoutThisProcess(*report.job_ended, err);
  // Ranks lost (a job of fixed size; an elastic regroup below MIN, failed twice, or without its
  // store): this rank's line and exit code. (A survivor that stops below MIN says so in the
  // store: another survivor still waiting then stops as it did, resumable, and saves what it
  // holds if it claims the save first; comm/membership.h.)
  if (const std::optional<SurvivorStop>& stop = report.survivor_stop) {
    recordJobEnd(elastic, stop->onDisk() ? comm::JobEnd::kStopped : comm::JobEnd::kStoppedUnsaved);
    err << "aiacc_train: " << stop->why() << "; stopped; "
        << (stop->checkpoint().empty()
                ? stop->unsaved()
                : "saved " + stop->checkpoint() + "; run the job again with --resume auto to continue")
        << "\n";
    Ending end{Ending::How::kStopped};
    end.saved = stop->onDisk();
    return exitCode(end);
  }
  // (The store may be gone while every rank lived on: the job's end is its report all the same.)
  if (elastic && elastic->generation().rank == 0) recordJobEnd(elastic, jobEndOf(report.preempted, report.saved_step));
  const int final_rank = elastic ? elastic->generation().rank : rank;  // (an elastic job's may change)
  if (report.preempted) return exitCode(preemptedEnd(report, config, final_rank, err));
  if (final_rank == 0) {
    printReport(report, out);
    if (!config.report_file.empty()) {
      aiacc::writeFileAtomic(config.report_file, reportJson(report, config) + "\n");
      writeRunRecords(config.report_file, report, config.resolved_flags, config.given_flags);
    }
    if (!config.dawnbench_dir.empty()) writeDawnbench(config.dawnbench_dir, report, config);
  }
  // A run that missed its target finished all the same: the report says so.
  return exitCode(Ending{Ending::How::kFinished});
}

int endWithError(const std::exception_ptr& error, ElasticJob* elastic, std::ostream& err) {
  try {
    if (elastic) elastic->markFailed();
  } catch (const std::exception&) {  // the store is gone already: nothing to tell
  }
  return errorExit(error, err);
}

int errorExit(const std::exception_ptr& error, std::ostream& err) {
  try {
    std::rethrow_exception(error);
  } catch (const comm::CommError& e) {  // the library names the setting; this adds our flag for it
    err << "aiacc_train: error: " << e.what() << flagHint(e.remedy()) << "\n";
  } catch (const Error& e) {
    err << "aiacc_train: error: " << e.what() << "\n";
  } catch (const std::exception& e) {
    err << "aiacc_train: internal error: " << firstLine(e.what()) << "\n";
  } catch (...) {
    err << "aiacc_train: internal error: an exception of unknown type\n";
  }
  return exitCode(Ending{Ending::How::kError});
}

}  // namespace aiacc::app
