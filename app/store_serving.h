// The rendezvous store served beyond a job's own workers: by node 0's launcher of an elastic job
// once its workers ended (the other nodes' ranks may still regroup through it), and by
// aiacc_train --rendezvous-server (serveRendezvous, app/launcher.h).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <optional>

#include "app/launcher.h"

namespace aiacc::app {

// How long the store stays after the job's end for processes that still wait (a waiter that died
// waiting is given up then), and after an end by failure on every rank for the workers that
// launchers with --max-restarts start again (they read the end and end as it did, instead of
// meeting a closed store; their launchers read it too and start them no more).
constexpr std::chrono::seconds kWaitersGrace{10};

// What the decision to stop serving an elastic job's store reads, at one look.
struct ServingFacts {
  std::chrono::steady_clock::time_point now;
  std::chrono::steady_clock::time_point until;  // the longest it serves (--rdzv-timeout; max(): no limit)
  std::optional<std::chrono::steady_clock::time_point> ended;  // when the job's end was first seen
  bool failed = false;    // the job ended failed on every rank (comm::JobEnd::kFailed)
  bool restarts = false;  // its launchers start failed workers again (--max-restarts)
  // Whether some process still waits to be let in (comm::waitersRemain: a store request), asked
  // only when the decision turns on it; none: nobody waits.
  std::function<bool()> waiters;
};
// The server may stop: past `until`; or once the job has ended and no process waits (or the
// waiters have had kWaitersGrace), except that after an end by failure with restarts it stays
// kWaitersGrace whatever the waiters. Pure but for `waiters`: tests/store_serving_test.cc checks
// it as a table, and when it asks.
bool mayStopServing(const ServingFacts& f);

// Node 0's launcher of an elastic job, its own workers ended: serves `served` until the job has
// ended and no process still waits to be let in, or for spec.rdzv_timeout, or until a stop
// signal is read from `sfd` (a signalfd); says on stderr which and why.
void keepStoreUntilTheJobEnds(const c10::intrusive_ptr<c10d::Store>& served, const LaunchSpec& spec, int sfd);

}  // namespace aiacc::app
