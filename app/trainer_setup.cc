// Trainer's set-up (app/trainer.h): the device, the data, the model with its resumed position,
// the checkpoint writer and rank 0's outputs; the training loop is in trainer.cc.
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
  requireData(cfg);
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
  // (A process that joined a running job holds no checkpoint of its own: -1, as the survivors
  // hold after their regroup.)
  run.checkpoint_step = joined_running ? -1 : pos.step;
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

}  // namespace aiacc::app
