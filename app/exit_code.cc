#include "app/exit_code.h"

#include "app/stop_signal.h"
#include "aiacc/common/error.h"

namespace aiacc::app {

int exitCode(const Ending& e) {
  switch (e.how) {
    case Ending::How::kFinished: return kExitFinished;
    case Ending::How::kStopped:
      if (e.saved) return kExitPreempted;
      return e.signal > 0 ? 128 + e.signal : kExitError;
    case Ending::How::kError: return kExitError;
    case Ending::How::kUsage: return kExitUsage;
  }
  return kExitError;
}

Ending endingOf(comm::JobEnd how) {
  switch (how) {
    case comm::JobEnd::kFinished: return Ending{Ending::How::kFinished};
    case comm::JobEnd::kStopped:
    case comm::JobEnd::kStoppedUnsaved: {
      Ending e{Ending::How::kStopped};
      e.saved = how == comm::JobEnd::kStopped;
      return e;
    }
    case comm::JobEnd::kFailed: return Ending{Ending::How::kError};
  }
  return Ending{Ending::How::kError};
}

std::string exitCodeHelp() {
  return "Exit codes (a single process, each worker, and the launcher alike):\n"
         "  0      finished: the schedule ran to its end, or to --max-steps, or to the target accuracy\n"
         "         (the report says whether a target was reached)\n"
         "  75     stopped, and this run's training state is on disk (a stop signal, or ranks lost\n"
         "         where a survivor saved): run the same command with --resume auto to continue\n"
         "  128+N  stopped by signal N with nothing saved (no --checkpoint-dir, or its write failed)\n"
         "  1      an error (its one line says which), or a stop without a signal that saved nothing\n"
         "  2      usage: an unknown flag, a flag value its type or the options' checks refuse, a stray\n"
         "         argument, launcher variables that are incomplete or contradict the flags (found\n"
         "         before anything starts)\n";
}

LauncherEnd launcherExitCode(const std::vector<WorkerExit>& workers, bool failed, int first_signal) {
  int saved = 0;
  bool clean = true;     // every worker ended 0 or 75
  bool finished = true;  // every worker ended 0
  for (const WorkerExit& w : workers) {
    const bool preempted = w.signal == 0 && w.code == kExitPreempted;
    const bool done = w.signal == 0 && w.code == kExitFinished;
    saved += preempted ? 1 : 0;
    clean = clean && (preempted || done);
    finished = finished && done;
  }
  const std::string by = first_signal != 0 ? " by " + signalName(first_signal) : "";
  if (!failed && clean && saved > 0) {
    return {kExitPreempted, strCat("aiacc_train: preempted", by, ": ", saved, " of ", workers.size(),
                                   " worker(s) saved and stopped (exit ", kExitPreempted,
                                   "); run the same command with --resume auto to continue")};
  }
  if (!failed && finished) {
    if (first_signal == 0) return {kExitFinished, ""};
    return {kExitFinished,
            strCat("aiacc_train: every worker had finished when ", signalName(first_signal), " came (exit 0)")};
  }
  const int code = failed ? kExitError : first_signal != 0 ? 128 + first_signal : kExitError;
  if (first_signal == 0) return {code, ""};  // (the failed worker's line said it)
  return {code, strCat("aiacc_train: stopped", by, " (exit code ", code, ")")};
}

}  // namespace aiacc::app
