// The rendezvous store served beyond a job's own workers: by node 0's launcher of an elastic job
// once its workers ended (the other nodes' ranks may still regroup through it), and by
// aiacc_train --rendezvous-server (serveRendezvous, app/launcher.h).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "app/launcher.h"

namespace aiacc::app {

// Node 0's launcher of an elastic job, its own workers ended: serves `served` until the job has
// ended and no process still waits to be let in, or for spec.rdzv_timeout, or until a stop
// signal is read from `sfd` (a signalfd); says on stderr which and why.
void keepStoreUntilTheJobEnds(const c10::intrusive_ptr<c10d::Store>& served, const LaunchSpec& spec, int sfd);

}  // namespace aiacc::app
