// What aiacc_train's checkpoints carry besides the training state (app/checkpoint.h, format 5):
// the dataset's class names and the resolved configuration, read back the way Python would
// (torch.save's format through models/torch_unpickler.h); that configuration, as a --flagfile,
// reruns the same settings.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "app/checkpoint.h"
#include "models/torch_unpickler.h"
#include "models/torch_values.h"
#include "aiacc/common/error.h"
#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

using test::runTrain;

c10::impl::GenericDict newestCheckpoint(const std::string& dir) {
  return models::readTorchSave(test::newestCheckpoint(dir)).value.toGenericDict();
}

std::map<std::string, std::string> pairs(const c10::IValue& v) {
  std::map<std::string, std::string> out;
  for (const auto& kv : v.toGenericDict()) out[kv.key().toStringRef()] = kv.value().toStringRef();
  return out;
}

TEST(CheckpointFormat, CarriesClassNamesAndTheConfigurationAFlagfileReruns) {
  test::TempDir d;
  const std::string sample = d / "sample";
  auto [rc, out] = runTrain("--make-sample " + sample +
                            " --sample-classes 3 --sample-train-per-class 4 --sample-val-per-class 1 "
                            "--sample-min-side 40 --sample-max-side 60");
  ASSERT_EQ(rc, 0) << out;
  const std::string common = " --arch resnet18 --image-size 16 --batch-size 4 --epochs 1 --warmup-epochs 0 "
                             "--threads 1 --noautotune --workers 1";
  std::tie(rc, out) = runTrain("--data " + sample + common + " --lr 0.3 --label-smoothing 0.05 --checkpoint-dir " +
                               (d / "a"));
  ASSERT_EQ(rc, 0) << out;
  const c10::impl::GenericDict a = newestCheckpoint(d / "a");

  const std::vector<std::string> folders = test::namesIn(sample + "/train");
  std::vector<std::string> classes;
  for (const c10::IValue& c : a.at("classes").toList()) classes.push_back(c.toStringRef());
  EXPECT_EQ(classes, folders) << "label i is the i-th class folder in sorted order";

  const std::map<std::string, std::string> config = pairs(a.at("config"));
  EXPECT_EQ(config.at("lr"), "0.3");
  EXPECT_EQ(config.at("label_smoothing"), "0.05");
  EXPECT_EQ(config.at("arch"), "resnet18");
  EXPECT_EQ(config.at("momentum"), "0.9") << "defaults are resolved too";
  EXPECT_EQ(config.count("sample_classes"), 0u) << "--make-sample's own flags are no training setting";
  EXPECT_EQ(config.count("help"), 0u) << "only aiacc_train's flags";

  // The configuration as a flag file reruns the same settings.
  std::string flagfile;
  for (const auto& [name, value] : config) flagfile += "--" + name + "=" + value + "\n";
  test::writeText(d / "run.flags", flagfile);
  std::tie(rc, out) = runTrain("--flagfile " + (d / "run.flags") + " --checkpoint-dir " + (d / "b"));
  ASSERT_EQ(rc, 0) << out;
  const c10::impl::GenericDict b = newestCheckpoint(d / "b");
  std::map<std::string, std::string> again = pairs(b.at("config"));
  EXPECT_EQ(again.at("checkpoint_dir"), d / "b");
  again["checkpoint_dir"] = config.at("checkpoint_dir");
  EXPECT_EQ(again, config);
  EXPECT_EQ(pairs(b.at("training_state").toGenericDict().at("settings")),
            pairs(a.at("training_state").toGenericDict().at("settings")))
      << "the settings the continuation depends on";
  EXPECT_TRUE(b.at("model")
                  .toGenericDict()
                  .at("fc.weight")
                  .toTensor()
                  .equal(a.at("model").toGenericDict().at("fc.weight").toTensor()))
      << "the same run";
}

// fp16 transfer's own scale (--allreduce-dtype fp16 without AMP) travels in the checkpoint: a
// 2-rank job writes it at the end of its one epoch (3 steps), and a job resumed from a checkpoint
// whose scale Python set to 2^40 starts from that scale: its steps overflow the fp16 wire and are
// skipped, each halving the scale (a resumed job that ignored the saved scale would start at 1024
// and skip none). A checkpoint without the keys (written before they existed) resumes with the
// initial scale.
TEST(CheckpointFormat, Fp16TransferScaleIsSavedAndRestored) {
  test::TempDir d;
  auto job = [](const std::string& args) {  // a fresh port per job: the store of the last may linger
    return runTrain(strCat("--nproc 2 --master 127.0.0.1:", test::freePort(),
                           " --data synthetic --synthetic-images 48 --synthetic-classes 4 --arch resnet18 "
                           "--batch-size 8 --image-size 16 --warmup-epochs 0 --threads 1 --noautotune --streams 1 "
                           "--allreduce-dtype fp16 --progress-seconds 1000 ",
                           args));
  };
  auto [rc, out] = job("--epochs 1 --checkpoint-dir " + (d / "a"));  // 48 images, 2 ranks x 8: 3 steps
  ASSERT_EQ(rc, 0) << out;
  const c10::impl::GenericDict st = newestCheckpoint(d / "a").at("training_state").toGenericDict();
  EXPECT_EQ(models::realOf(st.at("transfer_scale"), "transfer_scale"), 1024)
      << "the initial scale (no overflow, no growth in 3 steps)";
  EXPECT_EQ(st.at("transfer_scale_good_steps").toInt(), 3);

  // Python edits the checkpoint (torch.load / torch.save, as a user would): the scale set to 2^40,
  // and a copy without the two keys.
  test::writeText(d / "edit.py",
                  "import sys\n"
                  "try:\n"
                  "    import torch\n"
                  "except ImportError:\n"
                  "    sys.exit(3)\n"
                  "ck = torch.load(sys.argv[1], weights_only=True)\n"
                  "ck['training_state']['transfer_scale'] = 2.0 ** 40\n"
                  "torch.save(ck, sys.argv[2])\n"
                  "del ck['training_state']['transfer_scale'], ck['training_state']['transfer_scale_good_steps']\n"
                  "torch.save(ck, sys.argv[3])\n");
  std::tie(rc,
           out) = test::runShell(strCat(AIACC_GOLDEN_PYTHON, " ", d / "edit.py", " ", test::newestCheckpoint(d / "a"),
                                        " ", d / "big.ckpt", " ", d / "old.ckpt", " 2>&1"));
  if (rc == 3) GTEST_SKIP() << "no torch in " << AIACC_GOLDEN_PYTHON;
  ASSERT_EQ(rc, 0) << out;

  std::tie(rc, out) = job("--epochs 2 --resume " + (d / "big.ckpt") + " --checkpoint-dir " + (d / "b") +
                          " --report-file " + (d / "b.json"));
  ASSERT_EQ(rc, 0) << out;
  const int64_t skips = test::readJson(d / "b.json").at("overflow_skips").get<int64_t>();
  EXPECT_GE(skips, 1) << "2^40 x the gradients overflows fp16\n" << out;
  const c10::impl::GenericDict b = newestCheckpoint(d / "b").at("training_state").toGenericDict();
  EXPECT_EQ(models::realOf(b.at("transfer_scale"), "transfer_scale"), std::ldexp(1.0, 40 - static_cast<int>(skips)))
      << "halved once per skipped step";

  std::tie(rc, out) = job("--epochs 2 --resume " + (d / "old.ckpt") + " --checkpoint-dir " + (d / "c") +
                          " --report-file " + (d / "c.json"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(test::readJson(d / "c.json").at("overflow_skips").get<int64_t>(), 0);
  const c10::impl::GenericDict c = newestCheckpoint(d / "c").at("training_state").toGenericDict();
  EXPECT_EQ(models::realOf(c.at("transfer_scale"), "transfer_scale"), 1024);
  EXPECT_EQ(c.at("transfer_scale_good_steps").toInt(), 3) << "counted from the resume";
}

// The tuner's choice and the rebuilt bucket order travel in the checkpoint: a 2-rank job whose
// tuner froze within its 24 steps (--streams 1: fusion caps only, frozen after at most 19) saves
// them; the job resumed from it says so in one line and does not tune again, and its own
// checkpoint holds the same choice and order. (Before, every resumed job tuned again, its first
// ~19 steps in trial layouts.)
TEST(CheckpointFormat, TunedCommunicationIsSavedAndRestored) {
  test::TempDir d;
  auto job = [&d](const std::string& args) {
    return runTrain(strCat("--nproc 2 --master 127.0.0.1:", test::freePort(),
                           " --data synthetic --synthetic-images 384 --synthetic-classes 4 --arch resnet18 "
                           "--batch-size 8 --image-size 16 --warmup-epochs 0 --threads 1 --streams 1 "
                           "--progress-seconds 1000 --checkpoint-dir ",
                           d / "ck", " ", args));
  };
  auto [rc, out] = job("--epochs 1");  // 384 images, 2 ranks x 8: 24 steps
  ASSERT_EQ(rc, 0) << out;
  ASSERT_TRUE(test::contains(out, "autotune: chose")) << out;
  const c10::impl::GenericDict a = newestCheckpoint(d / "ck").at("training_state").toGenericDict();
  ASSERT_TRUE(a.at("comm_tuned").isGenericDict()) << "the tuner froze: its choice is saved";
  const c10::impl::GenericDict tuned = a.at("comm_tuned").toGenericDict();
  const double mb = models::realOf(tuned.at("bucket_mb"), "bucket_mb");
  EXPECT_TRUE(mb == 2 || mb == 8 || mb == 25 || mb == 64) << mb;
  EXPECT_EQ(tuned.at("channels").toInt(), 1);
  EXPECT_FALSE(tuned.at("two_level").toBool());
  EXPECT_EQ(a.at("channel_weights").toTensor().numel(), 0) << "one channel: nothing split";
  const at::Tensor order = a.at("bucket_order").toTensor();
  EXPECT_EQ(order.numel(), 62) << "resnet18's parameters, in the order their gradients arrived";
  EXPECT_EQ(std::get<0>(order.sort()).equal(at::arange(62, at::kLong)), true) << "each parameter once";

  std::tie(rc, out) = job("--epochs 2 --resume auto");
  ASSERT_EQ(rc, 0) << out;
  std::ostringstream restored;
  restored << "autotune: restored bucket " << mb << " MiB, 1 channel (chosen before; not tuned again)";
  EXPECT_TRUE(test::contains(out, restored.str())) << out;
  EXPECT_FALSE(test::contains(out, "autotune: chose")) << "tuned again\n" << out;
  const c10::impl::GenericDict b = newestCheckpoint(d / "ck").at("training_state").toGenericDict();
  EXPECT_EQ(b.at("step").toInt(), 48);
  ASSERT_TRUE(b.at("comm_tuned").isGenericDict());
  EXPECT_EQ(models::realOf(b.at("comm_tuned").toGenericDict().at("bucket_mb"), "bucket_mb"), mb);
  EXPECT_TRUE(b.at("bucket_order").toTensor().equal(order));
}

// What an elastic job's rank 0 sends survivors that hold its model (app/checkpoint.h's
// encodeTrainingState): the position, history, settings and RNG come back as they went; anything
// else (a whole checkpoint, a truncated blob) is an IoError naming what was read.
TEST(CheckpointFormat, TheTrainingStateAloneComesBackAsItWent) {
  TrainingState p;
  p.epochs_done = 3;
  p.step = 1234;
  p.images_seen = 98765;
  p.batches_in_epoch = 7;
  p.segment_offset = 120;
  p.segment_batch = 5;
  p.generation = 2;
  p.batch_world = 3;
  p.epoch_loss_sum = 12.5;
  p.evals.push_back(EvalPoint{10, 1.0, 4.5, 0.25, 0.75, 2.5, 30});
  p.settings = {{"--arch", "resnet18"}, {"--batch-size", "8"}};
  p.classes = {"cat", "dog"};
  p.config = {{"lr", "0.1"}};
  p.rng_cpu = at::arange(16, at::kByte);
  const std::string bytes = encodeTrainingState(p);
  EXPECT_LT(bytes.size(), 64u << 10);
  const TrainingState q = decodeTrainingState(bytes, "the state");
  EXPECT_EQ(q.epochs_done, 3);
  EXPECT_EQ(q.step, 1234);
  EXPECT_EQ(q.images_seen, 98765);
  EXPECT_EQ(q.batches_in_epoch, 7);
  EXPECT_EQ(q.segment_offset, 120);
  EXPECT_EQ(q.segment_batch, 5);
  EXPECT_EQ(q.generation, 2);
  EXPECT_EQ(q.batch_world, 3);
  EXPECT_EQ(q.epoch_loss_sum, 12.5);
  ASSERT_EQ(q.evals.size(), 1u);
  EXPECT_EQ(q.evals[0].top5, 0.75);
  EXPECT_EQ(q.settings, p.settings);
  EXPECT_EQ(q.classes, p.classes);
  EXPECT_EQ(q.config, p.config);
  ASSERT_TRUE(q.rng_cpu.defined());
  EXPECT_TRUE(q.rng_cpu.equal(p.rng_cpu));
  EXPECT_THROW(decodeTrainingState(bytes.substr(0, bytes.size() / 2), "a cut state"), IoError);
  try {
    decodeTrainingState("not a state", "rank 0's state");
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0's state"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace aiacc::app
