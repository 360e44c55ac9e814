// ResNet-18/34/50/101 v1.5 with torchvision's parameter names, shapes and initialization, so
// state moves between the two by name (see models/weights.h). v1.5: in a bottleneck block the
// stride sits in the 3x3 convolution, not the first 1x1.
//
// resnet50, 1000 classes: 25,557,032 parameters; resnet18: 11,689,512.
// Each arch also comes narrowed: "resnet18-w16" is resnet18 with 16, 32, 64 and 128 channels in
// its stages instead of 64 to 512 (-w8, -w16, -w32), for runs where the model is not the subject
// (smoke tests, the process tests): 1/16 of the parameters at -w16, and about 1/16 of the work.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <string>

namespace aiacc::models {

struct ResNetOptions {
  std::string arch = "resnet50";  // resnet18 | resnet34 | resnet50 | resnet101, each optionally -w8|-w16|-w32
  int64_t num_classes = 1000;
  // Start each residual block as the identity: the last BN's gamma in every block is zero
  // (Goyal et al., "ImageNet in 1 hour"; torchvision's zero_init_residual).
  bool zero_init_residual = false;
};

class BasicBlockImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride, bool downsample);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::BatchNorm2d lastBn() { return bn2; }

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

class BottleneckImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride, bool downsample);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::BatchNorm2d lastBn() { return bn3; }

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const ResNetOptions& options);
  torch::Tensor forward(torch::Tensor x);
  const ResNetOptions& options() const { return options_; }

 private:
  template <typename Block>
  torch::nn::Sequential makeLayer(int64_t planes, int64_t blocks, int64_t stride);

  ResNetOptions options_;
  int64_t inplanes_ = 64;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

// Throws InputError (naming --arch and the accepted names) unless `arch` names a ResNet of this
// file (ResNetOptions::arch).
void requireResNetArch(const std::string& arch);

// Number of parameters (elements), as torchvision counts them (buffers excluded).
int64_t parameterCount(const torch::nn::Module& module);

}  // namespace aiacc::models
