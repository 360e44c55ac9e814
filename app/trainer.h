// The training loop: data -> model -> GradientSync -> optimizer/schedule -> eval -> report.
//
// Reads top-down like the algorithm: for each epoch, take the stage (image size, batch, crop
// scale), run the steps (forward, loss, backward, finishBackward, LR from the schedule, step),
// evaluate, checkpoint, stop at the target. The trainer owns no communication: it talks to a
// comm::GradientSync, which is LocalSync for one process and DataParallel for many.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "app/config.h"
#include "app/report.h"
#include "app/stop_signal.h"
#include "app/test_hooks.h"
#include "aiacc/comm/agreement.h"
#include "aiacc/common/checkpoint_dir.h"
#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/timeline.h"

namespace torch::nn {
class Module;
}
namespace aiacc::data {
class BatchSource;
}

namespace aiacc::app {

class ElasticJob;

// Makes the GradientSync for the model once it exists: LocalSync for one process,
// comm::DataParallel for many. `job` holds this rank's training settings (app/job_settings.h),
// which a multi-rank factory compares across ranks (comm::agreeAcrossRanks) before any
// collective, adding its own.
using SyncFactory =
    std::function<std::unique_ptr<comm::GradientSync>(std::shared_ptr<torch::nn::Module>, const comm::Settings& job)>;

// The single-process factory.
SyncFactory localSync();

// Throws a one-line InputError unless this process sees at least `n` CUDA devices (n >= 1): the
// launcher checks --gpus with it before starting workers, each worker its own local rank's GPU.
void requireVisibleGpus(int n);

class Trainer {
 public:
  using Clock = std::chrono::steady_clock;
  // start: when the process started, so time to target includes initialization.
  Trainer(Config config, comm::WorldInfo world, SyncFactory make_sync, Clock::time_point start);
  ~Trainer();
  // Records forward / backward / gradient sync / optimizer spans of every step (row 0).
  void setTimeline(std::shared_ptr<comm::Timeline> timeline);
  // Trains on these sources instead of the folder (or synthetic data) Config::data names; both
  // already sharded for this rank (e.g. data::TensorBatches). Call before run().
  void setData(std::unique_ptr<data::BatchSource> train, std::unique_ptr<data::BatchSource> val);
  // Where stop requests come from (default: the stop signals, app/stop_signal.h). When one
  // arrives on any rank, the ranks agree on a step, stop there, write its checkpoint (with
  // Config::checkpoint_dir) and run() returns a Report with preempted set.
  void setStopRequest(StopRequest request);
  // Tests: called by the checkpoint writer at each phase of every write (a slow or failing disk).
  void setCheckpointFaultHook(std::function<void(CheckpointPhase, int64_t step)> hook);
  // The faults and logs of app/test_hooks.h a real process was asked for (its checkpoint hook, if
  // any, as setCheckpointFaultHook). Call before run().
  void setTestHooks(const TestHooks& hooks);
  // An elastic job (--nnodes MIN:MAX): its first generation already joined (the world given to
  // the constructor is that generation's). A failure of the communication during the epoch's
  // steps, or a process waiting to join, then regroups the ranks and training goes on (app/elastic.h).
  void setElastic(std::shared_ptr<ElasticJob> elastic);
  // A job of fixed size: when a step fails with a rank lost, `claim` is asked on each survivor and
  // returns true on exactly one (e.g. the first add to a key of the job's store, which a launcher
  // serves outside the workers). That one saves its own state to Config::checkpoint_dir, and run()
  // returns on every survivor with Report::survivor_stop (app/survivor_stop.h). Unset, or when
  // `claim` throws (the store went with the lost rank), the failure ends the run as an error.
  void setSurvivorClaim(std::function<bool()> claim);
  Report run();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace aiacc::app
