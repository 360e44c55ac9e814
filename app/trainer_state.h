// Trainer::State, the trainer's working set, shared by its parts: trainer_setup.cc (set-up),
// trainer.cc (the epoch loop, one step), trainer_eval.cc (evaluation and the report), trainer_checkpoint.cc
// (checkpoints, the preemption stop, resume). Private to app/: nothing outside includes it.
#pragma once

#include <torch/nn/functional/loss.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "app/amp.h"
#include "app/elastic.h"
#include "app/fused_sgd.h"
#include "app/run_phase.h"
#include "app/stop_signal.h"
#include "app/survivor_stop.h"
#include "app/tensorboard.h"
#include "app/trainer.h"
#include "app/training_state.h"
#include "aiacc/common/checkpoint_dir.h"
#include "data/loader.h"
#include "models/resnet.h"

namespace aiacc::app {

using Clock = Trainer::Clock;

// What one optimizer step did.
struct StepResult {
  double loss = 0;       // the batch's mean loss per decoded image; 0 when it decoded to nothing
  bool applied = false;  // the optimizer stepped (not skipped on a non-finite gradient)
};

// How a rank's run ends before its report (a terminal phase with a value, app/run_phase.h): a
// survivor's stop with ranks lost (kSurvivorStop), or the end of an elastic job that came while
// this rank waited to regroup (kLeftOut).
using EarlyEnd = std::variant<SurvivorStop, comm::JobEnded>;

// How writeCheckpoint hands its snapshot to the writer thread.
enum class CheckpointWait {
  kSkipIfBusy,  // mid-epoch: skipped (counted) while the previous write is in flight
  kQueue,       // epoch end: waits for the write in flight, if any, not for this one
  kDone,        // the stop: waits until this one is on disk
};

// This rank's steps since the last metrics line (Trainer::State::flushLog sums them over ranks).
struct LogWindow {
  int64_t steps = 0;
  double loss_sum = 0;  // the step's mean loss per image x its images, summed over the steps
  int64_t images = 0;   // this rank's decoded training images
  // The steps' images over all ranks as this rank sees them (its decoded share of each step scaled
  // to the global batch: exact when every rank decoded its whole batch): what a regroup counts
  // for steps whose sum over ranks (the metrics line) never came.
  int64_t images_all_ranks = 0;
  double wall_s = 0;  // this rank's wall time of the steps (loading included)
  double compute_s = 0;
  // The last step's position and learning rate (the line's).
  double epoch = 0;
  int64_t batch = 0;
  double lr = 0;
};

// This run's progress (a resumed run counts from where it resumed); what outlives the run is in
// TrainingState.
struct RunTotals {
  int64_t planned = 0;  // steps of the whole schedule (--max-steps included)
  int64_t steps = 0;
  double train_s = 0;
  int64_t images = 0;
  // Steady state: after 3 warm-up steps and once the communication tuner has frozen.
  double steady_s = 0;
  int64_t steady_images = 0;
  Report::VoteAb vote_ab;     // AIACC_BENCH_STEP_VOTE_AB: the steady steps after a vote and after none
  bool voted = true;          // the ranks voted after the last step (AIACC_BENCH_STEP_VOTE_AB)
  bool index_logged = false;  // the JPEG index summary, once, after the first complete epoch
  bool stop = false;          // the run ends (target, --max-steps, or a stop request)
  // The ranks agreed to stop on a stop request (a signal); the signal this rank received (0:
  // the request came from another rank).
  bool preempted = false;
  int stop_signal = 0;
  // --checkpoint-every by time: when the last checkpoint was taken (now()), and whether rank 0
  // has asked for the next one (it is taken at the step the vote brings the flag back).
  double last_checkpoint_s = 0;
  bool checkpoint_asked = false;
  // What the newest checkpoint of this run holds: its start's (resumed or 0) until it writes one,
  // then that one's step and evaluations; -1 after an elastic regroup (and in a process that
  // joined), so that every rank of the generation decides alike. A run that ends past it
  // (--max-steps or a target within an epoch, or a final evaluation) writes one there.
  int64_t checkpoint_step = 0;
  size_t checkpoint_evals = 0;
  Clock::time_point last_progress;
  double epoch_pos = 0;                // fractional epoch of the training position
  bool nonfinite_loss_logged = false;  // the first non-finite training loss, said once
  bool regroup_asked = false;          // rank 0 voted kFlagRegroup; the answer has not come back yet
  bool in_step = false;                // within trainStep (a failure there cuts the step)
  bool regroup_after_epoch = false;    // the ranks agreed to let a newcomer in at the epoch's last step
  Clock::time_point last_step_end;     // the end of the last completed step (an elastic failure's detection)
  // An elastic change whose first completed step is still to come: when the change began (its
  // report entry is report.membership.back(), its metrics line written at that step).
  std::optional<Clock::time_point> change_began;
  LogWindow window;                  // steps not yet in a metrics line
  double logged_exposed_comm_s = 0;  // sync().exposedCommSeconds() at the last metrics line
  double job_loss = 0;               // the last metrics line's loss (the job's), for the progress line
  int64_t job_images = 0;            // this run's training images over all ranks, up to the last line
  double job_images_train_s = 0;     // run.train_s at the last metrics line
};

struct Trainer::State {
  Config cfg;
  comm::WorldInfo world_info;
  SyncFactory make_sync;
  std::unique_ptr<comm::GradientSync> sync_ptr;
  Clock::time_point start;
  int rank = 0, world = 1;

  std::shared_ptr<data::SkipLog> skips = std::make_shared<data::SkipLog>();
  std::unique_ptr<data::BatchSource> train, val;
  int64_t ignored_files = 0;
  std::string data_name;
  std::string dataset;                   // datasetFingerprint(), for the agreement across ranks
  std::vector<std::string> class_names;  // label i is class_names[i]; empty for synthetic and in-memory data

  at::Device device = at::kCPU;
  models::ResNet model{nullptr};
  std::unique_ptr<FusedSgd> optimizer;
  std::vector<torch::Tensor> params;
  std::unique_ptr<GradScaler> scaler;
  // The gradient sync took the loss scale (fp16 transfer under AMP fp16): it unscales, checks
  // and moves the one scale itself, and the trainer must not unscale again.
  bool sync_unscales = false;

  TrainingState pos;                                              // what a checkpoint holds besides the tensors
  std::unique_ptr<CheckpointWriter> checkpoints;                  // rank 0, from the first checkpoint on
  std::function<void(CheckpointPhase, int64_t)> checkpoint_hook;  // tests (Trainer::setCheckpointFaultHook)
  std::shared_ptr<comm::Timeline> timeline;
  std::ofstream metrics;
  // --tensorboard-dir (rank 0): the metrics lines' numbers as scalars. A write that fails is said
  // once and ends the TensorBoard output (null from then on); training goes on.
  std::unique_ptr<TensorBoardWriter> tensorboard;
  Report report;
  RunTotals run;
  torch::nn::functional::CrossEntropyFuncOptions loss_opts;

  StopRequest stop_request = [] { return stopSignalReceived(); };
  // --nnodes MIN:MAX (app/elastic.h); null otherwise.
  std::shared_ptr<ElasticJob> elastic;
  std::function<bool()> survivor_claim;   // Trainer::setSurvivorClaim; empty: no store to claim in
  bool joined_running = false;            // this process joined a running elastic job (its state came from rank 0)
  bool step_vote = true;                  // false only for a benchmark's baseline (AIACC_BENCH_NO_STEP_VOTE=1)
  std::string sample_log_path;            // AIACC_TEST_SAMPLE_LOG (app/test_hooks.h); empty: no sample log
  std::function<void()> epoch_eval_hook;  // AIACC_TEST_HOLD_EPOCH_EVAL (app/test_hooks.h); empty: none
  std::function<void()> run_end_hook;     // AIACC_TEST_HOLD_RUN_END (app/test_hooks.h); empty: none
  bool skew_at_regroup = false;           // AIACC_TEST_SKEW_AT_REGROUP=1 (app/test_hooks.h)
  int late_to_regroup_ms = 0;             // AIACC_TEST_LATE_TO_REGROUP_MS (app/test_hooks.h)
  std::function<void(int, int64_t)> step_end_hook;  // AIACC_TEST_{FAIL,HOLD}_AT_STEP (app/test_hooks.h); empty: none
  JoinDeath die_joining = JoinDeath::kNone;         // AIACC_TEST_DIE_JOINING (app/test_hooks.h)
  int fail_setups = 0;                              // AIACC_TEST_FAIL_SETUP (app/test_hooks.h): set-ups left to fail
  // Tests (AIACC_TEST_SAMPLE_LOG): one line per applied step with its samples, one per restore.
  std::unique_ptr<std::ofstream> sample_log;

  State(Config c, comm::WorldInfo w, SyncFactory f, Clock::time_point t)
      : cfg(std::move(c)), world_info(w), make_sync(std::move(f)), start(t) {}
  comm::GradientSync& sync() { return *sync_ptr; }

  double now() const { return pos.elapsed_s + std::chrono::duration<double>(Clock::now() - start).count(); }
  bool isRank0() const { return rank == 0; }

  // Threads, device, data, model (and the resumed position), metrics file, report header.
  void setUp();
  void setupDevice();
  void setupData();
  void setupModel();
  // The epochs from pos.epochs_done on, each with its end (metrics, evaluation, checkpoint), until
  // the run stops, then the final state's evaluation if no epoch's end made it. In an elastic
  // job a failure of the communication anywhere in them, or a newcomer, regroups and goes on (the
  // one place that regroups). Returns how this rank stopped when ranks were lost and the run
  // cannot go on (the terminal phase kSurvivorStop), or the job's end a regroup met (kLeftOut);
  // nullopt for every other ending.
  std::optional<EarlyEnd> trainEpochs();
  // An elastic job's last collective of training (a one-element sum): every rank is past the
  // final evaluation, or all regroup.
  void endOfTraining();
  // The epoch's steps in the current world from the position on, each followed by its metrics
  // line, progress, vote and --eval-every evaluation: true when the epoch's last batch was
  // trained, false on a stop within it (target, --max-steps, a stop request); nullopt when the
  // ranks voted to regroup (a newcomer).
  std::optional<bool> trainSegment(int epoch);
  // The epoch's fraction trained after `batches` of its `nb` steps of `global_batch` images.
  double epochFraction(int64_t batches, int64_t nb, int64_t global_batch) const;
  // The job's images a step at stage `st` in a world of `w` ranks: --batch-size x w, or with
  // --elastic-batch keep-global x the job's first world (pos.batch_world) whatever w is.
  int64_t globalBatch(const Stage& st, int w) const;
  int64_t globalBatch(const Stage& st) const { return globalBatch(st, world); }
  // This rank's share of it (data::rankBatch): --batch-size unless keep-global's world changed.
  int64_t rankBatchSize(const Stage& st) const;
  // Steps in a whole epoch at stage `st` in the current world.
  int64_t stepsPerEpoch(const Stage& st) const;
  // Rank 0's outputs (checkpoint writer, metrics file, TensorBoard): at set-up, and in an elastic
  // job for a process that becomes rank 0 later.
  void openRank0Outputs();
  // The checkpoint writer for Config::checkpoint_dir, made on first use (rank 0's at set-up; a
  // survivor's when it saves its own state).
  CheckpointWriter& checkpointWriter();
  // Elastic (app/trainer_elastic.cc): leaves the current generation after `cause` (empty: a
  // newcomer), joins the next, rebuilds the gradient sync for its world and restores the
  // training state from its rank 0 (restoreFromRank0); records the change. `step_cut`: the
  // failure came within a step, which is lost (false: at an epoch's end, between steps).
  // Returns this rank's survivor stop when too few ranks came back (regroupOrStop) or the set-up
  // failed twice with no newcomer (leaveFailedSetUp), its state saved or not; the job's end when
  // it ended before this rank was let in; nullopt once the next generation trains.
  std::optional<EarlyEnd> regroup(const std::string& cause, bool step_cut = true);
  // Rank 0 of an elastic job's generation that no process of the one before is in (all of them
  // gone, the workers started again): says on its log where the training goes on from, the
  // checkpoint resumed or step 0, so that a restart from the beginning is never silent.
  void sayNoSurvivor() const;
  // The set-up of the generation this rank just joined: its rank and shards, the gradient sync
  // for its world, the training state from its rank 0 (restoreFromRank0; `world_before`: the
  // world of the generation that last trained, the state's bytes in *bytes). Returns when the
  // transports stood.
  Clock::time_point setUpGeneration(const comm::Generation& g, int world_before, int64_t* bytes);
  // This rank's place and shards in world `w` (the generation's, or the one that trained the state).
  void enterWorld(const comm::WorldInfo& w);
  // What a regroup carries from a generation whose set-up failed to the next one it tries.
  struct SetUpRetry {
    std::string why;        // the failure (the first: the regroup's cause)
    std::vector<int> gone;  // the failed generation's newcomers, reported gone to the next
    int alone = 0;          // set-ups failed with no newcomer in them
  };
  // What a rank does after its set-up of a generation failed: go on to the next generation,
  // stop (a survivor's stop, its state saved or not), or neither (the failure is an error).
  struct SetUpVerdict {
    bool retry = false;
    std::optional<SurvivorStop> stop;
  };
  // After `e` failed the set-up of generation `g` (`communication`: a transport's or the store's
  // failure, else the agreement's InputError): retry when this rank leaves `g` for the next, its
  // transports closed, its world and shards those of `trained_in` again, `retry` updated.
  // Neither retry nor stop: `e` ends this process as any other error. A communication failure of
  // a generation with no newcomer, after one such already in this regroup (two ranks lost in a
  // row, or a failure that repeats), stops this rank resumable instead: the first of `g`'s
  // members to claim it (claimTheSave; one behind the newest step waits a second first) saves its
  // state; `stop` says so.
  SetUpVerdict leaveFailedSetUp(const comm::Generation& g, const std::exception& e, bool communication,
                                const comm::WorldInfo& trained_in, SetUpRetry& retry);
  // elastic->regroup (nullopt: the generation it closed is elastic->generation(); the job's end
  // when it ended before this rank was let in), or, below MIN
  // after --rdzv-timeout, the stop: the first to claim it (claimTheSave) saves its state (with
  // --checkpoint-dir), and the SurvivorStop says so; so too when the store is lost (with no store
  // to pick one, every survivor is a saver in survivorStop). A process the others went on without
  // never stops so: its regroup's failure is its error (LeftOutError, app/elastic.h), thrown.
  // `gone`: ranks of the generation left that are known not to come (ElasticJob::regroup).
  std::optional<EarlyEnd> regroupOrStop(const std::string& cause, const std::vector<int>& gone = {});
  // A job of fixed size whose step failed (`e`: a rank lost, or its communication): with
  // --checkpoint-dir and a store that outlived the loss, the survivor that claims it first
  // (survivor_claim: one store request, no collective) saves its own state, and every survivor
  // returns its SurvivorStop; otherwise `e` is thrown again, an error as before.
  SurvivorStop stopAfterLostRank(const comm::CommError& e);
  // An elastic survivor that stops: whether it is the one that saves the state its generation's
  // members hold (ElasticJob::claimSave, the job's one election, as survivor_claim is a fixed-size
  // job's). True where the store is gone: nobody can be elected, and saveInTurn's lock and note
  // in the checkpoint folder keep the save to one.
  bool claimTheSave();
  // This rank's own state as the newest checkpoint (its BatchNorm statistics are its own:
  // rank_local_buffers); the file's path, or "" when it could not be written.
  std::string saveOwnState();
  // The stop of a survivor, `why`: `saver` (the one survivor that claimed the save) saves its own
  // state (saveOwnState; in an elastic job, saveInTurn); the SurvivorStop names the file, or says
  // why there is none.
  SurvivorStop survivorStop(const std::string& why, bool saver);
  // saveOwnState as a SurvivorStop for `why`: the file, or, when the write or anything before it
  // failed (said on the log), why there is none.
  SurvivorStop saveOwnStateOrSay(const std::string& why);
  // An elastic job's survivor stop with --checkpoint-dir, in turn with the other survivors (a lock
  // on DIR/survivors.lock; none where it cannot be had, said on the log), once this rank's own
  // write in flight has ended. The note of this run's save (DIR/survivors-<run id>.saved: step,
  // file) says what a survivor saved: where it names a step as new as this rank's, this rank
  // points `latest` back at it (its own older write may have moved it) and saves nothing; else
  // `saver` saves its own state and writes the note. With the store gone every survivor is a
  // saver: the first saves, the others find its note, or one a step ahead saves its newer state.
  SurvivorStop saveInTurn(const std::string& why, bool saver);
  // Every rank of a new generation: rank 0's training state (model, optimizer, position, scales,
  // communication state), broadcast over the new transports; rank 0 first starts a new segment
  // of the epoch for the new world (its own previous world: `previous_world`). Returns the bytes.
  // Survivors that hold rank 0's model and optimizer state (same step, same stateCrc) receive
  // only the position (encodeTrainingState); when any rank lacks it (a joiner, a rank behind,
  // one that differs), every rank receives all. (The weights and BatchNorm statistics are rank
  // 0's on every rank already: the new gradient sync broadcast them as it was built, as DDP's
  // constructor does; the momentum is what the comparison decides.)
  int64_t restoreFromRank0(int previous_world);
  // CRC-32C of this rank's parameters (and momentum buffers).
  uint32_t stateCrc(bool with_momentum) const;
  // After a restore that moved the model: the ranks compare a hash of their parameters (one
  // small sum); a difference is an error naming the rank. (When only the position moved, the
  // hashes that decided it were compared already.)
  void checkSameParameters();
  // This rank's training state as a checkpoint holds it (the model and optimizer aside).
  TrainingState snapshot() const;
  // After a completed step: ends a pending elastic change's record (first_step_s, log, metrics).
  void finishChange();
  // Tests: into the sample log, the samples of the step that ends at `step`, before the step: a
  // rank killed once its part of the step was sent has its samples logged, since the others may
  // keep the step. logApplied() then says this rank applied it; the step was trained when any
  // rank applied it and no later generation restored a state from before it.
  void logSamples(const data::Batch& batch, int64_t step);
  void logApplied();
  std::string sampleLogPrefix(const char* kind, int64_t step) const;  // "KIND RUN GENERATION STEP"

  // One optimizer step (below, with the loss scaler's handling in one place).
  StepResult trainStep(const data::Batch& batch, const Stage& st, Clock::time_point t0);
  // Rank 0, every --progress-seconds: where the run is, the mean speed and the time left.
  void printProgress(int epoch, int64_t step_in_epoch, int64_t batches, const Stage& st, double loss, double lr,
                     Clock::time_point t);
  // After a complete epoch: the position at its end, the JPEG index summary once.
  void finishEpoch(int epoch);
  // Evaluates at run.epoch_pos, records it (report, metrics, log) and stops at the target; a
  // stop request during it ends it unrecorded (run.preempted).
  void evaluateAndRecord();
  // The report's totals, the peak memory over ranks, whether a stop's checkpoint was written
  // (every rank: Report::saved_step), and --save-weights.
  Report finishReport();
  // How this run ended, as an elastic job's store records it: finished, or stopped with its
  // state saved or not (report.saved_step).
  comm::JobEnd jobEnd() const { return jobEndOf(run.preempted, report.saved_step); }
  at::ScalarType ampDtype() const { return cfg.amp_dtype == AmpDtype::kBf16 ? at::kBFloat16 : at::kHalf; }
  void setLearningRate(double lr);
  int64_t plannedSteps() const;
  // Every rank's evaluation summed; nullopt when a stop request came on some rank meanwhile.
  std::optional<EvalPoint> evaluate(double epoch_pos);
  bool targetReached(const EvalPoint& e) const;
  void writeMetric(const std::string& json);
  // The metrics line for the steps in run.window, with the job's numbers: the loss averaged over
  // every rank's images, images and images/s summed over the ranks (pos.images_seen gains them).
  // A collective (one small sum), called by every rank at the same points: every --log-every
  // steps, and before a checkpoint, an evaluation and the report, so what they record counts
  // every image trained. Nothing to do (and no collective) when the window is empty.
  void flushLog();
  // The epoch in progress: the job's mean training loss so far (NaN before its first image).
  double epochLoss() const {
    return pos.epoch_images > 0 ? pos.epoch_loss_sum / static_cast<double>(pos.epoch_images) : std::nan("");
  }
  // TensorBoard points (no-ops without --tensorboard-dir); an IoError ends TensorBoard output.
  void tensorboardScalars(const std::vector<std::pair<std::string, double>>& points);
  void tensorboardConfig();
  // At an epoch end (with --checkpoint-dir): writeCheckpoint in the background.
  void checkpoint();
  // Every rank calls it (the buffers are averaged first: a collective); rank 0 takes the snapshot
  // on this thread and hands it to the checkpoint writer as `wait` says. With kDone it returns
  // the file written ("" on failure: counted, logged; the previous checkpoint stays the newest);
  // otherwise, and on other ranks, "".
  std::string writeCheckpoint(CheckpointWait wait);
  // Counts and logs the checkpoint writer's failures since the last call; false when one of
  // them left a checkpoint unsaved (not only its retention failing).
  bool takeCheckpointErrors();
  // Resume (--resume PATH or auto) into model, optimizer and pos; called before the sync wraps
  // the model.
  void resume();
  // Rank 0, once resumed (or not): a warning when --checkpoint-dir holds checkpoints of later
  // steps than the one this run starts at (an earlier run's): what becomes of them.
  void sayLaterCheckpoints() const;
  // The settings a resumed run must share with the run that wrote the checkpoint.
  std::vector<std::pair<std::string, std::string>> continuationSettings() const;
  // After the ranks agreed to stop: the checkpoint of this step, then the report.
  Report finishPreempted();
  // An evaluation is due at the current position (an epoch end, or --eval-every) and not in
  // the history: a run resumed after a stop that interrupted it.
  bool evaluationPending() const;
  // This rank's stop wish now (its signal, or 0).
  int stopWanted() const { return stop_request ? stop_request() : 0; }
};

}  // namespace aiacc::app
