// aiacc_train's distribution flags (launch, rendezvous, elastic range, communication) and the
// DistSpec built from them with the AIACC_* variables (app/flags.h); the other flags are in
// app/flags.cc.
#include <gflags/gflags.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "aiacc/common/error.h"
#include "app/flags.h"
#include "app/launcher.h"
#include "app/option_names.h"

DECLARE_string(timeline);  // app/flags.cc (an output, but the DistSpec carries it)
DECLARE_string(log_dir);   // glog's

// ---- Distribution -------------------------------------------------------------------------
DEFINE_int32(nproc, 1,
             "CPU worker processes on this node (one per GPU with --gpus). Under a launcher "
             "(torchrun, Kubeflow, srun, mpirun, horovodrun: their rank variables are read) the launcher "
             "starts the processes: leave it out (a different count is an error), except with srun "
             "--ntasks-per-node=1, where each task starts N workers on its node");
DEFINE_int32(gpus, 0,
             "GPUs on this node: one worker process per GPU (needs a CUDA build); under a "
             "launcher, its processes per node (each takes GPU local_rank % visible GPUs, so one GPU "
             "per task via CUDA_VISIBLE_DEVICES works)");
DEFINE_string(nnodes, "1",
              "nodes in the job (run aiacc_train on each with its --node-rank); a launcher's node count "
              "wins, a different --nnodes is an error. MIN:MAX (torchrun's spelling, e.g. 2:4) makes the "
              "job elastic under aiacc's own launcher: when a rank is lost (its process dies, or stops "
              "answering for 3 s) the others regroup within seconds, take the training state from the "
              "most advanced survivor and share out the rest of the epoch; a node started later joins at a "
              "step boundary; below MIN ranks the job waits --rdzv-timeout, then saves a checkpoint and "
              "exits 75. Without a range, a lost rank ends the job");
DEFINE_string(elastic_batch, "keep-per-rank",
              "elastic jobs: what stays when the world changes. keep-per-rank: each rank's --batch-size, so "
              "the global batch follows the world and the learning rate with it (linear rule); keep-global: "
              "the global batch of the job's first world, shared out over the ranks there are (uneven where "
              "they do not divide it, each image weighing the same), so the learning rate and the steps per "
              "epoch stay. Either way the schedule follows the samples consumed. No effect in a job of fixed "
              "size");
DEFINE_int32(max_restarts, 0,
             "elastic jobs (--nnodes MIN:MAX): how many times each node's launcher starts a worker that "
             "died again, to join the running job (not once the job's end is recorded in its rendezvous store: "
             "finished, stopped, or failed on every rank)");
DEFINE_double(rdzv_timeout, 600,
              "elastic jobs: seconds the ranks wait for at least MIN of them to regroup before they stop (the "
              "one of them saves a checkpoint, with --checkpoint-dir, and they exit 75; without it, 1); also how "
              "long node 0's launcher keeps the rendezvous store up for "
              "the other nodes after its own workers ended");
DEFINE_double(rdzv_last_call, 1.0,
              "elastic jobs: once MIN ranks are there, seconds a forming generation waits for more (it "
              "closes at once when MAX are there, or every lost rank is known)");
DEFINE_string(rdzv_endpoint, "",
              "HOST:PORT of a rendezvous store served outside the job (aiacc_train --rendezvous-server there, "
              "or any TCPStore); the launchers host none, so the job outlives any node, node 0 included. "
              "Replaces --master (give one of them)");
DEFINE_bool(rendezvous_server, false,
            "serve the rendezvous store at --rdzv-endpoint's port in this process, and nothing else, until a job "
            "it serves ends (an elastic job's last rank 0 says so) or SIGTERM / SIGINT; the job's launchers "
            "name it with the same --rdzv-endpoint");
DEFINE_int32(node_rank, 0, "this node's index, 0..nnodes-1 (a launcher's, e.g. GROUP_RANK, wins)");
DEFINE_int32(grace_seconds, aiacc::app::kDefaultGraceSeconds,
             "launcher (--nproc / --gpus): seconds the workers get to save a checkpoint and exit (code 75) "
             "after the first SIGTERM, SIGINT or SIGUSR1 the launcher forwards to them, before it SIGKILLs "
             "them; 1..3600. Keep it below the cluster's own wait before SIGKILL (30 s by default: Kubernetes' "
             "terminationGracePeriodSeconds, Slurm's KillWait). The same signal a second time: SIGKILL at once; "
             "another kind (Slurm's SIGUSR1 warning, then its SIGTERM) is forwarded and the grace period kept");
DEFINE_string(job_id, "",
              "the job's id: its ranks claim the rendezvous store under it, and a process of another "
              "job that reaches the store is refused. Default: the launcher's (torchrun run id, Slurm job.step, "
              "Open MPI job id), a fresh one for a one-node --nproc/--gpus job, else one derived from the layout");
DEFINE_string(master, "127.0.0.1:29500",
              "host:port of the rendezvous store (with --nproc/--gpus node 0's launcher hosts it, else rank 0); "
              "not given: a free port for a one-node --nproc/--gpus job, under torchrun / Kubeflow "
              "MASTER_ADDR:MASTER_PORT (torchrun's agent hosts the store there), in a Slurm step the step's first "
              "host at 29500 + the job id % 1000, with mpirun / mpiexec MASTER_ADDR:MASTER_PORT when exported, "
              "else on one node loopback at a port of the MPI job's id, with horovodrun its driver's host");
DEFINE_string(bind_host, "",
              "address this worker's Gloo transport listens on; default: "
              "127.0.0.1 for a local job, else the local address that routes to the --master host");
DEFINE_double(bucket_mb, aiacc::comm::kDefaultBucketMb, "gradient fusion bucket cap, MiB");
DEFINE_string(allreduce_dtype, aiacc::comm::transferDtypeName(aiacc::comm::CodecOptions{}.dtype),
              "gradient transfer dtype: fp32 | fp16 (scaled by a dynamic "
              "gradient scale, F16C conversion) | bf16 (unscaled); a non-finite reduce skips the step on "
              "every rank (fp16: and halves the scale). Gradients stay fp32 in the model. With --amp "
              "and an fp16 loss scaler, fp16 transfer uses the loss scale itself (one scale, not two "
              "multiplied); the report counts the skipped steps");
DEFINE_string(streams, "auto",
              "parallel communication channels (Gloo contexts), 1..16, or auto "
              "(the tuner tries 1, 2, 4; without --autotune: 2); a large bucket is split across them "
              "in proportion to each channel's measured speed");
DEFINE_bool(autotune, aiacc::app::defaultDataParallelOptions().autotune,
            "during the first 20-40 steps try fusion sizes (and channel counts with "
            "--streams auto, two-level reduction with --hierarchical auto between nodes), a few steps "
            "each, from step times averaged over ranks; re-time each change against the incumbent "
            "before taking it; freeze and log the fastest");
DEFINE_string(hierarchical, "auto",
              "two-level reduction: on | off | auto (on when there are "
              "several nodes with several ranks each): reduce-scatter inside the node, allreduce of "
              "each rank's shard between nodes, allgather inside the node");
DEFINE_int32(ranks_per_node, 0,
             "ranks per node for two-level reduction; 0: the launcher's local "
             "size (consecutive ranks form a node); set it to let one machine act as several nodes");
DEFINE_bool(shm, true,
            "shared memory between ranks of one host (NCCL-style SHM transport): for "
            "all collectives in a one-node job, for the intra-node stages of two-level reduction; "
            "--noshm: Gloo over loopback TCP");
DEFINE_string(bn_sync, aiacc::app::optionName(aiacc::comm::kDefaultBufferSync),
              "BatchNorm running stats across ranks. lazy: every rank's averaged "
              "only before they are read (evaluation, checkpoint, end of training): the same values "
              "as 'average', with no collective per step | average: averaged before each forward | "
              "broadcast: rank 0's, before each forward (PyTorch DDP's default) | none: each rank "
              "keeps its own (evaluation mixes them)");
DEFINE_bool(find_unused, aiacc::comm::ReducerOptions{}.detect_unused,
            "agree each step which parameters got no gradient on any rank (one flag per parameter, "
            "carried in the last gradient bucket); they are left out of the optimizer step");
DEFINE_double(comm_timeout, static_cast<double>(aiacc::comm::kDefaultTimeout.count()) / 1000.0,
              "seconds before a stalled rendezvous or collective is an error");

namespace aiacc::app {

std::string flagOfVariable(const char* variable) {
  std::string flag = std::string(variable).substr(std::strlen("AIACC_"));
  std::transform(flag.begin(), flag.end(), flag.begin(), [](unsigned char c) { return std::tolower(c); });
  return flag;
}

comm::DataParallelOptions defaultDataParallelOptions() {
  comm::DataParallelOptions o;
  o.autotune = true;
  o.tune.bucket_mb = {2, 8, 64};
  o.tune.channels = {2, 4};
  return o;
}

NodeRange parseNodeRange(const std::string& text) {
  NodeRange r;
  const size_t colon = text.find(':');
  auto number = [&](const std::string& part) {
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    AIACC_CHECK_INPUT(!part.empty() && end && *end == '\0' && v >= 1 && v <= 100000,
                      "--nnodes must be N or MIN:MAX "
                      "with 1 <= MIN <= MAX (got '",
                      text, "')");
    return static_cast<int>(v);
  };
  if (colon == std::string::npos) {
    r.min = r.max = number(text);
    return r;
  }
  r.min = number(text.substr(0, colon));
  r.max = number(text.substr(colon + 1));
  r.elastic = true;
  AIACC_CHECK_INPUT(r.min <= r.max, "--nnodes ", text, ": MIN must not exceed MAX");
  return r;
}

DistSpec distSpecFromFlags(const comm::EnvMap& env) {
  DistSpec d;
  d.launch.nproc = FLAGS_gpus > 0 ? FLAGS_gpus : FLAGS_nproc;
  const NodeRange nodes = parseNodeRange(FLAGS_nnodes);
  d.launch.nnodes = nodes.max;
  d.launch.min_nodes = nodes.elastic ? nodes.min : 0;
  AIACC_CHECK_INPUT(FLAGS_max_restarts >= 0 && FLAGS_max_restarts <= 1000, "--max-restarts must be 0..1000 (got ",
                    FLAGS_max_restarts, ")");
  d.launch.max_restarts = FLAGS_max_restarts;
  AIACC_CHECK_INPUT(FLAGS_rdzv_timeout > 0 && FLAGS_rdzv_last_call >= 0, "--rdzv-timeout must be > 0 and "
                                                                         "--rdzv-last-call >= 0 (seconds)");
  d.launch.rdzv_timeout = std::chrono::milliseconds(static_cast<int64_t>(FLAGS_rdzv_timeout * 1000));
  d.rdzv_last_call_s = FLAGS_rdzv_last_call;
  d.launch.node_rank = FLAGS_node_rank;
  d.launch.master = FLAGS_master;
  d.rendezvous_server = FLAGS_rendezvous_server;
  d.launch.log_dir = FLAGS_log_dir;
  d.launch.job_id = FLAGS_job_id;
  checkGraceSeconds(FLAGS_grace_seconds);
  d.launch.grace_seconds = FLAGS_grace_seconds;
  auto given = [](const char* name) {
    gflags::CommandLineFlagInfo info;
    return gflags::GetCommandLineFlagInfo(name, &info) && !info.is_default;
  };
  d.launch_flags.values = d.launch;
  if (given("nproc")) d.launch_flags.nproc = FLAGS_nproc;
  if (given("gpus")) d.launch_flags.gpus = FLAGS_gpus;
  if (given("nnodes")) d.launch_flags.nnodes = nodes.max;
  if (given("node_rank")) d.launch_flags.node_rank = FLAGS_node_rank;
  if (given("master")) d.launch_flags.master = FLAGS_master;
  if (!FLAGS_rdzv_endpoint.empty()) {
    AIACC_CHECK_INPUT(!given("master") || FLAGS_master == FLAGS_rdzv_endpoint,
                      "give --rdzv-endpoint or --master, not both: the store is at the endpoint");
    parseHostPort(FLAGS_rdzv_endpoint);
    d.launch.master = FLAGS_rdzv_endpoint;
    d.launch.external_store = !FLAGS_rendezvous_server;
    d.launch_flags.values = d.launch;
    d.launch_flags.master = FLAGS_rdzv_endpoint;
  }
  AIACC_CHECK_INPUT(!FLAGS_rendezvous_server || !FLAGS_rdzv_endpoint.empty(),
                    "--rendezvous-server needs --rdzv-endpoint HOST:PORT (the port it serves)");
  d.gpus = FLAGS_gpus;
  d.bind_host = FLAGS_bind_host;
  d.timeout_s = FLAGS_comm_timeout;
  if (FLAGS_streams == "auto") {
    d.streams = 0;
  } else {
    char* end = nullptr;
    const long k = std::strtol(FLAGS_streams.c_str(), &end, 10);
    AIACC_CHECK_INPUT(end && *end == '\0' && k >= 1 && k <= 16, "--streams must be 1..16 or auto (got '", FLAGS_streams,
                      "')");
    d.streams = static_cast<int>(k);
  }
  d.dp.reducer.bucket_mb = FLAGS_bucket_mb;
  AIACC_CHECK_INPUT(d.dp.reducer.bucket_mb > 0, "--bucket-mb must be positive");
  d.dp.autotune = FLAGS_autotune;
  d.dp.codec.dtype = parseOption<comm::TransferDtype>("--allreduce-dtype", FLAGS_allreduce_dtype);
  d.dp.buffers = parseOption<comm::BufferSync>("--bn-sync", FLAGS_bn_sync);
  d.dp.reducer.detect_unused = FLAGS_find_unused;
  // AIACC_BUCKET_MB sets what --bucket-mb does, and so on: the variable of a flag the command line
  // did not give applies (a recipe's values are defaults, which a variable overrides); those
  // without a flag (AIACC_FIRST_BUCKET_MB, AIACC_GRAD_SCALE) always.
  comm::EnvMap vars = env;
  for (const comm::EnvKnob& k : comm::envKnobs()) {
    if (given(flagOfVariable(k.name).c_str())) vars.erase(k.name);
  }
  const std::vector<std::string> applied = comm::applyEnvironment(d.dp, vars);
  if (std::find(applied.begin(), applied.end(), "AIACC_STREAMS") != applied.end()) d.streams = d.dp.striping.channels;
  // Streams: the tuner starts from one channel and tries 2 and 4 (auto), else the number given.
  d.dp.striping.channels = d.streams > 0 ? d.streams : (d.dp.autotune ? 1 : 2);
  if (d.streams > 0) d.dp.tune.channels.clear();
  d.shm = FLAGS_shm;
  d.timeline = FLAGS_timeline;
  d.hierarchical = parseOption<comm::TwoLevelMode>("--hierarchical", FLAGS_hierarchical);
  AIACC_CHECK_INPUT(FLAGS_ranks_per_node >= 0, "--ranks-per-node must be >= 0");
  d.ranks_per_node = FLAGS_ranks_per_node;
  AIACC_CHECK_INPUT(d.timeout_s > 0, "--comm-timeout must be positive");
  return d;
}

}  // namespace aiacc::app
