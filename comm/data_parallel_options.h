// DataParallelOptions: DataParallel's settings, made of its parts' own options (options.h,
// where each default is declared once, and read from there by aiacc_train's --help and by
// docs/comm.md), plus the few things that belong to DataParallel itself.
//
// The main knobs can also come from the environment, parsed here and only here
// (applyEnvironment): a launcher's job spec can tune a program without a rebuild, and aiacc_train
// reads the same variables into the same struct before its flags (a flag given on the command line
// wins over the variable).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/comm_hook.h"
#include "aiacc/comm/options.h"
#include "aiacc/comm/timeline.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

struct DataParallelOptions {
  // Buckets: fusion cap, first bucket, unused parameters, the rebuild after step 1, a comm hook
  // (options.h). reducer.launch_in_backward must stay on (off is a central coordinator's).
  ReducerOptions reducer;
  // What a bucket sends: fp32, fp16 with its own dynamic scale, bf16 (options.h). Under
  // AMP fp16 the loss scaler's scale replaces fp16's own (shareLossScale): gradients arrive scaled
  // once, never twice. A non-finite reduced gradient is seen identically by every rank: all skip
  // the step (finishBackward returns false). Gradients stay fp32 in the model.
  CodecOptions codec;
  // How a bucket is spread over the transport's channels (options.h).
  StripingOptions striping;
  // BatchNorm running statistics across ranks (options.h).
  BufferSync buffers = kDefaultBufferSync;
  // At construction, rank 0's parameters are broadcast to every rank (as DDP's init_sync). Off,
  // for a caller that makes them equal itself right after and knows where they already are: an
  // elastic job's restore compares every rank's hash with rank 0's and sends the model only to
  // ranks that differ, instead of the whole model to every rank at every regroup. The buffers
  // are broadcast either way.
  bool broadcast_parameters = true;
  // The step's gradients are finished inside backward(), as DDP's are: the first gradient hook
  // of each backward queues a callback that autograd runs as backward() ends, and it does what
  // finishBackward() does. `loss.backward(); optimizer.step();` is then the whole step. A step
  // every rank skips (a non-finite fp16 transfer, a comm hook's verdict) leaves every .grad
  // undefined, so LibTorch's optimizers leave the parameters alone; lastStepSkipped() and
  // skippedSteps() say so. A communication error is thrown by backward(). finishBackward() after
  // such a backward returns its result and does nothing more. Off: the caller calls
  // finishBackward() after each backward (aiacc_train does: it times and votes around it).
  bool finish_in_backward = true;
  // Autotune: from the second step on, try the fusion caps and channel counts of `tune` (and
  // two-level reduction when `two_level` is given), a few steps each, and freeze the fastest
  // (options.h). Every rank averages its step times with one allreduce, so all decide alike.
  bool autotune = false;
  TuneSpace tune;
  // A second transport over the same ranks (two-level reduction) the tuner may switch to.
  std::shared_ptr<Transport> two_level;
  // Tuner decisions and bucket readiness as instant events (rank 0).
  std::shared_ptr<Timeline> timeline;
  // Seconds on a monotonic clock, for the tuner's step times and the exposed communication
  // (empty: steady_clock; tests inject a fake one).
  std::function<double()> clock;
  // Notices, one line each (the tuner's choice when it freezes), on every rank it is given to;
  // default: none (a library writes nothing to the process's streams).
  std::function<void(const std::string&)> log;
};

// The settings every rank must share, by name ("reducer.bucket_mb", "codec.dtype", ...; the hook
// by its name, the two-level transport by whether there is one): DataParallel compares them
// across ranks at construction.
Settings optionSettings(const DataParallelOptions& o);

// One environment variable and the option it sets.
struct EnvKnob {
  const char* name;    // e.g. "AIACC_BUCKET_MB"
  const char* sets;    // e.g. "reducer.bucket_mb"
  const char* values;  // e.g. "MiB > 0"
};
// Every variable applyEnvironment reads, in the order docs/comm.md lists them:
//   AIACC_BUCKET_MB, AIACC_FIRST_BUCKET_MB, AIACC_ALLREDUCE_DTYPE (fp32|fp16|bf16),
//   AIACC_GRAD_SCALE, AIACC_STREAMS (channels, 1..16), AIACC_BN_SYNC (lazy|average|broadcast|none),
//   AIACC_FIND_UNUSED and AIACC_AUTOTUNE (1|on|true|yes, 0|off|false|no).
const std::vector<EnvKnob>& envKnobs();

// Sets each option whose variable `env` holds (an empty value counts as unset) and returns the
// names of the variables applied. Throws InputError naming the variable and the values it takes
// for a value it cannot parse (never a silent default), and then leaves `options` as it was.
std::vector<std::string> applyEnvironment(DataParallelOptions& options, const EnvMap& env = currentEnvironment());

// The defaults with the environment applied: DataParallelOptions{} then applyEnvironment.
DataParallelOptions optionsFromEnvironment(const EnvMap& env = currentEnvironment());

}  // namespace aiacc::comm
