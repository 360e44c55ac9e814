// Elastic membership: which processes form the job's next generation, decided through the
// rendezvous store with no coordinator process.
//
// A generation is one fixed world: its ranks, its transports (under its own key prefix), its
// steps. When a rank is lost, or a process asks to join, every live process calls join() for
// the next generation. Each arrival takes a ticket (one atomic add); any waiting member closes
// the generation (one compare-and-set, so all see the same count) as soon as
//   - MAX processes have arrived, or
//   - MIN have arrived and every rank of the previous generation is accounted for (arrived, or
//     reported lost by an arrival: the usual case, a node gone, closes at once), or
//   - MIN have arrived and the last call (MembershipOptions::last_call) has passed since then;
//     but a generation after the first that no survivor has reached (newcomers only) closes
//     this way only once the previous generation's beat (beat(), every live member of it, in the
//     background) has stood still for MembershipOptions::beat_stale: while it beats, its
//     members are alive (in a long step, an evaluation, a failed set-up) and will come (the last
//     call then runs from the first survivor's arrival); a generation of newcomers alone would
//     begin the job again beside them.
// Below MIN, members wait up to MembershipOptions::timeout, then fail with a CommError saying
// how many came. The closer writes the roster (one key) and deletes the generation before the
// previous one's keys. A process that arrives after the close is not in the generation: it
// waits for the next one (the running group sees it through joinersWaiting() at a step
// boundary and regroups to let it in).
//
// Rank order: survivors of the previous generation first (the one at the highest completed step
// first, then by their old rank), then newcomers by the rank their launcher gave them (-1: none),
// then in arrival order. So a first generation keeps the launchers' ranks. So the new rank 0 holds the
// most advanced state, and the training state is restored from it.
//
// Store requests per generation: 3 to 5 per member and one per poll while it waits (a poll
// reads two counters; a newcomer's, with no survivor there yet, one more, and the beat at most
// twice per kBeatInterval), plus the closer's one
// per member to read the records: O(world), never O(world^2). And the beats: one request per
// live member every kBeatInterval (2 per second each: 8k per second at 4096 ranks).
//
// One record per generation, and why its arrivals are counters. A generation's membership is one
// record, its roster (one key), written once by the member whose compare-and-set of the close
// won; everyone reads it, nobody changes it. What leads to it is not one record on purpose:
// torchelastic's dynamic rendezvous keeps one state record that each participant reads,
// changes and compare-and-sets, retrying when another got there first. That suits one agent per
// node; here every process (a GPU each) arrives, and N arrivals at once on one record cost
// O(N^2) requests and retries (4096 at 512 nodes of 8). So each arrival is one atomic add (its
// ticket) and one write of its own record (m<ticket>), and the close's decision reads counters
// (arrivals, survivors, lost) that the adds keep exact: O(world) requests, no retry. The other
// keys are the generation's life after the close: its beat, its failed ranks, the waiters that
// left (gone), and the one election of the survivor that saves (saver, claimSave). Their names
// and meanings are listed in app/run_phase.h with the job's other keys.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "aiacc/comm/clock.h"
#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/job_end.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

struct MembershipOptions {
  int min = 1;  // a generation needs at least MIN processes ...
  int max = 1;  // ... and takes at most MAX
  // Once MIN have arrived, how long a generation waits for more (unless every rank of the
  // previous generation is already accounted for, or MAX have come).
  std::chrono::milliseconds last_call{1000};
  // How long a member waits below MIN before giving up (CommError, Remedy::kMembership).
  std::chrono::milliseconds timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds poll{10};  // between two looks at the arrivals while waiting
  // How long the previous generation's beat must stand still before newcomers alone may close
  // the next (its members all gone: killed at once, their workers started again).
  std::chrono::milliseconds beat_stale{std::chrono::seconds(3)};
  // The time of every wait above (null: steadyClock(); tests inject one they move, comm/clock.h).
  std::shared_ptr<const Clock> clock;
  // Called each time a process that holds no state of the generation before (a newcomer, or one
  // the others went on without) has arrived for a generation after the first, its ticket taken,
  // before it waits to be let in (again for the next generation if that one closes without it):
  // the running group's rank 0 sees it from its next step boundary (joinersWaiting). Empty:
  // nothing is said.
  std::function<void(int64_t generation)> waiting_to_join;
};

// How often a member of a generation says it is alive (beat()); well under beat_stale.
constexpr std::chrono::milliseconds kBeatInterval{500};
// One beat of a live member of `generation`: one store request (`store` as Membership's).
void beat(c10d::Store& store, int64_t generation);

// One process as it arrives for a generation.
struct Member {
  int64_t generation = -1;  // the generation it comes from (-1: a process that was in none)
  int rank = -1;            // its rank there (a newcomer: its launcher's rank, or -1)
  int64_t step = 0;         // the last step it completed (its training state's)
  std::string node;         // its node: members with the same node are local to each other (no spaces)
};

struct Generation {
  int64_t number = -1;
  std::vector<Member> members;  // in rank order
  int rank = -1;                // this process's rank
  int arrivals = 0;             // tickets taken before the close (members + any refused later)

  int size() const { return static_cast<int>(members.size()); }
  // Rank, world, and local rank and size among the members on this process's node.
  WorldInfo world() const;
  // The key prefix of this generation's transports and agreement.
  std::string prefix() const { return prefixOf(number); }
  static std::string prefixOf(int64_t generation) { return "g" + std::to_string(generation); }
  // Rank r was in generation `number - 1` (a survivor: it holds the training state).
  bool isSurvivor(int r) const;
  // Ranks that were in generation `number - 1` (survivors).
  int survivors() const;
  // Ranks of the previous generation absent from this one.
  std::vector<int> lostFrom(int previous_world) const;
};

class Membership {
 public:
  // `store`: the job's store (already under the job's prefix); it must outlive every worker (a
  // launcher's or a rendezvous server's, not one hosted by a rank).
  Membership(c10::intrusive_ptr<c10d::Store> store, MembershipOptions options);

  // Blocks until this process is in a generation, and returns it; or returns JobEnded when the
  // job ended while this process waited and it holds no state the job wants (a process started
  // again too late to take part, one late by a generation or more, or a survivor below MIN after
  // the job finished). `self.generation` says which generation it leaves
  // (-1: none yet); `lost` lists that generation's ranks it knows are gone, and `previous_world`
  // its size (both only speed up the close). Throws CommError when fewer than MIN arrive within
  // options.timeout (Remedy::kMembership), or when a survivor waiting below MIN learns that the
  // job stopped (JobEnd::kStopped or kStoppedUnsaved: another survivor gave up first, and this
  // one stops as it did; also kMembership), or a store request fails.
  using Joined = std::variant<Generation, JobEnded>;
  [[nodiscard]] Joined join(const Member& self, const std::vector<int>& lost = {}, int previous_world = 0);

  // One store request, no waiting: has any process arrived for the generation after `current`?
  // (A running group asks at each step boundary; the answer is then voted, so all regroup at
  // the same step.)
  bool joinersWaiting(const Generation& current);

  // The newest generation that closed (-1: none yet).
  int64_t current();

  const MembershipOptions& options() const { return o_; }
  // This process arrived as a survivor (a member of the generation before) at the last
  // generation it tried; false for a newcomer, and for a process late by a generation or more
  // (its state is older than the job's: it must never save it for the job, claimSave).
  bool triedAsSurvivor() const { return tried_as_survivor_; }
  // The last join of a process in a generation went past the one after its own (a generation
  // closed without it: the others went on without it). Set before that try's first store
  // request, so that it holds when the try fails (a timeout below MIN, a store gone); false for
  // a process in no generation, and for a survivor whose first request failed.
  bool leftOut() const { return left_out_; }

 private:
  // Tries generation `number` once; nullopt when it closed without this process.
  std::optional<Joined> tryJoin(int64_t number, const Member& self, const std::vector<int>& lost, int previous_world);
  // Closes `number` at `count` arrivals (or learns who closed it at how many); returns the count.
  int close(int64_t number, int count);
  // The closer: reads the first `count` records, writes the roster, retires older keys.
  void writeRoster(int64_t number, int count);
  void deleteGeneration(int64_t number);

  c10::intrusive_ptr<c10d::Store> store_;
  MembershipOptions o_;
  bool tried_as_survivor_ = false;
  bool left_out_ = false;
};

// The job's end, said in the store by its last rank 0, so that a launcher serving the store
// knows it may stop serving. `store` as Membership's. kStopped overwrites any end (a survivor
// saved the state); the others are written only where none is (a compare-and-set), so that a
// stop is never overwritten by a later kFinished. How it ended decides what a survivor still
// waiting to regroup does (join()): after kStopped or kStoppedUnsaved (a survivor gave up below
// MIN, or a stop request) it stops as that survivor did, and saves what it holds if it came
// first; after kFinished it has nothing left to do (join returns JobEnded), as has any process
// that holds no state. kFailed: every rank of a generation ended with an error (markJobFailed).
void markJobEnded(c10d::Store& store, JobEnd how = JobEnd::kFinished);
bool jobEnded(c10d::Store& store);
JobEnd jobEndedHow(c10d::Store& store);  // (once jobEnded)
// A rank of generation `generation` (of `size` ranks) ended with an error. The error may be its
// own (memory, a disk): the others go on without it, as after a lost rank (a survivor below MIN
// waits, then saves its state and stops resumable). Once every rank of that generation has
// failed (the error is everyone's: settings, data), the job has ended (JobEnd::kFailed): a
// launcher may stop serving the store, and join() tells a process still waiting to join so
// (JobEnded, kFailed).
void markJobFailed(c10d::Store& store, int64_t generation, int size);
// Some process still waits to be let into the open generation (it arrived, and has neither been
// let in nor left). A launcher serving the store goes on serving after the job's end until
// none does, so that a survivor still waiting below MIN, or a joiner, reads how the job ended
// instead of meeting a closed store.
bool waitersRemain(c10d::Store& store);

// The job's one election of the survivor that saves: true for the first of generation
// `generation`'s members to claim it, in one store request (`store` as Membership's; the key,
// "elastic/g<G>/saver", goes with the generation's). A generation's members hold one state, and
// one of them saves it when they stop without another generation: its set-up failed twice, too
// few came back for the next (below MIN), or a rank was lost in a job of fixed size (generation 0
// for good). Throws the store's errors: with the store gone nobody can be elected, and the
// survivors save in turn under a lock in the checkpoint folder (app/trainer_state.h, saveInTurn).
bool claimSave(c10d::Store& store, int64_t generation);

// A member's record and a roster as the store holds them (exposed for tests).
std::string encodeMember(const Member& m);
Member decodeMember(const std::string& s);

}  // namespace aiacc::comm
