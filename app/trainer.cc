#include "app/trainer.h"

#include <ATen/Parallel.h>
#include <unistd.h>
#include <sys/resource.h>
#include <glog/logging.h>
#include <torch/nn/functional/loss.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "app/amp.h"
#include "app/checkpoint.h"
#include "app/fused_sgd.h"
#include "app/job_settings.h"
#include "app/launch_env.h"
#include "app/option_names.h"
#include "app/trainer_state.h"
#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "data/device_input.h"
#include "data/entropy_gate.h"
#include "data/loader.h"
#include "models/resnet.h"
#include "models/torch_format.h"
#include "models/weights.h"

namespace aiacc::app {

SyncFactory localSync() {
  return [](std::shared_ptr<torch::nn::Module>, const comm::Settings&) { return std::make_unique<comm::LocalSync>(); };
}

Trainer::Trainer(Config config, comm::WorldInfo world, SyncFactory make_sync, Clock::time_point start)
    : s_(std::make_unique<State>(std::move(config), world, std::move(make_sync), start)) {}
Trainer::~Trainer() = default;

void Trainer::setTimeline(std::shared_ptr<comm::Timeline> timeline) {
  s_->timeline = std::move(timeline);
  if (s_->timeline) s_->timeline->nameRow(0, "compute");
}

void requireVisibleGpus(int n) {
  AIACC_CHECK_INPUT(torch::cuda::is_available(), "--gpus needs a CUDA build of aiacc and a visible GPU "
                                                 "(this LibTorch sees none); use --nproc N for CPU worker processes");
  const int count = static_cast<int>(torch::cuda::device_count());
  AIACC_CHECK_INPUT(n <= count, n, " GPU(s) needed (--gpus) but ", count,
                    " are visible (check --gpus and CUDA_VISIBLE_DEVICES)");
}

// One GPU per process: cuda:(local_rank % visible GPUs) becomes this thread's current device, so
// that NCCL, cuDNN and every allocation without an explicit device land on it (with one GPU per
// task, CUDA_VISIBLE_DEVICES leaves each process its own device 0).
void Trainer::State::setupDevice() {
  if (!cfg.cuda) return;
  requireVisibleGpus(1);
  const int index = gpuForLocalRank(world_info.local_rank, static_cast<int>(torch::cuda::device_count()));
  device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
  at::globalContext().setBenchmarkCuDNN(cfg.cudnn_benchmark);
}

void Trainer::setData(std::unique_ptr<data::BatchSource> train, std::unique_ptr<data::BatchSource> val) {
  AIACC_CHECK_INPUT(train && val, "Trainer::setData needs both a train and a val source");
  s_->train = std::move(train);
  s_->val = std::move(val);
  s_->data_name = "in-memory batches";
  s_->dataset = strCat("in-memory batches: ", s_->train->numClasses(), " classes, ", s_->train->shardSize(),
                       " train images per rank");
}

void Trainer::State::setupData() {
  rank = world_info.rank;
  world = world_info.world;
  if (train) return;  // given by setData
  if (cfg.data == "synthetic") {
    data_name = "synthetic";
    auto t = std::make_unique<data::SyntheticSource>(cfg.synthetic_images, cfg.synthetic_classes, cfg.channels_last,
                                                     cfg.seed, rank, world);
    const int64_t val_images = std::max<int64_t>(cfg.synthetic_images / 50, 2 * world);
    auto v = std::make_unique<data::SyntheticSource>(val_images, cfg.synthetic_classes, cfg.channels_last, cfg.seed + 1,
                                                     rank, world, /*drop_last=*/false);
    t->setDevice(device);  // generated once on the device: no copy per step
    v->setDevice(device);
    train = std::move(t);
    val = std::move(v);
    dataset = strCat("synthetic: ", cfg.synthetic_images, " images, ", cfg.synthetic_classes, " classes");
    return;
  }
  AIACC_CHECK_INPUT(!cfg.data.empty(), "no --data given (an ImageNet-layout folder, or 'synthetic'; "
                                       "scripts/run.sh generates a sample dataset)");
  data::ImageNetLayout layout = data::scanImageNet(cfg.data);
  data_name = cfg.data;
  ignored_files = static_cast<int64_t>(layout.train.ignored.size() + layout.val.ignored.size());
  for (const auto* f : {&layout.train, &layout.val}) {
    for (const auto& p : f->ignored) LOG(WARNING) << "ignoring file without an image extension: " << p;
  }
  data::LoaderOptions lo;
  lo.workers = cfg.workers;
  lo.prefetch = cfg.prefetch;
  lo.jpeg_index_bytes = static_cast<size_t>(cfg.jpeg_index_mb) << 20;
  lo.max_image_pixels = cfg.max_image_pixels;
  lo.huffman = cfg.libjpeg_huffman ? data::HuffmanDecoder::kLibjpegTurbo : data::huffmanTakeover().decoder();
  lo.crop.scale_max = cfg.scale_max;
  lo.crop.ratio_min = cfg.ratio_min;
  lo.crop.ratio_max = cfg.ratio_max;
  lo.crop_fraction = cfg.crop_fraction;
  lo.resize = cfg.resize;
  lo.channels_last = cfg.channels_last;
  lo.bytes = cfg.cuda;       // uint8 batches, normalized on the GPU
  lo.pin_memory = cfg.cuda;  // asynchronous host-to-device copies
  lo.seed = cfg.seed;
  lo.rank = rank;
  lo.world = world;
  lo.train = true;
  const size_t n_train = layout.train.samples.size(), n_val = layout.val.samples.size();
  dataset = datasetFingerprint(layout.train.classes, n_train, n_val);
  class_names = layout.train.classes;
  AIACC_CHECK_INPUT(cfg.evaluate_only || static_cast<int64_t>(n_train) / world >= cfg.stages.front().batch_size,
                    "train/ has ", n_train, " images: fewer than one batch of ", cfg.stages.front().batch_size,
                    " per process; lower --batch-size");
  train = std::make_unique<data::ImageLoader>(std::move(layout.train), lo, skips);
  lo.train = false;
  val = std::make_unique<data::ImageLoader>(std::move(layout.val), lo, skips);
  if (isRank0()) {
    LOG(INFO) << "data: " << n_train << " train / " << n_val << " val images, " << train->numClasses()
              << " classes from " << cfg.data;
  }
}

void Trainer::State::setupModel() {
  torch::manual_seed(cfg.seed);
  models::ResNetOptions mo;
  mo.arch = cfg.arch;
  mo.num_classes = train->numClasses();
  mo.zero_init_residual = cfg.zero_init_residual;
  model = models::ResNet(mo);
  if (!cfg.init_weights.empty()) {
    const int64_t file_classes = models::loadPretrainedInto(*model, models::readWeightsFile(cfg.init_weights), "fc");
    if (file_classes > 0 && isRank0()) {
      LOG(INFO) << "init weights: " << cfg.init_weights << " is for " << file_classes
                << " classes; fc re-initialised for " << mo.num_classes;
    }
  }
  model->to(device);
  if (cfg.channels_last) {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  // No weight decay on BN parameters and biases (1-D tensors) unless asked.
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) {
    (p.dim() <= 1 && !cfg.bn_weight_decay ? no_decay : decay).push_back(p);
  }
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::SGDOptions>(
        torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).nesterov(cfg.nesterov).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(cfg.weight_decay));
  groups.emplace_back(no_decay, opts(0.0));
  optimizer = std::make_unique<FusedSgd>(groups, torch::optim::SGDOptions(cfg.lr));
  params = model->parameters();
  GradScalerOptions so;
  so.enabled = cfg.amp && cfg.amp_dtype == AmpDtype::kFp16;  // bf16 has fp32's range: nothing to scale
  scaler = std::make_unique<GradScaler>(so);
  resume();  // --resume: model, optimizer and pos from the checkpoint, before rank 0's weights spread
  // A process joining a running elastic job agrees on everything but the position, which it
  // then receives from rank 0.
  const bool joining = elastic && elastic->generation().survivors() > 0;
  if (elastic && isRank0()) sayNoSurvivor();
  if (!joining && isRank0()) sayLaterCheckpoints();
  joined_running = joining;
  // --elastic-batch keep-global: the first world's ranks make the job's global batch for good (a
  // resumed process has it from its checkpoint, a joining one from rank 0's state below).
  const bool keep_global = elastic && cfg.elastic_batch == ElasticBatch::kKeepGlobal;
  if (keep_global && pos.batch_world == 0 && !joining) pos.batch_world = world;
  // Data parallelism wraps the model here: the ranks' settings are compared first, then
  // DataParallel broadcasts rank 0's weights (a joiner's come with the restore below instead).
  if (joining && die_joining == JoinDeath::kSettings) ::raise(SIGKILL);  // (a test's fault)
  sync_ptr = make_sync(model.ptr(), trainSettings(cfg, dataset, train->shardSize(), joining ? TrainingState{} : pos));
  if (elastic) elastic->publishKeys();  // the generation's store keys, for whoever deletes them
  // Under fp16 transfer the loss scale is the transfer's scale too: gradients are scaled once.
  if (scaler->enabled()) sync_unscales = sync().shareLossScale(scaler->shared());
  if (joining) {
    const int64_t bytes = restoreFromRank0(0);
    LOG(INFO) << "elastic: joined generation " << elastic->generation().number << " as rank " << rank << " of " << world
              << " at step " << pos.step << ", " << std::fixed << std::setprecision(2)
              << std::chrono::duration<double>(Clock::now() - start).count() << " s after this process started ("
              << (bytes + (1 << 20) - 1) / (1 << 20) << " MiB of state from rank 0)";
  }
  if (keep_global) {  // said now, not when the world grows
    const int max_ranks = elastic->options().membership.max;
    for (const Stage& st : cfg.stages) {
      AIACC_CHECK_INPUT(globalBatch(st) >= max_ranks, "--elastic-batch keep-global: the job's global batch of ",
                        globalBatch(st), " images cannot be shared by up to ", max_ranks,
                        " ranks (--nnodes MAX x processes per node): one image each at least; use a larger "
                        "--batch-size or a smaller MAX");
    }
  }
  // The communication set-up as the checkpoint left it: fp16 transfer's own scale, the tuner's
  // choice, the channel shares, the bucket order (an evaluation continues no training).
  if (!cfg.evaluate_only) {
    const std::vector<std::string> unused = sync().restoreCommState(pos.comm);
    if (isRank0()) {
      for (const std::string& line : unused) LOG(INFO) << "resume: " << line;
    }
  }
  if (isRank0()) {
    LOG(INFO) << "model: " << cfg.arch << ", " << models::parameterCount(*model) << " parameters, " << mo.num_classes
              << " classes on " << device.str()
              << (cfg.amp ? std::string(", mixed precision ") + optionName(cfg.amp_dtype) : std::string(", fp32"))
              << (cfg.channels_last ? ", channels-last" : "") << "; " << at::get_num_threads() << " compute threads";
  }
}

void Trainer::State::setLearningRate(double lr) {
  for (auto& g : optimizer->param_groups()) {
    static_cast<torch::optim::SGDOptions&>(g.options()).lr(lr);
  }
}

void Trainer::State::setUp() {
  // Set the thread count explicitly: Debian's LibTorch starts with one OpenMP thread.
  const int local = std::max(1, world_info.local_size);
  const int threads = cfg.threads > 0 ? cfg.threads
                                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
  at::set_num_threads(threads);
  setupDevice();
  if (cfg.amp) requireAutocastWorks(device, ampDtype());  // said now, not as a oneDNN error in step 1
  setupData();
  setupModel();  // and the resumed position
  // A run resumed at its end (--max-steps reached, or the target) trains no further step.
  if ((cfg.max_steps > 0 && pos.step >= cfg.max_steps) || pos.target_reached) run.stop = true;
  run.checkpoint_step = pos.step;
  run.checkpoint_evals = pos.evals.size();
  openRank0Outputs();
  if (!sample_log_path.empty()) {  // tests: which samples each step trained (app/test_hooks.h)
    sample_log = std::make_unique<std::ofstream>(strCat(sample_log_path, ".", ::getpid()), std::ios::app);
  }
  report.arch = cfg.arch;
  report.data = data_name;
  report.world = world;
  report.target_top1 = cfg.target_top1;
  report.target_top5 = cfg.target_top5;
  report.machine = machineInfo();
  loss_opts = torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(cfg.label_smoothing);
  run.planned = plannedSteps();
  run.last_progress = Clock::now();
  // (A run resumed in the middle of an epoch is that far into it: training batches are whole. A
  // process that joined a running job has rank 0's, from restoreFromRank0.)
  if (!joined_running) {
    const int64_t nb = stepsPerEpoch(stageAt(cfg, static_cast<int>(pos.epochs_done)));
    run.epoch_pos = static_cast<double>(pos.epochs_done) +
                    (nb > 0 ? static_cast<double>(pos.batches_in_epoch) / static_cast<double>(nb) : 0.0);
  }
  run.last_checkpoint_s = now();
}

CheckpointWriter& Trainer::State::checkpointWriter() {
  if (!checkpoints) {
    CheckpointDirOptions o;
    o.keep = cfg.keep_checkpoints;
    o.fault_hook = checkpoint_hook;
    checkpoints = std::make_unique<CheckpointWriter>(cfg.checkpoint_dir, o);
  }
  return *checkpoints;
}

void Trainer::State::openRank0Outputs() {
  if (!isRank0()) return;
  if (!cfg.checkpoint_dir.empty()) checkpointWriter();  // a folder that cannot be written is said now, not hours in
  if (!cfg.metrics_file.empty() && !metrics.is_open()) {
    metrics.open(cfg.metrics_file, std::ios::app);
    AIACC_CHECK_INPUT(metrics.good(), "cannot open --metrics-file '", cfg.metrics_file, "'");
  }
  if (!cfg.tensorboard_dir.empty() && !tensorboard) {  // a folder that cannot be made is said now
    try {
      tensorboard = std::make_unique<TensorBoardWriter>(cfg.tensorboard_dir);
    } catch (const IoError& e) {
      AIACC_THROW(InputError, "--tensorboard-dir: ", e.what());
    }
    tensorboardConfig();
  }
}

void Trainer::setElastic(std::shared_ptr<ElasticJob> elastic) { s_->elastic = std::move(elastic); }

void Trainer::setSurvivorClaim(std::function<bool()> claim) { s_->survivor_claim = std::move(claim); }

void Trainer::setStopRequest(StopRequest request) { s_->stop_request = std::move(request); }

void Trainer::setCheckpointFaultHook(std::function<void(CheckpointPhase, int64_t)> hook) {
  s_->checkpoint_hook = std::move(hook);
}

void Trainer::setTestHooks(const TestHooks& hooks) {
  if (hooks.checkpoint) s_->checkpoint_hook = hooks.checkpoint;
  s_->step_vote = hooks.step_vote;
  s_->run.vote_ab.block = hooks.step_vote_ab;
  s_->sample_log_path = hooks.sample_log;
  s_->epoch_eval_hook = hooks.epoch_eval;
  s_->run_end_hook = hooks.run_end;
  s_->skew_at_regroup = hooks.skew_at_regroup;
  s_->late_to_regroup_ms = hooks.late_to_regroup_ms;
  s_->fail_rank = hooks.fail_rank;
  s_->fail_step = hooks.fail_step;
  s_->die_joining = hooks.die_joining;
  s_->fail_setups = hooks.fail_setups;
}

Report Trainer::run() {
  State& s = *s_;
  s.setUp();
  if (s.cfg.evaluate_only) {  // --evaluate: the val split once, with the loaded model
    s.evaluateAndRecord();
    return s.run.preempted ? s.finishPreempted() : s.finishReport();
  }
  s.trainEpochs();
  return s.run.preempted ? s.finishPreempted() : s.finishReport();
}

void Trainer::State::trainEpochs() {
  // The one place an elastic job regroups, whatever failed (a step, the vote, a metrics line, an
  // evaluation, a checkpoint) or when the ranks voted to let a newcomer in. The new generation
  // goes on from its rank 0's state as a process joining it does: that state's pending
  // evaluation (a stop that cut one, or a failure did), then the epoch it is in, from its
  // position (any batches the new world can still make of it, then the epoch's end). Every rank
  // of the generation holds the same state, so they all take the same collectives. An epoch end
  // whose checkpoint a failure cut is not written again: the next one is.
  // After the last epoch, or a stop within one (target, --max-steps), the final state is
  // evaluated unless an epoch's end just was, or a stop request cut the run; in an elastic job
  // a rank lost meanwhile regroups as anywhere else, and the survivors evaluate it.
  bool regrouped = true;  // at the start too: a resumed run, a newcomer
  bool held = false;      // (run_end_hook: once)
  while (true) {
    const bool training = !run.stop && pos.epochs_done < cfg.epochs;
    if (!training && run.preempted) break;
    std::optional<std::string> cause;  // set: the ranks regroup ("": to let a newcomer in)
    try {
      if (!training) {
        const bool evaluated = !pos.evals.empty() && pos.evals.back().step == pos.step;
        if (!evaluated) {
          if (run_end_hook && !std::exchange(held, true)) run_end_hook();
          evaluateAndRecord();
          continue;
        }
        // A run that ended within an epoch (--max-steps, a target) is saved where it ended, its
        // final evaluation with it: the same command run again then has nothing left to do.
        if (run.checkpoint_step != pos.step || run.checkpoint_evals != pos.evals.size()) checkpoint();
        // A rank lost within the last evaluation's sum may have let some ranks finish it and
        // failed the others, which regroup: one more collective takes those that finished with
        // them. (Only a loss within this one can still part them; see finishReport.)
        if (elastic) endOfTraining();
        if (run_end_hook && !std::exchange(held, true)) run_end_hook();
        break;
      }
      if (std::exchange(regrouped, false)) {
        if (evaluationPending()) evaluateAndRecord();
        if (run.stop) continue;
      }
      const int epoch = static_cast<int>(pos.epochs_done);
      const std::optional<bool> complete = trainSegment(epoch);
      if (!complete) {
        cause = "";
      } else {
        if (run.preempted) break;
        if (*complete) finishEpoch(epoch);
        if (cfg.eval_every == 0 && !pos.target_reached) {
          if (epoch_eval_hook) epoch_eval_hook();
          evaluateAndRecord();
        }
        if (run.preempted) break;
        if (!*complete) {  // stopped within the epoch (target, --max-steps): the final evaluation is left
          run.stop = true;
          continue;
        }
        checkpoint();
        // A newcomer the epoch's last step let in (not when the run ends here: nothing is left to train).
        if (std::exchange(run.regroup_after_epoch, false) && !run.stop && pos.epochs_done < cfg.epochs) cause = "";
      }
    } catch (const comm::CommError& e) {
      if (!elastic) stopAfterLostRank(e);
      cause = firstLine(e.what());
    }
    if (!cause) continue;
    // (A failure within trainStep cut that step; one elsewhere cut none.)
    regroup(*cause, /*step_cut=*/!cause->empty() && run.in_step);
    run.in_step = false;
    // The restored state decides whether the run is at its end: this rank may have passed a
    // target or --max-steps the state does not hold, or fallen short of one it holds.
    run.stop = (cfg.max_steps > 0 && pos.step >= cfg.max_steps) || pos.target_reached;
    regrouped = true;
  }
}

std::optional<bool> Trainer::State::trainSegment(int epoch) {
  const Stage& st = stageAt(cfg, epoch);
  const int64_t global_batch = globalBatch(st);
  const int64_t rank_batch = rankBatchSize(st);
  data::EpochSpec spec{epoch, st.image_size, static_cast<int>(rank_batch), st.scale_min};
  spec.first_batch = pos.batches_in_epoch;  // > 0 in the epoch a run resumed in, or a world changed in
  spec.segment_offset = pos.segment_offset;
  spec.segment_batch = pos.segment_batch;
  // --elastic-batch keep-global in a world that does not divide the global batch evenly, or any
  // other than the first: every step is the order's next global_batch samples, shared unevenly.
  if (global_batch != static_cast<int64_t>(st.batch_size) * world) spec.global_batch = global_batch;
  const int64_t nb = train->startEpoch(spec);
  int64_t& step_in_epoch = pos.batches_in_epoch;
  auto t_last = Clock::now();
  run.last_step_end = t_last;
  while (auto batch = train->next()) {
    run.epoch_pos = epoch + epochFraction(step_in_epoch, nb, global_batch);
    const double lr = learningRate(cfg, run.epoch_pos, global_batch);
    setLearningRate(lr);
    const auto t0 = Clock::now();
    run.in_step = true;  // (a failure from here on cuts this step)
    const StepResult step = trainStep(*batch, st, t0);
    run.in_step = false;
    const auto t1 = Clock::now();
    const double step_s = std::chrono::duration<double>(t1 - t0).count();
    const double wall_s = std::chrono::duration<double>(t1 - t_last).count();
    t_last = t1;
    run.train_s += wall_s;
    pos.train_s += wall_s;
    // The step's images over the ranks: this rank's decoded share scaled to the global batch
    // (its images x world when the batches are even).
    const int64_t imgs = batch->labels.numel() * global_batch / rank_batch;
    run.images += imgs;
    if (run.steps >= 3 && !sync().tuning()) {
      run.steady_s += wall_s;
      run.steady_images += imgs;
      if (run.vote_ab.block > 0) {  // wall_s holds the gap after the last step, where the vote was or was not
        (run.voted ? run.vote_ab.s_with : run.vote_ab.s_without) += wall_s;
        ++(run.voted ? run.vote_ab.steps_with : run.vote_ab.steps_without);
      }
    }
    ++pos.step;
    ++run.steps;
    // Without a loss scaler a non-finite loss is not skipped: the weights it reaches are lost.
    // Said once, with its step, so that a run that diverges is not read as a run that learned
    // (the metrics line has "loss": null from here on).
    if (!std::isfinite(step.loss) && !scaler->enabled() && !run.nonfinite_loss_logged && isRank0()) {
      run.nonfinite_loss_logged = true;
      LOG(WARNING) << "step " << pos.step << ": the training loss is " << step.loss
                   << " (no loss scaler to skip it); the run has diverged";
    }
    ++step_in_epoch;
    run.last_step_end = t1;
    if (run.change_began) finishChange();
    if ((rank == fail_rank || fail_rank == kEveryRank) && pos.step == fail_step) {
      AIACC_THROW(Error, "AIACC_TEST_FAIL_AT_STEP: rank ", rank, " fails after step ", pos.step,
                  " (a test's own error)");
    }
    if (sample_log && step.applied) logSamples(*batch);
    run.epoch_pos = epoch + epochFraction(step_in_epoch, nb, global_batch);
    LogWindow& w = run.window;
    const int64_t n = batch->labels.numel();
    ++w.steps;
    w.loss_sum += step.loss * static_cast<double>(n);
    w.images += n;
    w.images_all_ranks += imgs;
    w.wall_s += wall_s;
    w.compute_s += step_s;
    w.epoch = run.epoch_pos;
    w.batch = batch->index;
    w.lr = lr;
    if (w.steps >= cfg.log_every) flushLog();
    printProgress(epoch, step_in_epoch, nb, st, run.job_loss, lr, t1);
    // What every rank must act on at the same step, agreed once per step (GradientSync::voteFlags:
    // at most 2 steps after any rank raised it): a stop request, and --checkpoint-every by time
    // (rank 0's clock decides, once per interval).
    const int ab = run.vote_ab.block;
    run.voted = step_vote && (ab == 0 || (pos.step - 1) / ab % 2 == 0);
    uint8_t mine = 0;
    const int wanted = stopWanted();
    if (wanted != 0) mine |= kFlagStop;
    if (run.voted && isRank0() && cfg.checkpoint_every_s > 0 && !run.checkpoint_asked &&
        now() - run.last_checkpoint_s >= cfg.checkpoint_every_s) {
      mine |= kFlagCheckpoint;
      run.checkpoint_asked = true;
    }
    if (run.voted && elastic && isRank0() && !run.regroup_asked && elastic->joinersWaiting()) {  // one store request
      mine |= kFlagRegroup;
      run.regroup_asked = true;
    }
    const uint8_t agreed = run.voted ? sync().voteFlags(mine) : 0;
    if (agreed & kFlagStop) {
      run.preempted = run.stop = true;
      run.stop_signal = wanted;
      break;
    }
    if (agreed & kFlagCheckpoint) run.checkpoint_asked = false;
    const bool every_steps = cfg.checkpoint_every_steps > 0 && pos.step % cfg.checkpoint_every_steps == 0;
    // (At an epoch's last step the epoch end's checkpoint follows anyway.)
    if (!cfg.checkpoint_dir.empty() && ((agreed & kFlagCheckpoint) || every_steps) && step_in_epoch < nb) {
      writeCheckpoint(CheckpointWait::kSkipIfBusy);
      run.last_checkpoint_s = now();
    }
    if (cfg.eval_every > 0 && pos.step % cfg.eval_every == 0) evaluateAndRecord();
    if ((cfg.max_steps > 0 && pos.step >= cfg.max_steps) || run.stop) {
      run.stop = true;
      break;
    }
    if (agreed & kFlagRegroup) {  // every rank at this same step
      run.regroup_asked = false;
      if (step_in_epoch < nb) return std::nullopt;
      run.regroup_after_epoch = true;  // at the epoch's last step: the epoch ends first (trainEpochs)
    }
  }
  return step_in_epoch == nb;
}

// One optimizer step on `batch` (begun at t0, the forward span's start): beforeForward, forward
// and loss, backward, finishBackward (the gradient sync), the loss scaler's unscale and update,
// the optimizer step.
StepResult Trainer::State::trainStep(const data::Batch& batch, const Stage& st, Clock::time_point t0) {
  StepResult result;
  // Images decoded for this step; skipped (undecodable) ones are missing from the batch.
  const int64_t n = batch.labels.numel();
  const double weight = meanLossWeight(n, globalBatch(st), world);
  // A rank whose batch decoded to nothing still takes part in the step (the others wait for
  // its buckets): zero contribution, then the same averaged update as everyone. Alone, there
  // is nothing to learn from.
  if (n == 0 && world == 1) return result;
  sync().beforeForward();
  // Gradients set to none, not zeroed: backward then hands each parameter its new gradient
  // tensor instead of adding it into a zeroed one (a write and a read-add pass saved).
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  torch::Tensor loss;
  if (n > 0) {
    const torch::Tensor images = data::imagesOnDevice(batch.images, device, cfg.channels_last);
    const torch::Tensor labels = data::labelsOnDevice(batch.labels, device);
    AutocastGuard autocast(cfg.amp, device.type(), ampDtype());
    const torch::Tensor logits = model->forward(images);
    loss = torch::nn::functional::cross_entropy(logits.to(at::kFloat), labels, loss_opts);
    // Every decoded image weighs 1 / global batch in the step's gradient, on every rank: a
    // partial batch's mean counts for its share of a full one (skipped images count as zero
    // gradient, not as a larger weight on the rest of their rank's batch), and so does an
    // uneven share of the global batch (--elastic-batch keep-global).
    if (weight != 1.0) loss = loss * weight;
  }
  const auto t_fwd = Clock::now();
  if (loss.defined()) scaler->scaleLoss(loss).backward();
  const auto t_bwd = Clock::now();
  // The sync's wait ends where the optimizer step begins (or where the step is refused).
  Clock::time_point t_sync{};
  const bool step_ok = finishStep(sync(), *scaler, sync_unscales, params, [&] {
    t_sync = Clock::now();
    optimizer->step();
  });
  if (!step_ok) t_sync = Clock::now();
  if (!step_ok) ++pos.skipped_steps;
  result.applied = step_ok;
  // Also the point where this step's input copy has certainly finished (it reads the
  // stream that copied it): only after it may the loader reuse the pinned batch buffer.
  if (loss.defined()) {
    // The host waits for the step here anyway (item() waits for the queued optimizer kernels):
    // over NCCL a failed reduction raises now, not at the next step's first collective.
    sync().synchronize();
    result.loss = loss.item<double>() / weight;
  }
  if (timeline) {
    const auto t_end = Clock::now();
    timeline->span("forward", 0, t0, t_fwd);
    timeline->span("backward", 0, t_fwd, t_bwd);
    timeline->span(step_ok ? "gradient sync wait" : "gradient sync wait (step skipped)", 0, t_bwd, t_sync);
    timeline->span("optimizer", 0, t_sync, t_end);
  }
  return result;
}

void Trainer::State::finishEpoch(int epoch) {
  flushLog();  // the epoch's last steps belong to its row
  pos.epoch_train.push_back(EpochTrain{static_cast<double>(epoch + 1), epochLoss(), pos.epoch_lr});
  pos.epoch_loss_sum = 0;
  pos.epoch_images = 0;
  pos.epochs_done = epoch + 1;
  pos.batches_in_epoch = 0;
  pos.segment_offset = 0;  // the next epoch is shared out by the current world from its start
  pos.segment_batch = 0;
  run.epoch_pos = epoch + 1;
  const data::JpegIndexCache* ix = train->jpegIndex();
  if (isRank0() && ix && !run.index_logged) {
    LOG(INFO) << "JPEG indexes (--jpeg-index-mb): " << ix->indexedFiles() << " train files indexed, "
              << (ix->bytes() + 1023) / 1024 << " KiB; " << ix->refusedFiles()
              << " not indexable (progressive, restart markers, "
              << "not baseline JPEG); later epochs decode only each crop's MCUs";
    run.index_logged = true;
  }
}

}  // namespace aiacc::app
