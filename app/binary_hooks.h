// The test faults and benchmark switches (app/test_hooks.h) a binary's worker (runWorker,
// app/command_train.cc) hands its Trainer.
// One definition per binary, chosen when it is linked: aiacc_train's (hooks_none.cc) is empty, so
// the production binary reads no AIACC_TEST_* or AIACC_BENCH_* variable and holds no code that
// parses one; aiacc_train_hooked's (hooks_env.cc) reads them from the environment. The process
// tests that need a fault on cue and the benchmark scripts' baselines run aiacc_train_hooked,
// which is never installed.
#pragma once

#include "app/test_hooks.h"

namespace aiacc::app {

// This binary's hooks: none in aiacc_train; the environment's in aiacc_train_hooked (InputError
// for a malformed value).
TestHooks hooksOfThisBinary();

}  // namespace aiacc::app
