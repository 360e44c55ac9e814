#include "app/test_hooks.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "aiacc/common/error.h"

namespace aiacc::app {

namespace {

// AIACC_TEST_FAIL_AT_STEP's RANK `*`.
constexpr int kEveryRank = -2;

// Creates `marker`, then waits until `release` exists (at most 10 minutes).
void holdUntilReleased(const std::string& marker, const std::string& release, int64_t note) {
  std::ofstream(marker) << note << "\n";
  std::error_code ec;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  while (!std::filesystem::exists(release, ec) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The whole of `text` as a number in [lo, hi]; otherwise an input error that says what `name` must be.
int parseBounded(const char* name, const char* text, long lo, long hi, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  AIACC_CHECK_INPUT(*text != '\0' && *end == '\0' && v >= lo && v <= hi, name, " must be ", what, " (got '", text,
                    "')");
  return static_cast<int>(v);
}

// A hold's STEP:FILE (STEP at least min_step); otherwise an input error that names `name`.
struct StepFile {
  int64_t step = 0;
  std::string file;
};
StepFile parseStepFile(const char* name, const std::string& value, long min_step) {
  const size_t colon = value.find(':');
  AIACC_CHECK_INPUT(colon != std::string::npos && colon + 1 < value.size(), name, " must be STEP:FILE (got '", value,
                    "')");
  return {parseBounded(strCat(name, "'s STEP").c_str(), value.substr(0, colon).c_str(), min_step, 1 << 30, "a step"),
          value.substr(colon + 1)};
}

}  // namespace

CheckpointFaultHook checkpointHoldHook(const std::string& value) {
  const StepFile hold = parseStepFile("AIACC_TEST_HOLD_CHECKPOINT", value, 0);
  return [hold](CheckpointPhase phase, int64_t at) {
    if (phase == CheckpointPhase::kMidPayload && at == hold.step) holdUntilReleased(hold.file + ".held", hold.file, at);
  };
}

TestHooks testHooksFromEnvironment(const std::function<const char*(const char*)>& get) {
  TestHooks h;
  if (const char* hold = get("AIACC_TEST_HOLD_CHECKPOINT")) {
    h.checkpoint = checkpointHoldHook(hold);
    h.notes.push_back(std::string("AIACC_TEST_HOLD_CHECKPOINT=") + hold + ": a test's fault hook is set");
  }
  if (const char* off = get("AIACC_BENCH_NO_STEP_VOTE"); off && std::string(off) == "1") {
    h.step_vote = false;
    h.notes.push_back(
        "AIACC_BENCH_NO_STEP_VOTE=1: no per-step vote; a stop signal or --checkpoint-every by time is not agreed and "
        "does nothing");
  }
  if (const char* off = get("AIACC_BENCH_NO_SURVIVOR_SAVE"); off && std::string(off) == "1") {
    h.survivor_save = false;
    h.notes.push_back(
        "AIACC_BENCH_NO_SURVIVOR_SAVE=1: a lost rank stops this job without the survivor's checkpoint (a benchmark's "
        "torchrun-style baseline)");
  }
  if (const char* ab = get("AIACC_BENCH_STEP_VOTE_AB")) {
    const int k = parseBounded("AIACC_BENCH_STEP_VOTE_AB", ab, 1, 1000000, "a number of steps, 1 or more");
    AIACC_CHECK_INPUT(h.step_vote, "AIACC_BENCH_STEP_VOTE_AB and AIACC_BENCH_NO_STEP_VOTE=1 exclude each other");
    h.step_vote_ab = k;
    h.notes.push_back(std::string("AIACC_BENCH_STEP_VOTE_AB=") + ab + ": the per-step vote after " + ab +
                      " steps in turn, then none after " + ab + " (a benchmark's A/B)");
  }
  if (const char* path = get("AIACC_TEST_SAMPLE_LOG")) h.sample_log = path;
  if (const char* skew = get("AIACC_TEST_SKEW_AT_REGROUP"); skew && std::string(skew) == "1") {
    h.skew_at_regroup = true;
    h.notes.push_back("AIACC_TEST_SKEW_AT_REGROUP=1: at a regroup, the survivors but rank 0 change a parameter");
  }
  if (const char* late = get("AIACC_TEST_LATE_TO_REGROUP_MS")) {
    h.late_to_regroup_ms = parseBounded("AIACC_TEST_LATE_TO_REGROUP_MS", late, 1, 600000, "milliseconds, 1 to 600000");
    h.notes.push_back(std::string("AIACC_TEST_LATE_TO_REGROUP_MS=") + late +
                      ": at a regroup, every process but rank 0 arrives that late");
  }
  if (const char* setups = get("AIACC_TEST_FAIL_SETUP")) {
    h.fail_setups = parseBounded("AIACC_TEST_FAIL_SETUP", setups, 1, 100, "a number of set-ups, 1 to 100");
    h.notes.push_back(std::string("AIACC_TEST_FAIL_SETUP=") + setups +
                      ": the set-up of a generation with no newcomer fails that many times");
  }
  if (const char* fail = get("AIACC_TEST_FAIL_AT_STEP")) {
    const std::string v = fail;
    const size_t colon = v.find(':');
    AIACC_CHECK_INPUT(colon != std::string::npos, "AIACC_TEST_FAIL_AT_STEP must be RANK:STEP (got '", v, "')");
    const int fail_rank = v.substr(0, colon) == "*"
                              ? kEveryRank
                              : parseBounded("AIACC_TEST_FAIL_AT_STEP's RANK", v.substr(0, colon).c_str(), 0, 1 << 20,
                                             "a rank or *");
    const int64_t fail_step = parseBounded("AIACC_TEST_FAIL_AT_STEP's STEP", v.substr(colon + 1).c_str(), 1, 1 << 30,
                                           "a step");
    h.step_end = [fail_rank, fail_step](int rank, int64_t step) {
      if ((rank == fail_rank || fail_rank == kEveryRank) && step == fail_step) {
        AIACC_THROW(Error, "AIACC_TEST_FAIL_AT_STEP: rank ", rank, " fails after step ", step, " (a test's own error)");
      }
    };
    h.notes.push_back("AIACC_TEST_FAIL_AT_STEP=" + v +
                      ": that rank (*: every rank) throws an error of its own after that step");
  }
  if (const char* hold = get("AIACC_TEST_HOLD_AT_STEP")) {
    const std::string v = hold;
    std::vector<StepFile> holds;
    for (size_t from = 0; from <= v.size();) {
      const size_t comma = std::min(v.find(',', from), v.size());
      holds.push_back(parseStepFile("AIACC_TEST_HOLD_AT_STEP", v.substr(from, comma - from), 1));
      from = comma + 1;
    }
    h.step_end = [holds, then = std::move(h.step_end)](int rank, int64_t step) {
      if (then) then(rank, step);
      for (const StepFile& at : holds) {
        if (step == at.step) holdUntilReleased(at.file + ".held." + std::to_string(::getpid()), at.file, step);
      }
    };
    h.notes.push_back("AIACC_TEST_HOLD_AT_STEP=" + v + ": every process waits for the file after that step");
  }
  if (const char* die = get("AIACC_TEST_DIE_JOINING")) {
    const std::string v = die;
    AIACC_CHECK_INPUT(v == "settings" || v == "restore", "AIACC_TEST_DIE_JOINING must be settings or restore (got '", v,
                      "')");
    h.die_joining = v == "settings" ? JoinDeath::kSettings : JoinDeath::kRestore;
    h.notes.push_back("AIACC_TEST_DIE_JOINING=" + v + ": a process joining the running job kills itself at its " + v);
  }
  if (const char* hold = get("AIACC_TEST_HOLD_EPOCH_EVAL")) {
    const std::string release = hold;
    AIACC_CHECK_INPUT(!release.empty(), "AIACC_TEST_HOLD_EPOCH_EVAL must name a file");
    h.epoch_eval = [release] {
      holdUntilReleased(release + ".held." + std::to_string(::getpid()), release, ::getpid());
    };
    h.notes.push_back("AIACC_TEST_HOLD_EPOCH_EVAL=" + release + ": each epoch's end evaluation waits for the file");
  }
  if (const char* hold = get("AIACC_TEST_HOLD_RUN_END")) {
    const std::string release = hold;
    AIACC_CHECK_INPUT(!release.empty(), "AIACC_TEST_HOLD_RUN_END must name a file");
    h.run_end = [release] { holdUntilReleased(release + ".held." + std::to_string(::getpid()), release, ::getpid()); };
    h.notes.push_back("AIACC_TEST_HOLD_RUN_END=" + release + ": the run's end waits for the file");
  }
  return h;
}

}  // namespace aiacc::app
