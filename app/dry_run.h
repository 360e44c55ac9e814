// --dry-run: what a command line would do, without doing it. aiacc_train parses every flag, the
// recipe and the launcher's variables (a usage error exits 2, as it would for the run), prints
// this description and exits 0. Nothing is read beyond the recipe and any --flagfile: not the
// data, the checkpoints or the GPUs. Users check a command before queueing it; the docs check
// (tests/docs_check.py) checks every command in README.md and docs/ this way.
#pragma once

#include <string>

#include "app/config.h"
#include "app/flags.h"
#include "app/launch_env.h"

namespace aiacc::app {

// A few lines: who runs (one process, a launcher of N workers on node K of M, or rank R of W
// started by a launcher, elastic or not, and where the store is), then what trains (model, data,
// stages, epochs, targets, checkpoints). Pure.
std::string describeRun(const LaunchPlan& plan, const DistSpec& dist, const Config& config);

}  // namespace aiacc::app
