// The run report (console and JSON) and the DAWNBench-format submission.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/survivor_stop.h"
#include "aiacc/comm/job_end.h"

namespace aiacc::app {

struct EvalPoint {
  int64_t step = 0;
  double epoch = 0;           // fractional epoch position when evaluated
  double seconds = 0;         // wall seconds since start (init included)
  double top1 = 0, top5 = 0;  // percent
  double loss = 0;
  int64_t images = 0;  // val images evaluated (all ranks)
};

// One epoch's training, as summary.csv shows it (app/run_records.h).
struct EpochTrain {
  double epoch = 0;  // 1-based; fractional for an epoch the run stopped inside
  double loss = 0;   // the job's mean training loss over the epoch's images
  double lr = 0;     // the learning rate of its last step
};

struct MachineInfo {
  int cores = 0;
  std::string cpu;
  std::string gpu;  // "none" on CPU machines
  std::string torch_version, opencv_version, jpeg_turbo_version, compiler;
};

MachineInfo machineInfo();

// One change of an elastic job's membership (app/elastic.h), as the report and the metrics
// record it.
struct MembershipChange {
  int64_t generation = 0;
  int world_before = 0, world_after = 0;
  std::string cause;       // the failure's message; empty: a process asked to join
  int64_t step = 0;        // the step training went on from
  int64_t steps_lost = 0;  // this rank's completed steps the restored state lacked, + the step cut
  double detect_s = 0;     // from the end of the last completed step to the failure
  double regroup_s = 0;    // the new generation and its transports
  double restore_s = 0;    // the training state from the new rank 0
  int64_t bytes = 0;       // bytes of training state sent to each rank
  // From the failure (or the vote to let a process in) to the end of the first step completed
  // after the change (-1: none was).
  double first_step_s = -1;
};
std::string describe(const MembershipChange& c);        // one line
std::string membershipJson(const MembershipChange& c);  // one metrics line

struct Report {
  std::string arch, data;
  int world = 1;
  double target_top1 = 0, target_top5 = 0;
  bool target_reached = false;
  double time_to_target_s = -1;  // wall seconds from start, init included; -1: not reached
  double total_s = 0;
  double train_s = 0;  // seconds in training steps (eval excluded)
  double epochs = 0;   // fractional epochs trained
  int64_t steps = 0;
  int64_t images_seen = 0;         // training images, all ranks
  double mean_images_per_s = 0;    // images_seen / train_s
  double steady_images_per_s = 0;  // after warm-up (3 steps) and communication tuning
  double final_top1 = 0, final_top5 = 0;
  // Undecodable files skipped: each rank counts the files it met (once each), summed over the ranks
  // (a file met by two ranks, in different epochs, counts on each).
  int64_t skipped_files = 0;
  std::vector<EpochTrain> epoch_train;  // per epoch (a resumed run's from its start)
  int64_t ignored_files = 0;            // files without an image extension
  int checkpoint_failures = 0;
  int64_t checkpoint_skips = 0;  // --checkpoint-every points skipped: the previous write was still going
  double exposed_comm_s = 0;
  std::string comm;                // communication set-up (GradientSync::describe)
  std::string device = "cpu";      // training device of rank 0 ("cuda:0")
  std::string precision = "fp32";  // "fp32" | "amp fp16" | "amp bf16"
  double loss_scale = 0;           // final dynamic loss scale (amp fp16); 0: none
  int64_t overflow_skips = 0;      // steps skipped for inf/NaN gradients (loss scaler or fp16/bf16 transfer)
  double peak_rss_mb = 0;          // this process's peak resident memory, MiB
  double max_peak_rss_mb = 0;      // the largest over all ranks
  // The ranks max_peak_rss_mb and skipped_files cover: the world, or 1 in an elastic job that
  // lost a rank after training ended (they are then this rank's own).
  int summed_ranks = 1;
  std::vector<EvalPoint> evals;
  MachineInfo machine;
  // Stopped on a stop request (a signal on some rank) at the step the ranks agreed on.
  bool preempted = false;
  int stop_signal = 0;                       // the signal this rank received (0: another rank's request)
  std::string checkpoint;                    // the checkpoint written at that step (rank 0; "" if none)
  int64_t saved_step = -1;                   // that checkpoint's step, on every rank (-1: none was written)
  std::vector<MembershipChange> membership;  // an elastic job's changes, in order
  // Stopped with ranks lost (app/survivor_stop.h): how, and what this rank saved. The report's
  // other fields are then not filled (no collective runs after the loss).
  std::optional<SurvivorStop> survivor_stop;
  // An elastic job that ended (finished, stopped, failed) while this rank waited to regroup, left
  // out of its last generation: it ends as the job did (app/worker_end.h). The other fields
  // are then not filled either.
  std::optional<comm::JobEnded> job_ended;
  // AIACC_BENCH_STEP_VOTE_AB=K (app/test_hooks.h): this rank's steady steps (wall time from the end
  // of the one before, which holds the vote) after a vote and after none. block 0: not measured.
  struct VoteAb {
    int block = 0;
    int64_t steps_with = 0, steps_without = 0;
    double s_with = 0, s_without = 0;
  } vote_ab;
};

std::string reportJson(const Report& r, const Config& c);
// One evaluation as a JSON object (step, epoch, seconds, top1, top5, loss, images), led by
// "type": type when type is not empty: the report's evals and the metrics file's eval lines.
std::string evalPointJson(const EvalPoint& e, const std::string& type = "");
void printReport(const Report& r, std::ostream& os);

// Writes DIR/<name>.json (version, author, framework, model, hardware, costPerHour, timestamp,
// misc: recipe and library versions) and DIR/<name>.tsv (epoch, hours, top1Accuracy,
// top5Accuracy; percent) in the format of the public DAWNBench ImageNet entries.
void writeDawnbench(const std::string& dir, const Report& r, const Config& c);

// "1h02m03s" / "4m05s" / "12.3s".
std::string formatDuration(double seconds);

}  // namespace aiacc::app
