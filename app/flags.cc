#include "app/flags.h"

#include "app/cli.h"
#include "app/exit_code.h"
#include "app/option_names.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "aiacc/common/error.h"
#include "aiacc/common/parse_number.h"
#include "aiacc/common/shortest_double.h"
#include "models/resnet.h"

DECLARE_int32(gpus);            // app/flags_dist.cc
DECLARE_string(elastic_batch);  // app/flags_dist.cc (with the elastic flags; a training setting)

// ---- Data ----------------------------------------------------------------------------------
DEFINE_string(data, "",
              "ImageNet-layout folder (train/<class>/*, val/<class>/*), or 'synthetic' "
              "for random tensors at full speed (throughput runs without I/O)");
DEFINE_int32(workers, 2, "decode threads per process");
DEFINE_int32(prefetch, 4, "batches decoded ahead of training (memory bound: prefetch x batch)");
DEFINE_int32(jpeg_index_mb, 1024,
             "memory (MiB) for JPEG entropy indexes, for each of the train and val "
             "loaders: a file's first decode also records where each MCU row (and every other MCU) starts "
             "in its Huffman data, with the DC predictors there (about 4 KB per 500 px photo; deferred to "
             "a later epoch when more than a tenth of the image lies below the crop); later decodes then start at the "
             "crop's MCUs and touch no other (same pixels; the later epochs 1.14x faster at 128 px and "
             "1.07x at 224 in scripts/bench_data.sh, the first epoch about as fast as without). Files past the budget, "
             "progressive JPEGs and JPEGs with "
             "restart markers decode without. 0: off");
DEFINE_int64(max_image_pixels, aiacc::data::kDefaultMaxImagePixels,
             "the largest image decoded, in pixels (width x height, read from the file's header): a larger "
             "one, or a JPEG claiming more 8x8 blocks than its file has bits, is skipped and counted as a bad "
             "image before any memory is spent on it (decompression bombs). The default is where PIL refuses "
             "(2 x Image.MAX_IMAGE_PIXELS)");
DEFINE_bool(libjpeg_huffman, false,
            "entropy-decode JPEGs with libjpeg-turbo's own Huffman decoder instead of "
            "aiacc's (data/entropy_hook.h: the same pixels, about 1.3x faster crop decoding at 128 px); for "
            "comparison, or should a file ever decode differently");
DEFINE_double(min_scale, 0.08, "random-resized-crop minimum area fraction (torchvision: 0.08)");
DEFINE_double(max_scale, 1.0, "random-resized-crop maximum area fraction");
DEFINE_double(min_ratio, 0.75, "random-resized-crop minimum aspect ratio (3/4)");
DEFINE_double(max_ratio, 4.0 / 3.0, "random-resized-crop maximum aspect ratio (4/3)");
DEFINE_string(resize, "torchvision",
              "how a crop becomes the training image: torchvision (the default: the crop "
              "decoded at full resolution and resized with Pillow's antialiased bilinear filter, val as "
              "Resize(size / crop-fraction) + CenterCrop; the pictures torchvision makes, to the byte) | dct (the "
              "crop decoded at the smallest DCT scale that still covers the output, then Pillow's filter: less "
              "decoding for small outputs, close to torchvision's pictures) | fast (DCT-scaled decode and OpenCV's "
              "2-tap bilinear, area averaging from 2x down; val a centered square of crop-fraction of the short "
              "side: the fastest, but it aliases when shrinking by less than 2x, so the network sees other "
              "pictures than torchvision's; compare with scripts/convergence/bench.sh)");
DEFINE_double(crop_fraction, 0.875, "val: resize short side to size/crop_fraction, center crop size");
DEFINE_bool(channels_last, false,
            "channels-last (NHWC) batches and conv weights; default on with "
            "--gpus (tensor cores want NHWC), off on the CPU");
DEFINE_bool(amp, false,
            "mixed precision: autocast (conv/matmul in --amp-dtype) with fp32 master "
            "weights and a dynamic loss scaler; default on with --gpus (on a CPU without bf16 "
            "units it is correct but several times slower than fp32)");
DEFINE_string(amp_dtype, "auto",
              "autocast dtype: fp16 (dynamic loss scaling) | bf16 (none needed) | "
              "auto (fp16 on GPU, bf16 on CPU)");
DEFINE_bool(cudnn_benchmark, true, "GPU: let cuDNN time its convolution algorithms for each new shape");
DEFINE_int64(synthetic_images, 1281167, "images per epoch with --data synthetic (ImageNet's count)");
DEFINE_int64(synthetic_classes, 1000, "classes with --data synthetic");
DEFINE_int32(eval_batch_size, 0, "evaluation batch size per process; 0: the training batch size");
DEFINE_int32(image_size, 224, "training image size (side, pixels) when no stage schedule is set");
DEFINE_string(resize_schedule, "", "progressive resizing, EPOCH:SIZE list, e.g. 0:128,10:192,14:224");
// ---- Model ---------------------------------------------------------------------------------
DEFINE_string(arch, "resnet50",
              "model: resnet18 | resnet34 | resnet50 | resnet101 (v1.5); each also narrowed, as resnet18-w16: "
              "stages of 16 to 128 channels instead of 64 to 512 (-w8, -w16, -w32), for smoke tests");
DEFINE_bool(zero_init_residual, false, "zero-init the last BN gamma of each residual block");
DEFINE_string(init_weights, "",
              "start from this model state instead of a fresh initialization, with torchvision's "
              "parameter and buffer names: a torch.save file (torch.save(model.state_dict(), 'X.pt'), "
              "also a checkpoint holding it under 'state_dict' or 'model', DDP's 'module.' stripped; "
              "what --save-weights X.pt writes) or an aiacc named-tensor file (models/weights.h). A "
              "classifier (fc) for another class count is re-initialised, and said so");
// ---- Optimization --------------------------------------------------------------------------
DEFINE_int32(batch_size, 32, "batch size per process");
DEFINE_int32(epochs, 90, "epochs to train (the LR schedule spans them)");
DEFINE_double(lr, 0.1, "peak learning rate per 256 images; scaled by global batch / 256");
DEFINE_double(warmup_epochs, 2, "linear LR warmup from 0, in epochs (fractional allowed)");
DEFINE_string(lr_schedule, "cosine", "LR shape after warmup: cosine | step | linear (to 0)");
DEFINE_string(lr_step_epochs, "30,60,80", "epochs where the step schedule multiplies LR by gamma");
DEFINE_double(lr_step_gamma, 0.1, "step schedule factor");
DEFINE_double(momentum, 0.9, "SGD momentum");
DEFINE_bool(nesterov, false, "Nesterov momentum");
DEFINE_double(weight_decay, 1e-4, "L2 weight decay (not on BN parameters and biases by default)");
DEFINE_bool(bn_weight_decay, false, "also decay BN parameters and biases");
DEFINE_double(label_smoothing, 0.1, "label smoothing of the cross-entropy loss");
DEFINE_string(recipe, "", "recipe file (key = value lines and stage lines); flags override it");
// ---- Run control ---------------------------------------------------------------------------
DEFINE_uint64(seed, 0, "seed of initialization, shuffling and augmentation");
DEFINE_int64(max_steps, 0, "stop after this many optimizer steps; 0: no limit");
DEFINE_double(target_top1, 0, "stop when val top-1 reaches this percent; 0: no target");
DEFINE_double(target_top5, 0, "stop when val top-5 reaches this percent (DAWNBench: 93); 0: none");
DEFINE_int64(eval_every, 0, "evaluate every N steps; 0: at the end of each epoch");
DEFINE_int32(threads, 0, "intra-op compute threads; 0: cores divided by local processes");
DEFINE_double(progress_seconds, 2.0, "seconds between progress lines");
DEFINE_int64(log_every, 1,
             "a --metrics-file step line (and TensorBoard point) every N steps, with the job's numbers "
             "over them: the loss averaged over every rank's images, images and images/s summed over "
             "ranks; each is one small blocking sum over the ranks (raise N where a round trip is slow)");
DEFINE_bool(keep_freed_memory, true,
            "keep freed memory in the process heap (glibc: blocks up to "
            "32 MiB from the heap, no trimming) so each step's tensors reuse it instead of new "
            "page-faulting mmaps: ~10% faster CPU steps for a little more resident memory; "
            "--nokeep-freed-memory: the C library's defaults");
// --log-dir is glog's flag (glog defines it; aiacc logs to stderr, so glog itself writes no files
// there): the launcher's per-rank output files. Its help line is kLogDirHelp.
constexpr const char* kLogDirHelp =
    "  --log-dir (string, default \"\")\n      launcher (--nproc / --gpus): write worker R's stdout and "
    "stderr to DIR/rank-R.log instead of this terminal, where each worker line is prefixed with "
    "[rank R]\n";
// ---- Outputs -------------------------------------------------------------------------------
DEFINE_string(checkpoint_dir, "",
              "write a checkpoint here after each epoch and at a stop (SIGTERM, SIGINT, SIGUSR1: the "
              "ranks agree on a step, save it and exit 75; atomic rename)");
DEFINE_string(checkpoint_every, "",
              "also checkpoint in the middle of epochs: every N steps ('500') or every so much time ('10m', "
              "'90s', '1h'; rank 0's clock, agreed across ranks); written in the background, one write in "
              "flight (a checkpoint due while the previous one is still being written is skipped and counted)");
DEFINE_int32(keep_checkpoints, 3,
             "checkpoints kept in --checkpoint-dir (the newest; each is DIR/step-N.ckpt with a manifest of "
             "its size and CRC-32C, and DIR/latest names the newest once it is on disk; checkpoints of later "
             "steps than this run's, an earlier run's, are kept and not counted until this run reaches them)");
DEFINE_bool(evaluate, false,
            "evaluate only: run the val split once with the model of --init-weights or --resume (on 1 or "
            "--nproc N ranks), report top-1 / top-5 / loss and exit; no training step, no checkpoint");
DEFINE_string(resume, "",
              "continue from a checkpoint: a file (an error if it cannot be read), or 'auto': the newest "
              "whole one in --checkpoint-dir (a corrupt or truncated newer one is named and passed over), a "
              "fresh start when there is none (one command line both starts and "
              "restarts a job); the run continues at the next batch of the same epoch");
DEFINE_string(metrics_file, "",
              "JSON lines (rank 0): every --log-every steps the job's loss, lr, images and images/s, "
              "exposed communication and skipped steps; per evaluation top1, top5, loss");
DEFINE_string(tensorboard_dir, "",
              "TensorBoard event files (rank 0) in this folder: the metrics file's step and eval "
              "points as scalars (train/..., eval/...) and the resolved flags as text (config)");
DEFINE_string(report_file, "",
              "final report as JSON (rank 0); beside it summary.csv (a row per epoch: epoch, train_loss, "
              "eval_loss, eval_top1, eval_top5, lr), args.json (every flag's value) and args.flags (the "
              "same for --flagfile, to rerun the settings)");
DEFINE_string(save_weights, "",
              "write the final model state (BN statistics averaged over ranks) with torchvision's "
              "names: a name ending in .pt or .pth gets torch.save's format (torch.load(X, "
              "weights_only=True) gives a dict that torchvision's load_state_dict takes), any other "
              "name aiacc's named-tensor file; --init-weights reads both");
DEFINE_string(timeline, "",
              "Chrome-trace JSON of rank 0's steps: compute spans and one row per "
              "communication channel (open in Perfetto or chrome://tracing)");
DEFINE_string(dawnbench_dir, "", "write a DAWNBench-format submission (JSON + TSV) here");
DEFINE_double(cost_per_hour, 0, "USD per hour of the machine, for the DAWNBench JSON");
DEFINE_string(author, "aiacc", "author field of the DAWNBench JSON");
DEFINE_bool(dry_run, false,
            "check the command line and exit: every flag, the recipe and the launcher's variables are "
            "parsed as for the run (a usage error exits 2), what would run is printed, and nothing "
            "else is read or started (exit 0)");
// ---- Sample data ---------------------------------------------------------------------------
DEFINE_string(make_sample, "", "generate the sample ImageNet-layout JPEG dataset in DIR and exit");
DEFINE_string(convert_weights, "",
              "convert the weights in this file (aiacc's named-tensor file, or a torch.save state dict or "
              "checkpoint as --init-weights reads it) to --save-weights OUT (.pt/.pth: torch.save's format; any "
              "other name: aiacc's) and exit");
DEFINE_int32(sample_classes, 20, "classes of the generated sample (shapes x hues)");
DEFINE_int32(sample_shapes, 5, "shapes of the generated sample (1..5); classes = shapes x hues");
DEFINE_int32(sample_train_per_class, 100, "train images per class of the generated sample");
DEFINE_int32(sample_val_per_class, 25, "val images per class of the generated sample");
DEFINE_int32(sample_min_side, 64, "smallest image side of the generated sample");
DEFINE_int32(sample_max_side, 112, "largest image side of the generated sample");

namespace aiacc::app {

std::string makeSampleFlag() { return FLAGS_make_sample; }
std::pair<std::string, std::string> convertWeightsFlags() { return {FLAGS_convert_weights, FLAGS_save_weights}; }
bool keepFreedMemoryFlag() { return FLAGS_keep_freed_memory; }
bool dryRunFlag() { return FLAGS_dry_run; }

data::SampleSpec sampleSpecFromFlags() {
  data::SampleSpec spec;
  spec.classes = FLAGS_sample_classes;
  spec.shapes = FLAGS_sample_shapes;
  spec.train_per_class = FLAGS_sample_train_per_class;
  spec.val_per_class = FLAGS_sample_val_per_class;
  spec.min_side = FLAGS_sample_min_side;
  spec.max_side = FLAGS_sample_max_side;
  return spec;
}

namespace {
std::string underscores(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}
std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}
// aiacc_train's flags: this file's and the distribution flags'.
const std::vector<std::string> kFlagSources = {"app/flags.cc", "app/flags_dist.cc"};
bool isOurFlag(const gflags::CommandLineFlagInfo& f) { return flagDefinedIn(f, kFlagSources); }
}  // namespace

void printHelp(const char* program) {
  std::cout << "Usage: " << program << " --data DIR|synthetic [flags]\n"
            << "Trains ResNet v1.5 on an ImageNet-layout folder and reports time to a target "
               "accuracy.\nFlags may be written --batch-size or --batch_size; booleans as "
               "--flag / --noflag.\n\n";
  printFlagsFrom(kFlagSources, std::cout);
  std::cout << kLogDirHelp;
  std::cout << "\nEnvironment: each variable sets what its flag does where the command line does not give the "
               "flag (over a recipe's value); a value it cannot read is an error naming it\n";
  for (const comm::EnvKnob& k : comm::envKnobs()) {
    const std::string flag = flagOfVariable(k.name);
    gflags::CommandLineFlagInfo info;
    const std::string what = gflags::GetCommandLineFlagInfo(flag.c_str(), &info)
                                 ? "--" + hyphens(flag)
                                 : strCat("DataParallelOptions::", k.sets, ", no flag");
    std::cout << "  " << k.name << " (" << k.values << ")\n      " << what << "\n";
  }
  std::cout << "\n" << exitCodeHelp();
}

std::vector<Stage> applyRecipe(const std::string& path, std::string* text) {
  std::ifstream in(path);
  AIACC_CHECK_INPUT(in.good(), "cannot open --recipe file '", path, "'");
  std::stringstream all;
  all << in.rdbuf();
  if (text) *text = all.str();
  std::vector<Stage> stages;
  std::istringstream lines(all.str());
  std::string line;
  int lineno = 0;
  while (std::getline(lines, line)) {
    ++lineno;
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = strCat(path, ":", lineno);
    if (line.rfind("stage", 0) == 0 && (line.size() == 5 || line[5] == ' ' || line[5] == '\t')) {
      std::istringstream ls(line.substr(5));
      Stage s;
      s.batch_size = FLAGS_batch_size;
      s.scale_min = FLAGS_min_scale;
      s.image_size = FLAGS_image_size;
      AIACC_CHECK_INPUT(static_cast<bool>(ls >> s.start_epoch), where,
                        ": expected 'stage EPOCH size=S [batch=B] [scale=M]'");
      std::string kv;
      while (ls >> kv) {
        const auto eq = kv.find('=');
        AIACC_CHECK_INPUT(eq != std::string::npos, where, ": '", kv, "' is not key=value");
        const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
        if (k == "size" || k == "batch") {
          const std::optional<int> n = parseInteger<int>(v);
          AIACC_CHECK_INPUT(n && *n >= 1, where, ": ", k, "=", v, " is not a whole number from 1 to 2^31-1");
          (k == "size" ? s.image_size : s.batch_size) = *n;
        } else if (k == "scale") {
          const std::optional<double> x = parseFinite(v);
          AIACC_CHECK_INPUT(x && *x > 0 && *x <= 1, where, ": scale=", v, " is not a number in (0, 1]");
          s.scale_min = *x;
        } else {
          AIACC_THROW(InputError, where, ": unknown stage key '", k, "' (size, batch, scale)");
        }
      }
      AIACC_CHECK_INPUT(stages.empty() ? s.start_epoch == 0 : s.start_epoch > stages.back().start_epoch, where,
                        ": stage epochs must start at 0 and increase");
      stages.push_back(s);
      continue;
    }
    const auto eq = line.find('=');
    AIACC_CHECK_INPUT(eq != std::string::npos, where, ": expected 'key = value' or a stage line");
    const std::string key = underscores(trim(line.substr(0, eq)));
    const std::string value = trim(line.substr(eq + 1));
    gflags::CommandLineFlagInfo info;
    AIACC_CHECK_INPUT(gflags::GetCommandLineFlagInfo(key.c_str(), &info) && isOurFlag(info), where, ": unknown key '",
                      hyphens(key), "' (keys are aiacc_train flag names)");
    if (!info.is_default) continue;  // the command line wins
    AIACC_CHECK_INPUT(
        !gflags::SetCommandLineOptionWithMode(key.c_str(), value.c_str(), gflags::SET_FLAGS_DEFAULT).empty(), where,
        ": bad value '", value, "' for ", hyphens(key));
  }
  return stages;
}

Recipe applyRecipeFlag() {
  Recipe r;
  if (FLAGS_recipe.empty()) return r;
  r.path = FLAGS_recipe;
  r.stages = applyRecipe(FLAGS_recipe, &r.text);
  return r;
}

// Every training flag of aiacc_train with its value after the recipe and the command line, by
// name; --make-sample's own flags are left out (given_only: only those the command line or a
// --flagfile gave).
std::vector<std::pair<std::string, std::string>> flagValues(bool given_only) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : all) {
    if (!isOurFlag(f) || f.name == "make_sample" || f.name == "convert_weights" || f.name == "dry_run" ||
        f.name.rfind("sample_", 0) == 0)
      continue;
    if (given_only && f.is_default) continue;
    // Doubles as the shortest form that reads back the same (gflags prints 17 digits).
    out.emplace_back(f.name, f.type == "double" ? shortestDouble(std::strtod(f.current_value.c_str(), nullptr))
                                                : f.current_value);
  }
  return out;
}

Config configFromFlags(const Recipe& recipe) {
  Config c;
  c.resolved_flags = flagValues(false);
  c.given_flags = flagValues(true);
  c.recipe = recipe.path;
  c.recipe_text = recipe.text;
  const std::vector<Stage>& recipe_stages = recipe.stages;
  auto set_on_cli = [](const char* name) {
    gflags::CommandLineFlagInfo info;
    gflags::GetCommandLineFlagInfo(name, &info);
    return !info.is_default;
  };
  c.data = FLAGS_data;
  c.workers = FLAGS_workers;
  c.prefetch = FLAGS_prefetch;
  AIACC_CHECK_INPUT(FLAGS_jpeg_index_mb >= 0, "--jpeg-index-mb must be 0 or more (got ", FLAGS_jpeg_index_mb, ")");
  c.jpeg_index_mb = FLAGS_jpeg_index_mb;
  AIACC_CHECK_INPUT(FLAGS_max_image_pixels >= 1, "--max-image-pixels must be 1 or more (got ", FLAGS_max_image_pixels,
                    ")");
  c.max_image_pixels = FLAGS_max_image_pixels;
  c.libjpeg_huffman = FLAGS_libjpeg_huffman;
  c.scale_max = FLAGS_max_scale;
  c.ratio_min = FLAGS_min_ratio;
  c.ratio_max = FLAGS_max_ratio;
  c.crop_fraction = FLAGS_crop_fraction;
  {
    const std::optional<data::ResizeMode> mode = data::resizeModeFromName(FLAGS_resize);
    AIACC_CHECK_INPUT(mode.has_value(), "--resize must be torchvision, dct or fast (got '", FLAGS_resize, "')");
    c.resize = *mode;
  }
  // GPU defaults: channels-last and AMP unless the command line turns them off.
  c.cuda = FLAGS_gpus > 0;
  c.channels_last = FLAGS_channels_last || (c.cuda && !set_on_cli("channels_last"));
  c.amp = FLAGS_amp || (c.cuda && !set_on_cli("amp"));
  if (FLAGS_amp_dtype == "auto") {
    c.amp_dtype = c.cuda ? AmpDtype::kFp16 : AmpDtype::kBf16;
  } else {
    const std::optional<AmpDtype> dtype = optionFromName<AmpDtype>(FLAGS_amp_dtype);
    if (!dtype) throwBadOption("--amp-dtype", optionNames<AmpDtype>("auto"), FLAGS_amp_dtype);
    c.amp_dtype = *dtype;
  }
  AIACC_CHECK_INPUT(!(c.amp && !c.cuda && c.amp_dtype == AmpDtype::kFp16),
                    "--amp-dtype fp16 needs --gpus (CPU autocast computes in bf16)");
  c.cudnn_benchmark = FLAGS_cudnn_benchmark;
  c.synthetic_images = FLAGS_synthetic_images;
  c.synthetic_classes = FLAGS_synthetic_classes;
  c.eval_batch_size = FLAGS_eval_batch_size;
  c.arch = FLAGS_arch;
  models::requireResNetArch(c.arch);
  c.zero_init_residual = FLAGS_zero_init_residual;
  c.init_weights = FLAGS_init_weights;
  c.epochs = FLAGS_epochs;
  c.lr = FLAGS_lr;
  c.warmup_epochs = FLAGS_warmup_epochs;
  c.lr_step_epochs.clear();
  {
    std::stringstream ss(FLAGS_lr_step_epochs);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const std::optional<int> epoch = parseInteger<int>(trim(item));
      AIACC_CHECK_INPUT(epoch && *epoch >= 0, "--lr-step-epochs '", FLAGS_lr_step_epochs, "' is not a list of epochs");
      c.lr_step_epochs.push_back(*epoch);
    }
  }
  c.lr_step_gamma = FLAGS_lr_step_gamma;
  c.momentum = FLAGS_momentum;
  c.nesterov = FLAGS_nesterov;
  c.weight_decay = FLAGS_weight_decay;
  c.bn_weight_decay = FLAGS_bn_weight_decay;
  c.label_smoothing = FLAGS_label_smoothing;
  c.seed = FLAGS_seed;
  c.max_steps = FLAGS_max_steps;
  c.target_top1 = FLAGS_target_top1;
  c.target_top5 = FLAGS_target_top5;
  c.eval_every = FLAGS_eval_every;
  AIACC_CHECK_INPUT(FLAGS_log_every >= 1, "--log-every must be at least 1 (got ", FLAGS_log_every, ")");
  c.log_every = FLAGS_log_every;
  c.threads = FLAGS_threads;
  c.progress_seconds = FLAGS_progress_seconds;
  c.checkpoint_dir = FLAGS_checkpoint_dir;
  c.resume = FLAGS_resume;
  c.keep_checkpoints = FLAGS_keep_checkpoints;
  if (!FLAGS_checkpoint_every.empty()) {
    const std::string& v = FLAGS_checkpoint_every;
    size_t used = 0;
    double n = -1;
    try {
      n = std::stod(v, &used);
    } catch (const std::exception&) {
    }
    const std::string unit = v.substr(used);
    const double scale = unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : 0;
    const bool steps = unit.empty() && n >= 1 && n == std::floor(n);
    AIACC_CHECK_INPUT(steps || (scale > 0 && n > 0), "--checkpoint-every must be a step count (500) or a time ",
                      "(10m, 90s, 1h); got '", v, "'");
    AIACC_CHECK_INPUT(!c.checkpoint_dir.empty(), "--checkpoint-every needs --checkpoint-dir");
    if (steps) {
      c.checkpoint_every_steps = static_cast<int64_t>(n);
    } else {
      c.checkpoint_every_s = n * scale;
    }
  }
  AIACC_CHECK_INPUT(c.keep_checkpoints >= 1, "--keep-checkpoints must be at least 1 (got ", c.keep_checkpoints, ")");
  AIACC_CHECK_INPUT(c.resume != "auto" || !c.checkpoint_dir.empty(),
                    "--resume auto needs --checkpoint-dir (the folder to resume from)");
  c.evaluate_only = FLAGS_evaluate;
  AIACC_CHECK_INPUT(!c.evaluate_only || !c.init_weights.empty() || !c.resume.empty(),
                    "--evaluate needs the model to evaluate: --init-weights FILE or --resume CHECKPOINT");
  c.metrics_file = FLAGS_metrics_file;
  c.tensorboard_dir = FLAGS_tensorboard_dir;
  c.save_weights = FLAGS_save_weights;
  c.report_file = FLAGS_report_file;
  c.dawnbench_dir = FLAGS_dawnbench_dir;
  c.cost_per_hour = FLAGS_cost_per_hour;
  c.author = FLAGS_author;

  // Stages: --resize-schedule on the command line beats the recipe's stages; --batch-size,
  // --min-scale and --image-size on the command line override every stage's value.
  if (!FLAGS_resize_schedule.empty() && (set_on_cli("resize_schedule") || recipe_stages.empty())) {
    c.stages = parseResizeSchedule(FLAGS_resize_schedule, FLAGS_batch_size, FLAGS_min_scale);
  } else if (!recipe_stages.empty()) {
    c.stages = recipe_stages;
  } else {
    c.stages = {Stage{0, FLAGS_image_size, FLAGS_batch_size, FLAGS_min_scale}};
  }
  for (Stage& s : c.stages) {
    if (set_on_cli("batch_size")) s.batch_size = FLAGS_batch_size;
    if (set_on_cli("min_scale")) s.scale_min = FLAGS_min_scale;
    if (set_on_cli("image_size") && !set_on_cli("resize_schedule")) s.image_size = FLAGS_image_size;
    AIACC_CHECK_INPUT(s.batch_size >= 1, "batch size must be at least 1 (got ", s.batch_size, ")");
    AIACC_CHECK_INPUT(s.image_size >= 16, "image size must be at least 16 (got ", s.image_size, ")");
    AIACC_CHECK_INPUT(s.scale_min > 0 && s.scale_min <= c.scale_max, "--min-scale must be in (0, --max-scale]");
  }
  AIACC_CHECK_INPUT(c.epochs >= 1, "--epochs must be at least 1");
  AIACC_CHECK_INPUT(c.lr > 0, "--lr must be positive");
  // The default warmup (or a recipe's) is cut to a shorter run: `--epochs 1` works as given.
  if (!set_on_cli("warmup_epochs")) c.warmup_epochs = std::min(c.warmup_epochs, static_cast<double>(c.epochs));
  AIACC_CHECK_INPUT(c.warmup_epochs >= 0 && c.warmup_epochs <= c.epochs, "--warmup-epochs must be in [0, --epochs]");
  c.lr_schedule = parseOption<LrSchedule>("--lr-schedule", FLAGS_lr_schedule);
  c.elastic_batch = parseOption<ElasticBatch>("--elastic-batch", FLAGS_elastic_batch);
  AIACC_CHECK_INPUT(c.label_smoothing >= 0 && c.label_smoothing < 1, "--label-smoothing must be in [0, 1)");
  AIACC_CHECK_INPUT(c.ratio_min > 0 && c.ratio_min <= c.ratio_max, "need 0 < --min-ratio <= --max-ratio");
  AIACC_CHECK_INPUT(c.crop_fraction > 0 && c.crop_fraction <= 1, "--crop-fraction must be in (0, 1]");
  AIACC_CHECK_INPUT(c.target_top1 >= 0 && c.target_top1 <= 100 && c.target_top5 >= 0 && c.target_top5 <= 100,
                    "targets are percentages in [0, 100]");
  return c;
}

}  // namespace aiacc::app
