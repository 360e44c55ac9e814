// Command-line flags of aiacc_train (gflags), written with hyphens (--batch-size) or underscores,
// and the recipe file they can come from. Flags are parsed once, here; the result is a Config.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "app/config.h"
#include "app/launch_env.h"
#include "app/launcher.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/factory.h"
#include "data/sample_gen.h"

namespace aiacc::app {

// Prints every aiacc_train flag with its default and meaning.
void printHelp(const char* program);

// Applies a recipe file: "key = value" lines set flags the command line left at their defaults
// (flags override the recipe); "stage EPOCH size=S batch=B scale=M" lines define the stage
// schedule. Returns the stages (empty when the recipe has none). Throws InputError on unknown
// keys or malformed lines, naming the line.
std::vector<Stage> applyRecipe(const std::string& path, std::string* text);

// The recipe named by --recipe, applied to the flags (applyRecipe) and kept for the Config.
struct Recipe {
  std::string path;           // empty: no --recipe
  std::string text;           // the whole file, for the record
  std::vector<Stage> stages;  // empty when the recipe has none
};

// Applies --recipe, if given. Call it once, before any option object is built from the flags
// (distSpecFromFlags, configFromFlags), so that every recipe key, the distribution ones (nproc,
// gpus, bucket-mb, allreduce-dtype, streams, bn-sync, comm-timeout, timeline, ...) included,
// shapes what is built.
Recipe applyRecipeFlag();

// Builds the Config from the parsed flags and the applied recipe. Validates ranges.
Config configFromFlags(const Recipe& recipe);

// aiacc_train's own defaults for DataParallel where they differ from the library's: autotune on,
// from 1 channel, trying fusion caps of 2, 8 and 64 MiB and 2 or 4 channels.
comm::DataParallelOptions defaultDataParallelOptions();

// Distribution flags: how to launch, and the communication settings of each worker. Every
// value is validated here, once (names: app/option_names.h).
struct DistSpec {
  LaunchSpec launch;         // the flags' values (no launcher)
  LaunchFlags launch_flags;  // which launch flags the command line gave, for planLaunch()
  int gpus = 0;
  std::string bind_host;
  // DataParallel's options: --bucket-mb, --allreduce-dtype, --bn-sync, --find-unused, --autotune
  // and --streams (the tuner's start and search space), and the AIACC_* variables
  // (comm::applyEnvironment) for those the command line did not give. Precedence: the command
  // line, then the variable, then the recipe, then the default.
  // The transports, the timeline and the log are added where they exist (sync_factory.cc).
  comm::DataParallelOptions dp = defaultDataParallelOptions();
  int streams = 0;                                                                 // 0: auto
  bool shm = true;                                                                 // between the ranks of one host
  std::string timeline;                                                            // --timeline FILE (rank 0)
  double timeout_s = static_cast<double>(comm::kDefaultTimeout.count()) / 1000.0;  // --comm-timeout
  comm::TwoLevelMode hierarchical = comm::TwoLevelMode::kAuto;                     // --hierarchical
  int ranks_per_node = 0;                                                          // 0: the launcher's local size
  double rdzv_last_call_s = 1.0;                                                   // --rdzv-last-call (elastic jobs)
  bool rendezvous_server = false;  // --rendezvous-server: serve the store at launch.master, nothing else
  bool elastic() const { return launch.min_nodes > 0; }
};

// --nnodes: "N" (min = max = N) or "MIN:MAX" (elastic). A one-line InputError otherwise.
struct NodeRange {
  int min = 1, max = 1;
  bool elastic = false;
};
NodeRange parseNodeRange(const std::string& text);
// The flag an AIACC_* variable stands for: AIACC_BUCKET_MB, bucket_mb (which may not exist).
std::string flagOfVariable(const char* variable);
// From the flags, after applyRecipeFlag(); `env`: where the AIACC_* variables are read.
DistSpec distSpecFromFlags(const comm::EnvMap& env = comm::currentEnvironment());

// --make-sample DIR (empty when not given) and the generated dataset's shape.
std::string makeSampleFlag();
// --convert-weights IN (empty when not given) and --save-weights OUT.
std::pair<std::string, std::string> convertWeightsFlags();
// --keep-freed-memory (default on): main() calls keepFreedMemoryInHeap() before threads start.
bool keepFreedMemoryFlag();
// --dry-run: check the command line, print what would run (app/dry_run.h) and exit.
bool dryRunFlag();
data::SampleSpec sampleSpecFromFlags();

}  // namespace aiacc::app
