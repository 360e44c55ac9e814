// The harness of the elastic job tests (tests/elastic_test.cc, tests/elastic_rejoin_test.cc,
// tests/elastic_lab_test.cc): three emulated nodes of one job, each an aiacc_train launcher with
// one worker (--nproc 1) on a sample dataset of real JPEGs, a fault done to one of them on cue,
// and what the sample logs (AIACC_TEST_SAMPLE_LOG) and the report say afterwards.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc::app::test_elastic {

constexpr int kClasses = 6, kPerClass = 40;  // 240 training images
constexpr int kBatch = 8;
// A membership change's bytes (the report's "bytes": the state sent to each rank): below
// kPositionBytes when only the position travelled, above kModelBytes when the model did
// (kArch's 702,870 parameters and as much momentum: 5.4 MiB).
constexpr int64_t kPositionBytes = 256 << 10, kModelBytes = 4 << 20;
// The jobs' model: resnet18 narrowed to 1/16 of its parameters and work. What these tests check
// (membership, who saves, which samples) does not depend on the model's size, and resnet18's own
// 86 MiB of state made each job about 2.3x slower.
constexpr const char* kArch = "resnet18-w16";

// The job and what is done to it. Node 2's worker is $W in `act`; $L0..$L2 are the nodes'
// launchers.
struct JobSpec {
  std::string extra;                  // aiacc_train flags for every node (after the harness's own: they win)
  std::string nnodes = "2:3";         // --nnodes
  std::string act = "kill -KILL $W";  // the fault, a shell command
  // A shell test the act waits for (default: rank 0's first metrics line).
  std::string when = "[ -s m.jsonl ]";
  // Each node's aiacc_train gets Kubeflow's PET_* variables instead of the launch flags (an
  // elastic PyTorchJob's pods).
  bool kubeflow = false;
  // The store is served by a standalone `aiacc_train --rendezvous-server` (its exit code and log
  // in the output as rcS and logS); every node names it with --rdzv-endpoint and writes a report
  // (r<node>.json; Job::report: node 1's).
  bool server = false;
  // Not with `server`: once all three launchers ended, nodes 0 and 1 run the same job again with
  // --nnodes `again` --resume auto (exit codes again0=, again1=; Job::report: theirs).
  std::string again;
  std::string env;  // variables every node's processes get (VAR=value ..., in the job's folder)
  // Set: once the act is done and node 2's launcher has ended, node 2 starts again (a new
  // launcher, its log log2b, its exit code rc2) with these flags added.
  std::string restart_node2_with;
  // Runs node N's aiacc_train under this command, each "%N" in it replaced by the node (the
  // lab: "netlab.sh run %N --"), with the store at master_host.
  std::string node_prefix;
  std::string master_host = "127.0.0.1";
  // The sample dataset (d/ds): kClasses classes of `sample_shapes` shapes (the rest hues),
  // kPerClass training and `val_per_class` validation images each.
  int sample_shapes = 3;
  int val_per_class = 5;
  std::string arch = kArch;  // --arch
};

struct Job {
  std::string out;  // rc0=, rc1=, rc2= (and the others above), then every node's log
  Json report;
  std::map<int64_t, int> counts;  // epoch 0's samples: how often each was trained (kept steps only)
  std::string restores;
  int64_t trained = 0;  // images of the steps kept, all epochs (the sample logs)
};

// Three nodes of one job (its folder: d); the act once `when` holds. (The first generation waits
// up to 10 s for all three, --rdzv-last-call: with the default 1 s a node slow to start on a
// loaded machine joins later as a newcomer, and the fault meets a job the test did not mean, as
// it once did in CI.)
Job runKilledJob(const test::TempDir& d, const JobSpec& spec);

// No sample twice; unseen only the tail whole batches leave (under `world` ranks of kBatch, at
// most world x (kBatch - 1) + world - 1 samples of the epoch), in each world the epoch had.
void expectEachSampleOnce(const Job& job, int worlds_tail);

// A spec whose fault comes while every rank is held by the test hook `hold_variable`
// (AIACC_TEST_HOLD_EPOCH_EVAL or AIACC_TEST_HOLD_RUN_END, app/test_hooks.h): once the three have
// said so, node 2's worker is SIGKILLed, then the others are let go.
JobSpec killedWhileHeld(const std::string& hold_variable);

// A spec whose node 2 worker leaves and comes back, let in at a known step however fast the
// steps are (AIACC_TEST_HOLD_AT_STEP): every rank is held at step 2 while `fault` is done to
// node 2's worker ($W; then they are let go); the two ranks left (generation 1) are held again at
// step `back_at`, where `then` is done (for a worker its launcher starts again by itself:
// nothing), and let go once node 2's worker waits to be let into generation 2 (its log,
// app/elastic.h's kWaitingToJoin). Rank 0 looks for newcomers after the hold: it sees it at step
// `back_at`, and the vote that lets it in comes back at the next step (DataParallel answers a
// vote a step later), where the ranks regroup (or after that epoch's end, when it is its last).
JobSpec comesBackAt(int64_t back_at, const std::string& fault = "kill -KILL $W", const std::string& then = "true");

// Nodes 0 and 1 exited 0, and the report's first membership change took the world from 3 ranks
// to 2: that change (null, after a failure, when the report has none).
Json expectTwoOfThreeWentOn(const Job& job);

// All three nodes exited 0, node 2's worker (`started_again` by its launcher, and then its log
// says it joined; or continued) joined the running job, and the job ended with 3 ranks: the
// report's two membership changes, 3 -> 2 ranks and then 2 -> 3 at step `let_in_at`, and its
// world size.
void expectTheWorkerRejoined(const Job& job, int64_t let_in_at, bool started_again = true);

// The job, stopped in a world of 3 with its state saved, was run again on nodes 0 and 1
// (JobSpec::again): both exited 0 after the last epoch, in a world of 2, and no sample of the
// epoch the stop cut was trained twice over both runs.
void expectTheRunAgainEndedOnTwoNodes(const Job& job);

// The sample logs' lines of generation `g` (kept or redone): each line's sample count, by step.
std::map<int64_t, std::vector<size_t>> batchSizesOf(const std::string& dir, int64_t g);

}  // namespace aiacc::app::test_elastic
