#include "app/trainer.h"

#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <glog/logging.h>
#include <torch/nn/functional/loss.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

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
#include "common/atomic_file.h"
#include "common/error.h"
#include "data/device_input.h"
#include "data/entropy_hook.h"
#include "data/loader.h"
#include "models/resnet.h"
#include "models/weights.h"

namespace aiacc::app {

using Clock = Trainer::Clock;

SyncFactory localSync() {
  return [](std::shared_ptr<torch::nn::Module>, const comm::Settings&) { return std::make_unique<comm::LocalSync>(); };
}

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

  TrainPosition pos;
  std::shared_ptr<comm::Timeline> timeline;
  std::ofstream metrics;
  Report report;

  State(Config c, comm::WorldInfo w, SyncFactory f, Clock::time_point t)
      : cfg(std::move(c)), world_info(w), make_sync(std::move(f)), start(t) {}
  comm::GradientSync& sync() { return *sync_ptr; }

  double now() const {
    return pos.elapsed_s + std::chrono::duration<double>(Clock::now() - start).count();
  }
  bool isRank0() const { return rank == 0; }

  void setupDevice();
  void setupData();
  void setupModel();
  at::ScalarType ampDtype() const { return cfg.amp_dtype == "bf16" ? at::kBFloat16 : at::kHalf; }
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
  AIACC_CHECK_INPUT(n <= count, n, " GPU(s) needed (--gpus) but ",
                    count, " are visible (check --gpus and CUDA_VISIBLE_DEVICES)");
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
    auto t = std::make_unique<data::SyntheticSource>(cfg.synthetic_images, cfg.synthetic_classes,
                                                     cfg.channels_last, cfg.seed, rank, world);
    const int64_t val_images = std::max<int64_t>(cfg.synthetic_images / 50, 2 * world);
    auto v = std::make_unique<data::SyntheticSource>(val_images, cfg.synthetic_classes, cfg.channels_last,
                                                     cfg.seed + 1, rank, world, /*drop_last=*/false);
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
  data::EntropyHook::enable(!cfg.libjpeg_huffman);  // process-wide: one trainer per process
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
  AIACC_CHECK_INPUT(static_cast<int64_t>(n_train) / world >= cfg.stages.front().batch_size,
                    "train/ has ", n_train, " images: fewer than one batch of ",
                    cfg.stages.front().batch_size, " per process; lower --batch-size");
  train = std::make_unique<data::ImageLoader>(std::move(layout.train), lo, skips);
  lo.train = false;
  val = std::make_unique<data::ImageLoader>(std::move(layout.val), lo, skips);
  if (isRank0()) {
    LOG(INFO) << "data: " << n_train << " train / " << n_val << " val images, "
              << train->numClasses() << " classes from " << cfg.data;
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
  so.enabled = cfg.amp && cfg.amp_dtype == "fp16";  // bf16 has fp32's range: nothing to scale
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
  if (isRank0()) {
    LOG(INFO) << "model: " << cfg.arch << ", " << models::parameterCount(*model) << " parameters, "
              << mo.num_classes << " classes on " << device.str()
              << (cfg.amp ? ", mixed precision " + cfg.amp_dtype : std::string(", fp32"))
              << (cfg.channels_last ? ", channels-last" : "") << "; " << at::get_num_threads()
              << " compute threads";
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
  return (cfg.target_top1 <= 0 || e.top1 >= cfg.target_top1) &&
         (cfg.target_top5 <= 0 || e.top5 >= cfg.target_top5);
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

Report Trainer::run() {
  State& s = *s_;
  const Config& cfg = s.cfg;
  // Set the thread count explicitly: Debian's LibTorch starts with one OpenMP thread.
  const int local = std::max(1, s.world_info.local_size);
  const int threads = cfg.threads > 0 ? cfg.threads
                                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
  at::set_num_threads(threads);
  s.setupDevice();
  s.setupData();
  s.setupModel();  // and the resumed position
  if (!cfg.metrics_file.empty() && s.isRank0()) {
    s.metrics.open(cfg.metrics_file, std::ios::app);
    AIACC_CHECK_INPUT(s.metrics.good(), "cannot open --metrics-file '", cfg.metrics_file, "'");
  }
  Report& r = s.report;
  r.arch = cfg.arch;
  r.data = s.data_name;
  r.world = s.world;
  r.target_top1 = cfg.target_top1;
  r.target_top5 = cfg.target_top5;
  r.machine = machineInfo();

  namespace F = torch::nn::functional;
  const auto loss_opts = F::CrossEntropyFuncOptions().label_smoothing(cfg.label_smoothing);
  const int64_t planned = s.plannedSteps();
  int64_t steps_this_run = 0;
  double run_train_s = 0;
  int64_t run_images = 0;
  // Steady state: after 3 warm-up steps and once the communication tuner has frozen.
  bool index_logged = false;  // the JPEG index summary, once, after the first complete epoch
  double steady_s = 0;
  int64_t steady_images = 0;
  bool stop = false;
  auto last_progress = Clock::now();
  double epoch_pos = static_cast<double>(s.pos.epochs_done);
  auto do_eval = [&]() {
    EvalPoint e = s.evaluate(epoch_pos);
    r.evals.push_back(e);
    s.writeMetric(JsonObject().add("type", "eval").add("step", e.step).add("epoch", e.epoch)
                      .add("seconds", e.seconds).add("top1", e.top1).add("top5", e.top5)
                      .add("loss", e.loss).str());
    if (s.isRank0()) {
      LOG(INFO) << "eval epoch " << std::fixed << std::setprecision(2) << e.epoch << ": top-1 "
                << e.top1 << "% top-5 " << e.top5 << "% loss " << std::setprecision(4) << e.loss
                << " (" << e.images << " images, " << formatDuration(e.seconds) << " elapsed)";
    }
    if (!r.target_reached && s.targetReached(e)) {
      r.target_reached = true;
      r.time_to_target_s = e.seconds;
      stop = true;
      if (s.isRank0()) LOG(INFO) << "target reached after " << formatDuration(e.seconds);
    }
  };

  for (int epoch = static_cast<int>(s.pos.epochs_done); epoch < cfg.epochs && !stop; ++epoch) {
    const Stage& st = stageAt(cfg, epoch);
    data::EpochSpec spec{epoch, st.image_size, st.batch_size, st.scale_min};
    const int64_t nb = s.train->startEpoch(spec);
    const int64_t global_batch = static_cast<int64_t>(st.batch_size) * s.world;
    int64_t step_in_epoch = 0;
    auto t_last = Clock::now();
    while (auto batch = s.train->next()) {
      epoch_pos = epoch + static_cast<double>(step_in_epoch) / std::max<int64_t>(nb, 1);
      const double lr = learningRate(cfg, epoch_pos, global_batch);
      s.setLearningRate(lr);
      const auto t0 = Clock::now();
      double loss_value = 0;
      // Images decoded for this step; skipped (undecodable) ones are missing from the batch.
      const int64_t n = batch->labels.numel();
      // A rank whose batch decoded to nothing still takes part in the step (the others wait for
      // its buckets): zero contribution, then the same averaged update as everyone. Alone, there
      // is nothing to learn from.
      if (n > 0 || s.world > 1) {
        s.sync().beforeForward();
        // Gradients set to none, not zeroed: backward then hands each parameter its new gradient
        // tensor instead of adding it into a zeroed one (a write and a read-add pass saved).
        for (auto& p : s.params) p.mutable_grad() = torch::Tensor();
        torch::Tensor loss;
        if (n > 0) {
          const torch::Tensor images = data::imagesOnDevice(batch->images, s.device, cfg.channels_last);
          const torch::Tensor labels = data::labelsOnDevice(batch->labels, s.device);
          AutocastGuard autocast(cfg.amp, s.device.type(), s.ampDtype());
          const torch::Tensor logits = s.model->forward(images);
          loss = F::cross_entropy(logits.to(at::kFloat), labels, loss_opts);
          // Every decoded image weighs 1 / (world x batch) in the step's gradient, on every rank:
          // a partial batch's mean counts for its share of a full one (skipped images count as
          // zero gradient, not as a larger weight on the rest of their rank's batch).
          if (n < st.batch_size) loss = loss * (static_cast<double>(n) / st.batch_size);
        }
        const auto t_fwd = Clock::now();
        if (loss.defined()) s.scaler->scaleLoss(loss).backward();
        const auto t_bwd = Clock::now();
        bool step_ok = s.sync().finishBackward();
        const auto t_sync = Clock::now();
        if (step_ok && s.scaler->enabled()) {
          // The averaged gradients are the same on every rank, so every rank agrees on overflow.
          const bool finite = s.scaler->unscaleAndCheck(s.params);
          s.scaler->update(!finite);
          step_ok = finite;
        }
        if (step_ok) s.optimizer->step();
        // Also the point where this step's input copy has certainly finished (it reads the
        // stream that copied it): only after it may the loader reuse the pinned batch buffer.
        if (loss.defined()) loss_value = loss.item<double>() * (n < st.batch_size ? static_cast<double>(st.batch_size) / n : 1.0);
        if (s.timeline) {
          const auto t_end = Clock::now();
          s.timeline->span("forward", 0, t0, t_fwd);
          s.timeline->span("backward", 0, t_fwd, t_bwd);
          s.timeline->span(step_ok ? "gradient sync wait" : "gradient sync wait (step skipped)", 0, t_bwd, t_sync);
          s.timeline->span("optimizer", 0, t_sync, t_end);
        }
      }
      const auto t1 = Clock::now();
      const double step_s = std::chrono::duration<double>(t1 - t0).count();
      const double wall_s = std::chrono::duration<double>(t1 - t_last).count();
      t_last = t1;
      run_train_s += wall_s;
      s.pos.train_s += wall_s;
      const int64_t imgs = batch->labels.numel() * s.world;
      run_images += imgs;
      if (steps_this_run >= 3 && !s.sync().tuning()) {
        steady_s += wall_s;
        steady_images += imgs;
      }
      ++s.pos.step;
      ++steps_this_run;
      ++step_in_epoch;
      s.pos.images_seen += imgs;
      epoch_pos = epoch + static_cast<double>(step_in_epoch) / std::max<int64_t>(nb, 1);
      const double ips = static_cast<double>(imgs) / std::max(1e-9, wall_s);
      s.writeMetric(JsonObject().add("type", "step").add("step", s.pos.step).add("epoch", epoch_pos)
                        .add("loss", loss_value).add("lr", lr).add("images_per_s", ips)
                        .add("compute_s", step_s).str());
      if (s.isRank0() && std::chrono::duration<double>(t1 - last_progress).count() >= cfg.progress_seconds) {
        last_progress = t1;
        const double mean_ips = static_cast<double>(run_images) / std::max(1e-9, run_train_s);
        const int64_t left = std::max<int64_t>(0, planned - s.pos.step);
        const double eta = static_cast<double>(left) * run_train_s / std::max<int64_t>(1, steps_this_run);
        std::cout << "epoch " << epoch + 1 << "/" << cfg.epochs << " step " << step_in_epoch << "/"
                  << nb << " size " << st.image_size << " loss " << std::fixed
                  << std::setprecision(4) << loss_value << " lr " << lr << std::setprecision(1)
                  << " img/s " << mean_ips << " ETA " << formatDuration(eta) << std::endl;
      }
      if (cfg.eval_every > 0 && s.pos.step % cfg.eval_every == 0) do_eval();
      if ((cfg.max_steps > 0 && s.pos.step >= cfg.max_steps) || stop) {
        stop = true;
        break;
      }
    }
    const bool epoch_complete = step_in_epoch == nb;
    if (epoch_complete) {
      s.pos.epochs_done = epoch + 1;
      epoch_pos = epoch + 1;
      const auto* loader = dynamic_cast<const data::ImageLoader*>(s.train.get());
      if (s.isRank0() && loader && loader->jpegIndex() && !index_logged) {
        const data::JpegIndexCache& ix = *loader->jpegIndex();
        LOG(INFO) << "JPEG indexes (--jpeg-index-mb): " << ix.indexedFiles() << " train files indexed, "
                  << (ix.bytes() + 1023) / 1024 << " KiB; " << ix.refusedFiles() << " not indexable (progressive, restart markers, "
                  << "not baseline JPEG); later epochs decode only each crop's MCUs";
        index_logged = true;
      }
    }
    if (cfg.eval_every == 0 && !r.target_reached) do_eval();
    if (epoch_complete) s.checkpoint();  // resume restarts at an epoch boundary
  }
  // Make sure the final state was evaluated.
  if (r.evals.empty() || r.evals.back().step != s.pos.step) do_eval();

  const EvalPoint& last = r.evals.back();
  r.final_top1 = last.top1;
  r.final_top5 = last.top5;
  r.steps = s.pos.step;
  r.images_seen = s.pos.images_seen;
  r.epochs = epoch_pos;
  r.train_s = s.pos.train_s;
  r.mean_images_per_s = static_cast<double>(run_images) / std::max(1e-9, run_train_s);
  r.steady_images_per_s = steady_images > 0 ? static_cast<double>(steady_images) / steady_s : r.mean_images_per_s;
  r.total_s = s.now();
  {  // peak resident memory: this rank's, and the largest over ranks (summing one-hot slots)
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    r.peak_rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;
    at::Tensor all = at::zeros({s.world}, at::kDouble);
    all[s.rank] = r.peak_rss_mb;
    s.sync().allreduceSum(all);
    r.max_peak_rss_mb = all.max().item<double>();
  }
  r.skipped_files = s.skips->count();
  r.ignored_files = s.ignored_files;
  r.exposed_comm_s = s.sync().exposedCommSeconds();
  r.device = s.device.str();
  r.precision = cfg.amp ? "amp " + cfg.amp_dtype : "fp32";
  r.loss_scale = s.scaler->enabled() ? s.scaler->scale() : 0;
  r.overflow_skips = s.scaler->skippedSteps();
  r.comm = s.sync().describe();
  if (!cfg.save_weights.empty() && s.isRank0()) {  // the final evaluation averaged the BN statistics
    try {
      writeFileAtomicByPath(cfg.save_weights,
                            [&](const std::string& tmp) { models::writeNamedTensors(tmp, models::stateOf(*s.model)); });
    } catch (const IoError& e) {
      AIACC_THROW(IoError, "--save-weights: ", e.what());
    }
  }
  return r;
}

}  // namespace aiacc::app
