// The plain types of aiacc::comm's public interface: what a program fills in (the options of
// DataParallel's parts and of the process group) and what it gets back (a rank's place, the
// transports made). Each default is declared once, here; aiacc_train's --help and docs/comm.md
// read them from here. The classes that take these options (the Reducer, the codecs, the
// striping, the tuner, the store and the transport factory) are the library's own and are not
// installed: a program reaches them through DataParallel (data_parallel.h) and initProcessGroup
// (process_group.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "aiacc/comm/timeout.h"

namespace aiacc::comm {

class CommHook;   // comm_hook.h
class KeyLog;     // aiacc_train's record of an elastic job's keys (StoreOptions::key_log)
class Timeline;   // timeline.h
class Transport;  // transport.h

// ---- A rank's place --------------------------------------------------------------------------

struct WorldInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_size = 1;
};

// ---- What every rank must share ----------------------------------------------------------------

struct Setting {
  std::string name;   // as the user knows it, e.g. "--allreduce-dtype"
  std::string value;  // printable
};
using Settings = std::vector<Setting>;

// ---- The environment ---------------------------------------------------------------------------

using EnvMap = std::map<std::string, std::string>;

// A copy of this process's environment.
EnvMap currentEnvironment();

// The launcher that started this process, as initProcessGroup found it.
enum class LaunchSource { kNone, kAiacc, kTorchrun, kKubeflow, kEnv, kOpenMpi, kMpich, kHorovod, kSlurm };

// "torchrun", "Kubeflow", "Open MPI", ... (for messages).
const char* sourceName(LaunchSource s);

// ---- The process group: rendezvous store and transports ----------------------------------------

// torch.distributed's default store port (MASTER_PORT when a launcher gives none).
inline constexpr int kDefaultStorePort = 29500;

struct StoreOptions {
  std::string host = "127.0.0.1";  // rank 0's address (the server binds all interfaces)
  int port = kDefaultStorePort;
  int rank = 0;
  int world = 1;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::string prefix = "aiacc";
  // The launcher's agent (torchrun with TORCHELASTIC_USE_AGENT_STORE=True) already hosts the
  // server at host:port: every rank, rank 0 included, connects as a client.
  bool client_only = false;
  // Set: every key written through the store is recorded there, so that the writer can delete
  // its keys when they are no longer read (aiacc_train's elastic generations; programs leave it
  // empty).
  std::shared_ptr<KeyLog> key_log;
  // Non-empty: the store belongs to this job. The first process to connect claims it (one
  // compare-and-set of an unprefixed key); a process of another job is refused with a CommError
  // naming both ids, and touches none of the running job's keys.
  std::string job;
  // The store may be at any of the ports port .. port + port_tries - 1: a port derived from a job
  // id (mpirun's, Slurm's), which another job on the node may already hold. Rank 0 hosts it at
  // the first of them it can bind, and claims it for `job` (which must be set) at once; the other
  // ranks look through them for the store claimed for `job`, passing over another job's (or any
  // server that is not an aiacc store), until `timeout`. With client_only (a launcher hosts it,
  // at the first it could bind: hostJobStore) every rank looks. 1: only `port`.
  int port_tries = 1;
};

// Two-level reduction (intra-node reduce-scatter, inter-node allreduce, intra-node allgather).
enum class TwoLevelMode {
  kOff,
  kOn,
  kAuto,  // on between nodes with several ranks each
};

struct TransportSpec {
  WorldInfo world;
  int channels = 1;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::string bind_host = "127.0.0.1";  // where Gloo listens
  bool gpu = false;                     // tensors live on CUDA device `device`: NCCL
  int device = -1;                      // this rank's CUDA device; -1: world.local_rank
  bool shm = true;                      // shared memory between ranks of one host
  // Two-level reduction; where it applies (kOn, or kAuto between nodes) and tune_two_level is
  // set, the flat transport is primary and the two-level one the tuner's alternative.
  TwoLevelMode hierarchical = TwoLevelMode::kAuto;
  int ranks_per_node = 0;  // 0: world.local_size (consecutive ranks form a node)
  bool tune_two_level = false;
  std::shared_ptr<Timeline> timeline;
  // Notices from the transports, one line each (NCCL: its environment); default: none.
  std::function<void(const std::string&)> log;
};

// The transports made for a process group.
struct Transports {
  std::shared_ptr<Transport> primary;
  std::shared_ptr<Transport> alternative;  // two-level, for the tuner; null when not tuned
  std::string why;                         // one line: what was picked and why
};

// ---- DataParallel's parts ----------------------------------------------------------------------

// The default cap of a fused bucket, MiB (ReducerOptions::bucket_mb, the tuner's start;
// aiacc_train's --bucket-mb): PyTorch DDP's bucket_cap_mb.
inline constexpr double kDefaultBucketMb = 25;

// Buckets: which gradients travel together, and when.
struct ReducerOptions {
  // Cap of a fused bucket, MiB (kDefaultBucketMb, PyTorch DDP's bucket_cap_mb): larger buckets
  // mean fewer, more efficient collectives but a later start; the tuner tries others.
  double bucket_mb = kDefaultBucketMb;
  double first_bucket_mb = 1;  // small first bucket: communication starts early in backward
  // Agree each step which parameters got a gradient on any rank; those that got none anywhere keep
  // an undefined .grad (the optimizer skips them). Off: every parameter gets the averaged gradient
  // (zeros where unused). PyTorch DDP's find_unused_parameters.
  bool detect_unused = false;
  // Launch buckets as they fill during backward (overlap). Off: nothing launches before finish(),
  // which is then given the agreed set of parameters with a gradient (a central coordinator's).
  bool launch_in_backward = true;
  // After the first step, rebuild the buckets once in the order gradients arrived on rank 0.
  bool rebuild_after_first_step = true;
  // The user's own gradient transform (comm_hook.h) instead of the codec's transfer; the
  // transfer must then be fp32.
  std::shared_ptr<CommHook> hook;
};

// What a bucket sends:
//   - fp32: the bucket itself, divided by world size;
//   - fp16: gradients x (scale / world size) cast to fp16, reduced, cast back and divided by the
//     scale (a dynamic scale: halved on every overflow, doubled after scale_growth_steps clean
//     steps; under AMP the loss scaler's scale instead, DataParallel::shareLossScale);
//   - bf16: the same cast without a scale (bf16 has fp32's range; what it lacks is mantissa).
// A reduced-precision transfer is checked for inf/NaN after the reduce; every rank sees the same
// values, so all skip the step together.
enum class TransferDtype { kFloat32, kFloat16, kBFloat16 };

// "fp32", "fp16", "bf16": the --allreduce-dtype names.
constexpr const char* transferDtypeName(TransferDtype t) {
  switch (t) {
    case TransferDtype::kFloat16: return "fp16";
    case TransferDtype::kBFloat16: return "bf16";
    case TransferDtype::kFloat32: break;
  }
  return "fp32";
}

struct CodecOptions {
  TransferDtype dtype = TransferDtype::kFloat32;
  // fp16's own scale, until a loss scale is shared: start, and clean steps before it doubles
  // (halved on every overflow).
  double grad_scale = 1024;
  int scale_growth_steps = 200;
};

// Several channels: a bucket of at least min_split_bytes is cut into one piece per active
// channel, sized by each channel's measured speed (a moving average of bytes/s, balance_alpha the
// newest measurement's weight, the same on every rank); a smaller one goes whole to the next
// channel in turn.
struct StripingOptions {
  int channels = 0;  // active channels at the start (0 or more than the transport has: all)
  bool balance = true;
  double balance_alpha = 0.5;
  int64_t min_split_bytes = 256 * 1024;
};

// BN running statistics (floating-point buffers) across ranks. Training never reads them (train-
// mode BN normalizes with the batch's own statistics); evaluation and checkpoints do, after
// DataParallel::syncBuffers().
enum class BufferSync {
  kBroadcast,  // rank 0's, broadcast before each forward (DDP's default) and in syncBuffers()
  kAverage,    // every rank's averaged before each forward and in syncBuffers()
  // Every rank's averaged only in syncBuffers(), i.e. when they are about to be read: the same
  // values as kAverage (a running statistic is an exponential moving average, linear in its
  // updates, so the average of the ranks' averages is the average kAverage keeps), without a
  // collective, and the synchronisation point it forces, before every forward.
  kAverageWhenRead,
  kNone,  // each rank keeps its own
};

// The default (DataParallelOptions::buffers; aiacc_train's --bn-sync): the same values as
// kAverage without a collective per step. kBroadcast is PyTorch DDP's.
inline constexpr BufferSync kDefaultBufferSync = BufferSync::kAverageWhenRead;

// The names of BufferSync's values as AIACC_BN_SYNC and aiacc_train's --bn-sync write them.
constexpr const char* bufferSyncName(BufferSync b) {
  switch (b) {
    case BufferSync::kAverageWhenRead: return "lazy";
    case BufferSync::kAverage: return "average";
    case BufferSync::kBroadcast: return "broadcast";
    case BufferSync::kNone: break;
  }
  return "none";
}

// One configuration the tuner runs: fusion cap, active channels, two-level reduction.
struct TuneConfig {
  double bucket_mb = kDefaultBucketMb;
  int channels = 1;
  bool two_level = false;
  bool operator==(const TuneConfig& o) const {
    return bucket_mb == o.bucket_mb && channels == o.channels && two_level == o.two_level;
  }
  bool operator!=(const TuneConfig& o) const { return !(*this == o); }
  bool operator<(const TuneConfig& o) const {
    return std::tie(bucket_mb, channels, two_level) < std::tie(o.bucket_mb, o.channels, o.two_level);
  }
  // show_two_level: name the two-level setting (only meaningful when it is being tuned).
  std::string str(bool show_two_level = true) const;
};

// What the tuner tries in the first steps, one dimension at a time (two-level, then fusion,
// then channels), each candidate for steps_per_trial steps (the first discarded), from step
// times every rank averaged. A candidate wins by more than min_gain (or the machine's own
// step-to-step spread, if larger), confirmed by a second trial when `confirm` is on. Nothing by
// default: the program names the candidates.
struct TuneSpace {
  std::vector<double> bucket_mb;  // fusion caps to try (empty: keep the start's)
  std::vector<int> channels;      // channel counts to try (empty: keep)
  bool try_two_level = false;     // also try the other two-level setting
  int steps_per_trial = 3;
  double min_gain = 0.03;
  bool confirm = true;  // re-time a dimension's winner against the best before switching
};

}  // namespace aiacc::comm
