// The ranks of an elastic job as threads of the test's process: each rank an ElasticJob and a
// Trainer, as aiacc_train's worker makes them (app/command_train.cc runWorker), over one in-memory
// store, every membership on one manual clock (its waits below MIN, its last calls and beats move
// only when the test says), the transports over shared memory, and each rank's end mapped by the
// worker's own endOfRun (app/worker_end.h) to its lines and exit code. The faults are the
// AIACC_TEST_* hooks the process tests give aiacc_train_hooked, parsed by the same parser
// (app/test_hooks.h), per rank.
//
// What a thread cannot be: a process that dies or stops. A rank that ends (its error, say) closes
// its transports as it unwinds, and the others read "closed its transport", not "died": it is
// not reported lost, and a regroup waits for it until the last call or the timeout. SIGKILL,
// SIGSTOP, a killed store server and the real launchers stay process tests (tests/elastic_job.h).
//
// Shared by the threads and handled here: glog's one stream (a LogSink keeps every line, of every
// rank), the CPU generator's seed (each Trainer seeds it; the ranks agree on the model through
// the first generation's broadcast), at::set_num_threads (1 for all). Not handled yet, for the
// tests that will need them: the CPU generator's state, which a checkpoint and a restore read and
// write unlocked (trainer_elastic.cc, trainer_checkpoint.cc: ranks that do so at once race), and
// AIACC_TEST_SAMPLE_LOG's file, named by the process (give each rank its own PATH in `env`).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/report.h"
#include "tests/manual_clock.h"

namespace aiacc::test_threads {

struct ThreadJobSpec {
  int ranks = 3;
  int min = 3, max = 3;                          // --nnodes MIN:MAX, one rank per node
  std::chrono::milliseconds rdzv_timeout{8000};  // --rdzv-timeout, on the manual clock
  std::chrono::milliseconds last_call{1000};     // --rdzv-last-call, on the manual clock
  app::Config config = smallConfig();            // every rank's
  // AIACC_TEST_* variables for each rank (empty: none), as its environment would hold them.
  std::function<std::map<std::string, std::string>(int rank)> env;

  // resnet18-w8 on synthetic 16-pixel images of 4 classes, 2 epochs of 4 steps of 4 images per
  // rank at 3 ranks, one thread per rank, a metrics line per step.
  static app::Config smallConfig();
};

// How one rank ended.
struct RankEnd {
  int code = -1;         // its exit code (endOfRun, or endWithError's)
  std::string out, err;  // what aiacc_train would have printed: rank 0's report, the end's line
  std::string error;     // the error line that ended it ("" when it ended by endOfRun)
  std::optional<app::Report> report;
};

class ThreadJob {
 public:
  explicit ThreadJob(ThreadJobSpec spec);
  ~ThreadJob();  // waits for the ranks (a test that failed early still ends them: see wait)
  ThreadJob(const ThreadJob&) = delete;
  ThreadJob& operator=(const ThreadJob&) = delete;

  // The clock every membership reads; the test advances it (ManualClock::awaitLooks first).
  aiacc::test::ManualClock& clock() { return *clock_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // Blocks until rank `rank` has ended (at most `limit` of real time); false past it. (The clock's
  // watchdog, a minute of real time with no advance, then counts from the return.)
  bool awaitEnd(int rank, std::chrono::seconds limit = std::chrono::seconds(60));
  // Every rank's end, once all have ended (at most `limit` of real time each; a rank still running
  // past it fails the test, and the clock's watchdog then ends its waits).
  std::vector<RankEnd> wait(std::chrono::seconds limit = std::chrono::seconds(120));
  // Every line logged (glog) while the job ran, in order.
  std::vector<std::string> logLines() const;

 private:
  struct Shared;
  std::shared_ptr<aiacc::test::ManualClock> clock_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<Shared> shared_;
};

// The lines of `lines` that contain `text`.
int countContaining(const std::vector<std::string>& lines, const std::string& text);

}  // namespace aiacc::test_threads
