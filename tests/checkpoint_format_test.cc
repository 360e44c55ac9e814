// What aiacc_train's checkpoints carry besides the training state (app/checkpoint.h, format 5):
// the dataset's class names and the resolved configuration, read back the way Python would
// (torch.save's format through models/torch_unpickler.h); that configuration, as a --flagfile,
// reruns the same settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "models/torch_unpickler.h"
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

  std::vector<std::string> folders;
  for (const auto& e : std::filesystem::directory_iterator(sample + "/train")) folders.push_back(e.path().filename());
  std::sort(folders.begin(), folders.end());
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

}  // namespace
}  // namespace aiacc::app
