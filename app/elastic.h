// An elastic job (--nnodes MIN:MAX) from a worker's side: its membership generations
// (comm/membership.h), the regroup after a lost rank or for a newcomer, and the record of each
// change for the report and the metrics.
//
// The worker (app/command_train.cc) joins the first generation (start()); the trainer
// (app/trainer.cc) drives the rest: when a step's communication fails,
// regroup() with the failure's message; when rank 0 sees a newcomer waiting (joinersWaiting(),
// one store request per step), the ranks vote and regroup at the same step. After a regroup
// the trainer rebuilds the gradient sync for generation().world(), restores the training state
// from the new rank 0 (the survivor at the highest completed step) and shares out the rest of
// the epoch.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/comm/key_log.h"
#include "aiacc/comm/membership.h"
#include "aiacc/common/error.h"

namespace aiacc::app {

struct ElasticOptions {
  comm::MembershipOptions membership;  // MIN and MAX in processes (nodes x --nproc)
  std::string node;                    // this process's host (its local ranks: the members on it)
  int launch_rank = -1;                // the rank its launcher gave it (the first generation keeps it)
};

// How a run ended, as an elastic job's store records it (comm::markJobEnded): finished, or
// stopped with its state saved (a checkpoint step, saved_step >= 0) or not.
inline comm::JobEnd jobEndOf(bool stopped, int64_t saved_step) {
  if (!stopped) return comm::JobEnd::kFinished;
  return saved_step >= 0 ? comm::JobEnd::kStopped : comm::JobEnd::kStoppedUnsaved;
}

// What a process that waits to join a running job says on its log, followed by the generation's
// number and " of the running job ..." (MembershipOptions::waiting_to_join).
constexpr const char* kWaitingToJoin = "elastic: waiting to be let into generation ";

class LeftOutError;

class ElasticJob {
 public:
  // `store`: the job's store, served outside the workers (the launcher's or the agent's).
  // `beat_store` (none: no beats): a second connection to it, for a thread that beats the
  // generation this process is in (comm::beat, every comm::kBeatInterval) from start() until
  // the destructor, so that newcomers wait for it rather than begin the job again without it.
  ElasticJob(c10::intrusive_ptr<c10d::Store> store, ElasticOptions options,
             c10::intrusive_ptr<c10d::Store> beat_store = {});
  ~ElasticJob();
  ElasticJob(const ElasticJob&) = delete;
  ElasticJob& operator=(const ElasticJob&) = delete;

  // Joins the first generation (or, for a process started later, the next one): nullopt once in
  // it (generation()); the job's end when it ended meanwhile (comm::Membership::join).
  [[nodiscard]] std::optional<comm::JobEnded> start();
  // After `cause` (a failure's message; "" for a newcomer's regroup) at `step`: joins the next
  // generation (nullopt; generation()), or returns the job's end. Ranks the message names as gone
  // (dead, or silent past the heartbeat) and those in `also_gone` are reported, so that the
  // generation closes as soon as everyone else is there. Throws comm::Membership::join's errors,
  // StoreLostError when a store request fails, and LeftOutError instead of either when this
  // process, left out of a generation since its own (comm::Membership::leftOut), cannot get back
  // in (below MIN, the live generation does not let it in in time, or the store is gone).
  [[nodiscard]] std::optional<comm::JobEnded> regroup(int64_t step, const std::string& cause,
                                                      const std::vector<int>& also_gone = {});
  const comm::Generation& generation() const { return generation_; }
  bool joined() const { return generation_.number >= 0; }
  // A process waits for the next generation (one store request, no waiting). False once a store
  // request failed (said on the log), and not asked again in this generation: nobody can join
  // then, and the job goes on with the ranks it has until one is lost (its regroup then meets
  // StoreLostError, or, the store back, forms the next generation, where it is asked again).
  bool joinersWaiting();
  const ElasticOptions& options() const { return o_; }
  // One store request: this process is the first of its generation's members to claim the save
  // of the state they hold (comm::claimSave, the job's one election; throws the store's errors).
  // False, with no request, for a process that last tried a generation as no survivor of the one
  // before (left out of a generation since: its state is older than the job's).
  bool claimSave() { return membership_.triedAsSurvivor() && comm::claimSave(*store_, generation_.number); }
  // This run of the job: a random id the first process to start() set in the store (a run again,
  // with a store of its own, has another), the same on every process, newcomers included.
  const std::string& runId() const { return run_id_; }
  // The job has ended (its last rank 0 says so): the launcher serving the store may stop.
  void markEnded(comm::JobEnd how = comm::JobEnd::kFinished) { comm::markJobEnded(*store_, how); }
  // This process ends with an error: the job has ended once every rank of its generation has.
  // Nothing, for a process in no generation yet (its first join failed), or left out (after
  // LeftOutError: the others of its generation may have gone on, or been started again, without
  // it, and its count there could end the job they run).
  void markFailed() {
    if (joined() && !left_out_) comm::markJobFailed(*store_, generation_.number, generation_.size());
  }

  // Each generation's keys go when the next has formed (comm/key_log.h). The keys this process
  // writes under the current generation's prefix (its transports' and the agreement's): the
  // sync factory hands this log to the store it makes (StoreOptions::key_log).
  const std::shared_ptr<comm::KeyLog>& keyLog() const { return keys_; }
  // Once the generation's set-up is done: publishes this process's keys, so that the next
  // generation's rank 0 can delete them should this process die.
  void publishKeys();
  struct KeysDeleted {
    int64_t generation = -1;  // the generation before (-1: this process was in none)
    int64_t own = 0;          // this process's keys of it
    int64_t lost = 0;         // the keys the ranks lost from it had published (rank 0 deletes them)
  };
  // Once the next generation has formed and restored its state (nobody reads the old keys any
  // more): deletes this process's keys of the generation before, and on rank 0 the keys of the
  // ranks that generation lost.
  KeysDeleted deletePreviousKeys();

 private:
  // What start() and regroup() return: the generation joined becomes this process's (and the one
  // it beats), or the job's end is handed back.
  std::optional<comm::JobEnded> enter(comm::Membership::Joined joined);
  // The LeftOutError of a regroup that failed with `e` for a process left out (and remembers it).
  LeftOutError leftOut(const std::exception& e);
  c10::intrusive_ptr<c10d::Store> keysOf(int64_t generation) const;  // the store under that prefix

  ElasticOptions o_;
  c10::intrusive_ptr<c10d::Store> store_;
  comm::Membership membership_;
  comm::Generation generation_;
  std::string run_id_;
  bool store_lost_ = false;  // joinersWaiting met a failed store in this generation
  bool left_out_ = false;    // a regroup ended in LeftOutError
  std::shared_ptr<comm::KeyLog> keys_ = std::make_shared<comm::KeyLog>();
  // The generation left at the last regroup, until its keys are deleted.
  std::shared_ptr<comm::KeyLog> previous_keys_;
  int64_t previous_number_ = -1;
  int previous_rank_ = -1, previous_world_ = 0;
  // The beats (see the constructor): the generation beaten, and the thread's stop.
  c10::intrusive_ptr<c10d::Store> beat_store_;
  std::atomic<int64_t> beating_{-1};
  std::mutex beat_mutex_;
  std::condition_variable beat_stop_cv_;
  bool beat_stop_ = false;
  std::thread beater_;
};

// ElasticJob::regroup met a store that failed (a closed connection, a timeout): the process that
// served it is gone (node 0's launcher with its node, or the --rdzv-endpoint server), or the job
// ended. Nobody can regroup through it.
class StoreLostError : public comm::CommError {
 public:
  using CommError::CommError;
};

// ElasticJob::regroup of a process the others went on without (comm::Membership::leftOut) failed:
// below MIN, beside a live generation that does not let it in, or with the store gone. It is no
// survivor that saves: the job went on past the state it holds (claimSave is false for it). It
// ends with this error, exit 1 (its launcher may start it again as a newcomer), and records no
// end of the job, which may go on without it. (Remedy kNone: the flags are not the cause.)
class LeftOutError : public comm::CommError {
 public:
  explicit LeftOutError(const std::string& what) : CommError(what) {}
};

struct DistSpec;
struct LaunchPlan;
// A worker of an elastic job (dist.elastic()) started by aiacc's launcher: connects to the store
// the launcher serves (an InputError when nobody outside the workers serves it); the caller then
// joins the first generation, or the next one for a process started later (start()). MIN and MAX are in processes
// (nodes x the launcher's processes per node); members on the same host are local to each other.
std::shared_ptr<ElasticJob> makeElasticJob(const DistSpec& dist, const LaunchPlan& plan);

// The ranks a failure's message names as gone for good: "rank Q died", "rank Q stopped
// responding" (the transports' liveness messages, comm/transport.h). A rank that aborted or
// closed its transport is not named: it is a survivor regrouping too.
std::vector<int> lostRanksIn(const std::string& message);

}  // namespace aiacc::app
