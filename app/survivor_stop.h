// How a survivor's training stopped with ranks lost (a value the trainer returns in its Report,
// not an exception; app/run_phase.h: the terminal phase kSurvivorStop).
#pragma once

#include <string>
#include <utility>

#include "aiacc/common/error.h"

namespace aiacc::app {

// Training stops with ranks lost: in an elastic job fewer than MIN processes regrouped within
// --rdzv-timeout, or a regroup's set-up failed twice; in a job of fixed size a rank was lost
// during the steps; or the store was lost. One of the survivors saved its own training state
// (two, when the store was lost and one was a step ahead of the first: the newer is the newest
// checkpoint): there `checkpoint` is the file; everywhere else it is "" and `unsaved` says why
// this rank holds no file (another survivor saves or saved, no --checkpoint-dir, the write
// failed). `on_disk`: the job's state is on disk as far as this rank knows (it saved it, found it
// saved, or another survivor was chosen to save it), so that the run is resumable and the
// process exits 75; else it exits 1 (app/exit_code.h).
class SurvivorStop {
 public:
  SurvivorStop(std::string why, std::string checkpoint, std::string unsaved, bool on_disk)
      : why_(oneLine(why)), checkpoint_(std::move(checkpoint)), unsaved_(std::move(unsaved)), on_disk_(on_disk) {}
  const std::string& why() const { return why_; }  // the loss, in one line (oneLine: as an Error's)
  const std::string& checkpoint() const { return checkpoint_; }
  const std::string& unsaved() const { return unsaved_; }
  bool onDisk() const { return on_disk_; }

 private:
  std::string why_, checkpoint_, unsaved_;
  bool on_disk_;
};

}  // namespace aiacc::app
