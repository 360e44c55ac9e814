// Weights in torch.save's format (models/torch_format.h): what aiacc writes, torch.load(...,
// weights_only=True) reads under the PyTorch of this build's configuration and torchvision's
// load_state_dict(strict=True) takes, giving the same logits; files are told apart by their bytes.
#include <gtest/gtest.h>

#include <torch/serialize/output-archive.h>

#include <cstdlib>

#include "aiacc/common/error.h"
#include "models/resnet.h"
#include "models/torch_format.h"
#include "models/torch_unpickler.h"
#include "models/weights.h"
#include "tests/test_util.h"

namespace aiacc::models {
namespace {

ResNet resnet(const std::string& arch, int64_t classes) {
  ResNetOptions o;
  o.arch = arch;
  o.num_classes = classes;
  return ResNet(o);
}

// A model whose BN statistics are not their initial values, so buffers count in its output.
ResNet trainedLooking(const std::string& arch, int64_t classes) {
  torch::manual_seed(3);
  ResNet m = resnet(arch, classes);
  torch::NoGradGuard no_grad;
  for (auto& b : m->named_buffers()) {
    if (b.key().find("running_mean") != std::string::npos) b.value().normal_(0, 0.1);
    if (b.key().find("running_var") != std::string::npos) b.value().uniform_(0.5, 1.5);
    if (b.key().find("num_batches_tracked") != std::string::npos) b.value().fill_(7);
  }
  return m;
}

using test::contains;

std::string inputErrorOf(const std::string& path) {
  try {
    readWeightsFile(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no InputError";
}

TEST(TorchFormat, StateDictInTorchvisionOrderRoundTrips) {
  test::TempDir d;
  ResNet a = trainedLooking("resnet18", 10);
  const NamedTensors sd = stateDictOf(*a);
  ASSERT_EQ(sd.size(), 122u) << "torchvision's resnet18 state_dict has 122 entries";
  EXPECT_EQ(sd[0].first, "conv1.weight");
  EXPECT_EQ(sd[1].first, "bn1.weight");
  EXPECT_EQ(sd[5].first, "bn1.num_batches_tracked");
  EXPECT_EQ(sd[6].first, "layer1.0.conv1.weight");
  EXPECT_EQ(sd.back().first, "fc.bias");
  for (const std::string name : {"a.pt", "a.pth", "a.bin"}) {
    writeWeightsFile(d / name, *a);
    EXPECT_EQ(test::readText(d / name).substr(0, 2), name == "a.bin" ? "AI" : "PK") << name;
    ResNet b = resnet("resnet18", 10);
    loadStateInto(*b, readWeightsFile(d / name));
    const NamedTensors back = stateDictOf(*b);
    ASSERT_EQ(back.size(), sd.size());
    for (size_t i = 0; i < sd.size(); ++i) {
      EXPECT_EQ(back[i].first, sd[i].first);
      EXPECT_TRUE(back[i].second.equal(sd[i].second)) << name << ": " << sd[i].first;
    }
  }
}

TEST(TorchFormat, DdpPrefixIsStrippedAndBadFilesAreOneLine) {
  test::TempDir d;
  writeTorchStateDict(d / "ddp.pt", {{"module.w", torch::ones({2})}, {"module.n", torch::tensor(3, torch::kLong)}});
  const NamedTensors t = readWeightsFile(d / "ddp.pt");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].first, "w");
  EXPECT_EQ(t[1].first, "n");
  EXPECT_EQ(t[1].second.scalar_type(), torch::kLong);

  test::writeText(d / "legacy.pt", std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19rest", 18));
  std::string e = inputErrorOf(d / "legacy.pt");
  EXPECT_TRUE(contains(e, "legacy (pre-1.6, non-zip) format")) << e;
  EXPECT_TRUE(contains(e, "re-save it as a plain dict of tensors: python3 -c")) << e;
  torch::serialize::OutputArchive archive;  // what aiacc's checkpoints of format 2 to 4 are
  archive.write("w", torch::ones({2}), /*is_buffer=*/true);
  archive.save_to(d / "script.pt");
  e = inputErrorOf(d / "script.pt");
  EXPECT_TRUE(contains(e, "is a TorchScript archive")) << e;
  test::writeText(d / "junk.pt", "hello");
  e = inputErrorOf(d / "junk.pt");
  EXPECT_TRUE(contains(e, "neither a torch.save file")) << e;
  EXPECT_FALSE(contains(e, "\n")) << e;
  EXPECT_THROW(readWeightsFile(d / "missing.pt"), IoError);
}

TEST(TorchFormat, ClassifierOfAnotherClassCountIsReinitialised) {
  test::TempDir d;
  ResNet imagenet = trainedLooking("resnet18", 10);
  writeWeightsFile(d / "w.pt", *imagenet);
  torch::manual_seed(5);
  ResNet mine = resnet("resnet18", 8);
  const at::Tensor fresh_fc = mine->named_parameters()["fc.weight"].clone();
  EXPECT_EQ(loadPretrainedInto(*mine, readWeightsFile(d / "w.pt"), "fc"), 10);
  EXPECT_TRUE(mine->named_parameters()["fc.weight"].equal(fresh_fc)) << "the classifier keeps its initialisation";
  EXPECT_TRUE(
      mine->named_parameters()["layer4.1.conv2.weight"].equal(imagenet->named_parameters()["layer4.1.conv2.weight"]));
  EXPECT_TRUE(mine->named_buffers()["bn1.running_var"].equal(imagenet->named_buffers()["bn1.running_var"]));
  ResNet same = resnet("resnet18", 10);
  EXPECT_EQ(loadPretrainedInto(*same, readWeightsFile(d / "w.pt"), "fc"), 0);
  EXPECT_TRUE(same->named_parameters()["fc.weight"].equal(imagenet->named_parameters()["fc.weight"]));
  ResNet other_arch = resnet("resnet34", 8);
  EXPECT_THROW(loadPretrainedInto(*other_arch, readWeightsFile(d / "w.pt"), "fc"), InputError)
      << "only the classifier may differ";
}

// The converter both ways: aiacc's named-tensor file to torch.save's and back, every tensor equal
// and in order; a torch.save file of bf16 tensors reads as float32; aiacc_train --convert-weights
// does the same from the command line.
TEST(TorchFormat, ConvertsBothWays) {
  test::TempDir d;
  ResNet m = trainedLooking("resnet18", 10);
  writeWeightsFile(d / "w.bin", *m);
  EXPECT_EQ(convertWeightsFile(d / "w.bin", d / "w.pt"), 122u);
  EXPECT_EQ(test::readText(d / "w.pt").substr(0, 2), "PK");
  EXPECT_EQ(convertWeightsFile(d / "w.pt", d / "back.bin"), 122u);
  const NamedTensors a = readWeightsFile(d / "w.bin"), b = readWeightsFile(d / "back.bin");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first;
  }
  writeTorchStateDict(d / "half.pt", {{"w", torch::ones({3}, torch::kBFloat16)}, {"i", torch::ones({2}, torch::kInt)}});
  try {
    convertWeightsFile(d / "half.pt", d / "half.bin");
    ADD_FAILURE() << "an int32 tensor has no place in aiacc's format";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "'i' in")) << e.what();
  }
  const auto [rc, out] = test::runShell(std::string(AIACC_TRAIN_BIN) + " --convert-weights " + (d / "w.pt") +
                                        " --save-weights " + (d / "cli.bin") + " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "wrote 122 tensors")) << out;
  EXPECT_TRUE(readWeightsFile(d / "cli.bin")[0].second.equal(a[0].second));
}

// Python's side: scripts/torch_load_check.py loads the file with weights_only=True into
// torchvision's model (strict, same key order), runs a seeded input and saves input and output
// with torch.save (a plain dict, read back here); aiacc's model gives the same output.
class TorchvisionLoads : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchvisionLoads, SavedWeightsGiveTheSameLogits) {
  const std::string arch = GetParam();
  test::TempDir d;
  ResNet m = trainedLooking(arch, 10);
  writeWeightsFile(d / "w.pt", *m);
  const std::string cmd = std::string(AIACC_GOLDEN_PYTHON) + " " + test::sourceDir() + "/scripts/torch_load_check.py " +
                          d.path() + "/w.pt " + arch + " 10 " + d.path() + "/io.pt > " + d.path() + "/out.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  if (WEXITSTATUS(rc) == 3) GTEST_SKIP() << test::readText(d / "out.txt");
  ASSERT_EQ(rc, 0) << test::readText(d / "out.txt");
  const NamedTensors io = readTorchStateDict(d / "io.pt");
  ASSERT_EQ(io.size(), 2u);
  ASSERT_EQ(io[0].first, "input");
  torch::NoGradGuard no_grad;
  m->eval();
  const torch::Tensor y = m->forward(io[0].second);
  EXPECT_TRUE(torch::allclose(y, io[1].second, 1e-4, 1e-5)) << "max diff " << (y - io[1].second).abs().max();
  // Python's own files for --init-weights: each holds this model's state dict.
  const NamedTensors ours = stateDictOf(*m);
  for (const std::string file : {"io.plain.pt", "io.ordered.pt", "io.nested.pt", "io.p4.pt"}) {
    const NamedTensors theirs = readWeightsFile(d / file);
    ASSERT_EQ(theirs.size(), ours.size()) << file;
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_EQ(theirs[i].first, ours[i].first) << file;
      EXPECT_TRUE(theirs[i].second.equal(ours[i].second)) << file << ": " << ours[i].first;
    }
  }
  // The training checkpoint's other values come through the restricted unpickler as plain values.
  const Unpickled nested = readTorchSave(d / "io.nested.pt");
  const c10::impl::GenericDict top = nested.value.toGenericDict();
  EXPECT_EQ(top.at("epoch").toInt(), 3);
  EXPECT_TRUE(top.at("args").isNone()) << "an argparse.Namespace is no plain value";
  EXPECT_EQ(nested.opaque_types, (std::vector<std::string>{"argparse.Namespace"}));
  EXPECT_FLOAT_EQ(top.at("best_acc1").toTensor().item<float>(), 55.5f);
  const auto group = top.at("optimizer").toGenericDict().at("param_groups").toList().get(0).toGenericDict();
  EXPECT_DOUBLE_EQ(group.at("lr").toDouble(), 0.1);
  EXPECT_DOUBLE_EQ(group.at("momentum").toDouble(), 0.9);
  EXPECT_EQ(group.at("params").toList().size(), m->parameters().size());
  const std::string e = inputErrorOf(d / "io.legacy.pt");
  EXPECT_TRUE(contains(e, "legacy (pre-1.6, non-zip) format")) << e;
  EXPECT_FALSE(contains(e, "\n")) << e;
}

INSTANTIATE_TEST_SUITE_P(Archs, TorchvisionLoads, ::testing::Values("resnet18", "resnet50"));

}  // namespace
}  // namespace aiacc::models
