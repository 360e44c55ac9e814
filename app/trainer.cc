#include "app/trainer.h"

#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <glog/logging.h>
#include <torch/nn/functional/loss.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "app/amp.h"
#include "app/checkpoint.h"
#include "app/fused_sgd.h"
#include "app/job_settings.h"
#include "app/json.h"
#include "app/launch_env.h"
#include "app/option_names.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "data/device_input.h"
#include "data/entropy_gate.h"
#include "data/loader.h"
#include "models/resnet.h"
#include "models/weights.h"

namespace aiacc::app {

using Clock = Trainer::Clock;

SyncFactory localSync() {
  return [](std::shared_ptr<torch::nn::Module>, const comm::Settings&) { return std::make_unique<comm::LocalSync>(); };
}

namespace {

// What one optimizer step did.
struct StepResult {
  double loss = 0;       // the batch's mean loss per decoded image; 0 when it decoded to nothing
  bool applied = false;  // the optimizer stepped (not skipped on a non-finite gradient)
};

// This run's progress (a resumed run counts from where it resumed).
struct RunTotals {
  int64_t planned = 0;  // steps of the whole schedule (--max-steps included)
  int64_t steps = 0;
  double train_s = 0;
  int64_t images = 0;
  // Steady state: after 3 warm-up steps and once the communication tuner has frozen.
  double steady_s = 0;
  int64_t steady_images = 0;
  bool index_logged = false;  // the JPEG index summary, once, after the first complete epoch
  bool stop = false;
  Clock::time_point last_progress;
  double epoch_pos = 0;                // fractional epoch of the training position
  int64_t skipped_steps = 0;           // steps every rank skipped for a non-finite gradient
  bool nonfinite_loss_logged = false;  // the first non-finite training loss, said once
};

}  // namespace

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
  std::string dataset;  // datasetFingerprint(), for the agreement across ranks

  at::Device device = at::kCPU;
  models::ResNet model{nullptr};
  std::unique_ptr<FusedSgd> optimizer;
  std::vector<torch::Tensor> params;
  std::unique_ptr<GradScaler> scaler;
  // The gradient sync took the loss scale (fp16 transfer under AMP fp16): it unscales, checks
  // and moves the one scale itself, and the trainer must not unscale again.
  bool sync_unscales = false;

  TrainPosition pos;
  std::shared_ptr<comm::Timeline> timeline;
  std::ofstream metrics;
  Report report;
  RunTotals run;
  torch::nn::functional::CrossEntropyFuncOptions loss_opts;

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
  // One epoch's steps, each followed by its metrics line, progress and --eval-every evaluation;
  // true when every batch of the epoch was trained (no target or --max-steps stop within it).
  bool trainEpoch(int epoch);
  // One optimizer step (below, with the loss scaler's handling in one place).
  StepResult trainStep(const data::Batch& batch, const Stage& st, Clock::time_point t0);
  // Rank 0, every --progress-seconds: where the run is, the mean speed and the time left.
  void printProgress(int epoch, int64_t step_in_epoch, int64_t batches, const Stage& st, double loss, double lr,
                     Clock::time_point t);
  // After a complete epoch: the position at its end, the JPEG index summary once.
  void finishEpoch(int epoch);
  // Evaluates at run.epoch_pos, records it (report, metrics, log) and stops at the target.
  void evaluateAndRecord();
  // The report's totals, the peak memory over ranks, and --save-weights.
  Report finishReport();
  at::ScalarType ampDtype() const { return cfg.amp_dtype == AmpDtype::kBf16 ? at::kBFloat16 : at::kHalf; }
  void setLearningRate(double lr);
  int64_t plannedSteps() const;
  EvalPoint evaluate(double epoch_pos);
  bool targetReached(const EvalPoint& e) const;
  void writeMetric(const std::string& json);
  void checkpoint();
};

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
  AIACC_CHECK_INPUT(static_cast<int64_t>(n_train) / world >= cfg.stages.front().batch_size, "train/ has ", n_train,
                    " images: fewer than one batch of ", cfg.stages.front().batch_size,
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
  if (!cfg.init_weights.empty()) models::loadStateInto(*model, models::readNamedTensors(cfg.init_weights));
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
  if (!cfg.resume.empty()) {
    pos = loadCheckpoint(cfg.resume, *model, *optimizer);
    if (scaler->enabled() && pos.loss_scale > 0) scaler->setState(pos.loss_scale, pos.loss_scale_good_steps);
    if (isRank0()) {
      LOG(INFO) << "resumed from " << cfg.resume << " after epoch " << pos.epochs_done << " (step " << pos.step << ")";
    }
  }
  // Data parallelism wraps the model here: the ranks' settings are compared first, then
  // DataParallel broadcasts rank 0's weights.
  sync_ptr = make_sync(model.ptr(), trainSettings(cfg, dataset, train->shardSize(), pos));
  // Under fp16 transfer the loss scale is the transfer's scale too: gradients are scaled once.
  if (scaler->enabled()) sync_unscales = sync().shareLossScale(scaler->shared());
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

int64_t Trainer::State::plannedSteps() const {
  int64_t steps = 0;
  for (int e = 0; e < cfg.epochs; ++e) steps += train->shardSize() / stageAt(cfg, e).batch_size;
  if (cfg.max_steps > 0) steps = std::min(steps, cfg.max_steps);
  return steps;
}

EvalPoint Trainer::State::evaluate(double epoch_pos) {
  sync().syncBuffers();  // every rank evaluates its shard with the same BN statistics
  torch::NoGradGuard no_grad;
  model->eval();
  const Stage& st = stageAt(cfg, static_cast<int>(epoch_pos));
  data::EpochSpec spec;
  spec.epoch = 0;
  spec.image_size = st.image_size;
  spec.batch_size = cfg.eval_batch_size > 0 ? cfg.eval_batch_size : st.batch_size;
  val->startEpoch(spec);
  // correct@1, correct@5, loss sum, count
  double c1 = 0, c5 = 0, loss_sum = 0, count = 0;
  while (auto b = val->next()) {
    if (b->labels.numel() == 0) continue;
    const torch::Tensor images = data::imagesOnDevice(b->images, device, cfg.channels_last);
    const torch::Tensor labels = data::labelsOnDevice(b->labels, device);
    torch::Tensor logits;
    {
      AutocastGuard autocast(cfg.amp, device.type(), ampDtype());
      logits = model->forward(images);
    }
    logits = logits.to(at::kFloat);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    const torch::Tensor top = std::get<1>(logits.topk(k, 1));
    const torch::Tensor hit = top.eq(labels.unsqueeze(1));
    c1 += hit.select(1, 0).sum().item<double>();
    c5 += hit.any(1).sum().item<double>();
    count += static_cast<double>(b->labels.numel());
  }
  at::Tensor sums = at::tensor({c1, c5, loss_sum, count}, at::kDouble);
  sync().allreduceSum(sums);
  model->train();
  EvalPoint e;
  e.step = pos.step;
  e.epoch = epoch_pos;
  e.seconds = now();
  const double n = std::max(1.0, sums[3].item<double>());
  e.top1 = 100.0 * sums[0].item<double>() / n;
  e.top5 = 100.0 * sums[1].item<double>() / n;
  e.loss = sums[2].item<double>() / n;
  e.images = static_cast<int64_t>(sums[3].item<double>());
  return e;
}

bool Trainer::State::targetReached(const EvalPoint& e) const {
  if (cfg.target_top1 <= 0 && cfg.target_top5 <= 0) return false;
  return (cfg.target_top1 <= 0 || e.top1 >= cfg.target_top1) && (cfg.target_top5 <= 0 || e.top5 >= cfg.target_top5);
}

void Trainer::State::writeMetric(const std::string& json) {
  if (metrics.is_open()) metrics << json << std::endl;  // whole lines, as they happen (tail -f)
}

void Trainer::State::checkpoint() {
  if (cfg.checkpoint_dir.empty()) return;
  sync().syncBuffers();  // on every rank (a collective); rank 0 writes
  if (!isRank0()) return;
  std::error_code ec;
  std::filesystem::create_directories(cfg.checkpoint_dir, ec);
  const std::string path = cfg.checkpoint_dir + "/last.ckpt";
  TrainPosition p = pos;
  p.elapsed_s = now();
  if (scaler->enabled()) {
    p.loss_scale = scaler->scale();
    p.loss_scale_good_steps = scaler->goodSteps();
  }
  try {
    saveCheckpoint(path, *model, *optimizer, p);
  } catch (const IoError& e) {
    // Keep training: the previous checkpoint is intact, and stopping would lose more work.
    ++report.checkpoint_failures;
    LOG(ERROR) << e.what() << "; previous checkpoint kept, training continues";
  }
}

void Trainer::State::setUp() {
  // Set the thread count explicitly: Debian's LibTorch starts with one OpenMP thread.
  const int local = std::max(1, world_info.local_size);
  const int threads = cfg.threads > 0 ? cfg.threads
                                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
  at::set_num_threads(threads);
  setupDevice();
  setupData();
  setupModel();  // and the resumed position
  if (!cfg.metrics_file.empty() && isRank0()) {
    metrics.open(cfg.metrics_file, std::ios::app);
    AIACC_CHECK_INPUT(metrics.good(), "cannot open --metrics-file '", cfg.metrics_file, "'");
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
  run.epoch_pos = static_cast<double>(pos.epochs_done);
}

Report Trainer::run() {
  State& s = *s_;
  s.setUp();
  for (int epoch = static_cast<int>(s.pos.epochs_done); epoch < s.cfg.epochs && !s.run.stop; ++epoch) {
    const bool epoch_complete = s.trainEpoch(epoch);
    if (epoch_complete) s.finishEpoch(epoch);
    if (s.cfg.eval_every == 0 && !s.report.target_reached) s.evaluateAndRecord();
    if (epoch_complete) s.checkpoint();  // resume restarts at an epoch boundary
  }
  // Make sure the final state was evaluated.
  if (s.report.evals.empty() || s.report.evals.back().step != s.pos.step) s.evaluateAndRecord();
  return s.finishReport();
}

bool Trainer::State::trainEpoch(int epoch) {
  const Stage& st = stageAt(cfg, epoch);
  data::EpochSpec spec{epoch, st.image_size, st.batch_size, st.scale_min};
  const int64_t nb = train->startEpoch(spec);
  const int64_t global_batch = static_cast<int64_t>(st.batch_size) * world;
  int64_t step_in_epoch = 0;
  auto t_last = Clock::now();
  while (auto batch = train->next()) {
    run.epoch_pos = epoch + static_cast<double>(step_in_epoch) / std::max<int64_t>(nb, 1);
    const double lr = learningRate(cfg, run.epoch_pos, global_batch);
    setLearningRate(lr);
    const auto t0 = Clock::now();
    const StepResult step = trainStep(*batch, st, t0);
    const auto t1 = Clock::now();
    const double step_s = std::chrono::duration<double>(t1 - t0).count();
    const double wall_s = std::chrono::duration<double>(t1 - t_last).count();
    t_last = t1;
    run.train_s += wall_s;
    pos.train_s += wall_s;
    const int64_t imgs = batch->labels.numel() * world;
    run.images += imgs;
    if (run.steps >= 3 && !sync().tuning()) {
      run.steady_s += wall_s;
      run.steady_images += imgs;
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
    pos.images_seen += imgs;
    run.epoch_pos = epoch + static_cast<double>(step_in_epoch) / std::max<int64_t>(nb, 1);
    const double ips = static_cast<double>(imgs) / std::max(1e-9, wall_s);
    writeMetric(JsonObject()
                    .add("type", "step")
                    .add("step", pos.step)
                    .add("epoch", run.epoch_pos)
                    .add("loss", step.loss)
                    .add("lr", lr)
                    .add("images_per_s", ips)
                    .add("compute_s", step_s)
                    .str());
    printProgress(epoch, step_in_epoch, nb, st, step.loss, lr, t1);
    if (cfg.eval_every > 0 && pos.step % cfg.eval_every == 0) evaluateAndRecord();
    if ((cfg.max_steps > 0 && pos.step >= cfg.max_steps) || run.stop) {
      run.stop = true;
      break;
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
    // Every decoded image weighs 1 / (world x batch) in the step's gradient, on every rank:
    // a partial batch's mean counts for its share of a full one (skipped images count as
    // zero gradient, not as a larger weight on the rest of their rank's batch).
    if (n < st.batch_size) loss = loss * (static_cast<double>(n) / st.batch_size);
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
  if (!step_ok) ++run.skipped_steps;
  result.applied = step_ok;
  // Also the point where this step's input copy has certainly finished (it reads the
  // stream that copied it): only after it may the loader reuse the pinned batch buffer.
  if (loss.defined()) {
    // The host waits for the step here anyway (item() waits for the queued optimizer kernels):
    // over NCCL a failed reduction raises now, not at the next step's first collective.
    sync().synchronize();
    result.loss = loss.item<double>() * (n < st.batch_size ? static_cast<double>(st.batch_size) / n : 1.0);
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

void Trainer::State::printProgress(int epoch, int64_t step_in_epoch, int64_t batches, const Stage& st, double loss,
                                   double lr, Clock::time_point t) {
  if (!isRank0() || std::chrono::duration<double>(t - run.last_progress).count() < cfg.progress_seconds) return;
  run.last_progress = t;
  const double mean_ips = static_cast<double>(run.images) / std::max(1e-9, run.train_s);
  const int64_t left = std::max<int64_t>(0, run.planned - pos.step);
  const double eta = static_cast<double>(left) * run.train_s / std::max<int64_t>(1, run.steps);
  std::cout << "epoch " << epoch + 1 << "/" << cfg.epochs << " step " << step_in_epoch << "/" << batches << " size "
            << st.image_size << " loss " << std::fixed << std::setprecision(4) << loss << " lr " << lr
            << std::setprecision(1) << " img/s " << mean_ips << " ETA " << formatDuration(eta) << std::endl;
}

void Trainer::State::finishEpoch(int epoch) {
  pos.epochs_done = epoch + 1;
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

void Trainer::State::evaluateAndRecord() {
  EvalPoint e = evaluate(run.epoch_pos);
  Report& r = report;
  r.evals.push_back(e);
  writeMetric(evalPointJson(e, "eval"));
  if (isRank0()) {
    LOG(INFO) << "eval epoch " << std::fixed << std::setprecision(2) << e.epoch << ": top-1 " << e.top1 << "% top-5 "
              << e.top5 << "% loss " << std::setprecision(4) << e.loss << " (" << e.images << " images, "
              << formatDuration(e.seconds) << " elapsed)";
  }
  if (!r.target_reached && targetReached(e)) {
    r.target_reached = true;
    r.time_to_target_s = e.seconds;
    run.stop = true;
    if (isRank0()) LOG(INFO) << "target reached after " << formatDuration(e.seconds);
  }
}

Report Trainer::State::finishReport() {
  Report& r = report;
  const EvalPoint& last = r.evals.back();
  r.final_top1 = last.top1;
  r.final_top5 = last.top5;
  r.steps = pos.step;
  r.images_seen = pos.images_seen;
  r.epochs = run.epoch_pos;
  r.train_s = pos.train_s;
  r.mean_images_per_s = static_cast<double>(run.images) / std::max(1e-9, run.train_s);
  r.steady_images_per_s = run.steady_images > 0 ? static_cast<double>(run.steady_images) / run.steady_s
                                                : r.mean_images_per_s;
  r.total_s = now();
  {  // peak resident memory: this rank's, and the largest over ranks (summing one-hot slots)
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    r.peak_rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;
    at::Tensor all = at::zeros({world}, at::kDouble);
    all[rank] = r.peak_rss_mb;
    sync().allreduceSum(all);
    r.max_peak_rss_mb = all.max().item<double>();
  }
  r.skipped_files = skips->count();
  r.ignored_files = ignored_files;
  r.exposed_comm_s = sync().exposedCommSeconds();
  r.device = device.str();
  r.precision = cfg.amp ? std::string("amp ") + optionName(cfg.amp_dtype) : "fp32";
  r.loss_scale = scaler->enabled() ? scaler->scale() : 0;
  r.overflow_skips = run.skipped_steps;  // the loss scaler's and the fp16/bf16 transfer's
  r.comm = sync().describe();
  if (!cfg.save_weights.empty() && isRank0()) {  // the final evaluation averaged the BN statistics
    try {
      writeFileAtomicByPath(cfg.save_weights,
                            [&](const std::string& tmp) { models::writeNamedTensors(tmp, models::stateOf(*model)); });
    } catch (const IoError& e) {
      AIACC_THROW(IoError, "--save-weights: ", e.what());
    }
  }
  return r;
}

}  // namespace aiacc::app
