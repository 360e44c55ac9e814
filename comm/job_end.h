// How an elastic job ended, as its rendezvous store records it (comm/membership.h writes and reads
// it), and what a process that waited to join learns of that end. No LibTorch here: the trainer's
// report (app/report.h) carries it.
#pragma once

#include <string>

namespace aiacc::comm {

// How an elastic job ended (comm::markJobEnded, markJobFailed). kStoppedUnsaved: stopped, and
// nothing of its state was saved (no --checkpoint-dir, or the write failed).
enum class JobEnd { kFinished, kStopped, kStoppedUnsaved, kFailed };

// Membership::join found that the job had ended while this process waited to be let in: a value, not an
// error (app/worker_end.h ends the process as the job ended; app/run_phase.h: kJobEnded).
// `how`: finished, stopped with its state saved or not (markJobEnded: a process started again too
// late to take part), or kFailed (markJobFailed: every rank of the job's last generation failed;
// there is nothing to join, and starting this process again is no use).
struct JobEnded {
  JobEnd how = JobEnd::kFinished;
  std::string what;  // one line: how the job ended, and the generation this process waited for
};

}  // namespace aiacc::comm
