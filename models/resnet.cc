#include "models/resnet.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>

#include <optional>

#include "aiacc/common/error.h"
#include "aiacc/common/torch_compat.h"

namespace aiacc::models {
namespace F = torch::nn::functional;
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false));
}

torch::nn::Sequential makeDownsample(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Sequential(conv(in, out, 1, stride, 0), torch::nn::BatchNorm2d(out));
}

struct NetShape {
  bool bottleneck;
  int64_t blocks[4];
  int64_t width;  // the first stage's channels (the stem's too); each later stage doubles them
};

constexpr int64_t kWidths[] = {8, 16, 32};  // the narrow forms' -wN; 64 is the plain name's

// The shape an --arch name stands for; nullopt for a name that is not one.
std::optional<NetShape> shapeOf(const std::string& arch) {
  std::string depth = arch;
  int64_t width = 64;
  for (const int64_t w : kWidths) {
    const std::string suffix = "-w" + std::to_string(w);
    if (arch.size() > suffix.size() && arch.compare(arch.size() - suffix.size(), suffix.size(), suffix) == 0) {
      depth = arch.substr(0, arch.size() - suffix.size());
      width = w;
    }
  }
  if (depth == "resnet18") return NetShape{false, {2, 2, 2, 2}, width};
  if (depth == "resnet34") return NetShape{false, {3, 4, 6, 3}, width};
  if (depth == "resnet50") return NetShape{true, {3, 4, 6, 3}, width};
  if (depth == "resnet101") return NetShape{true, {3, 4, 23, 3}, width};
  return std::nullopt;
}

NetShape shapeFor(const std::string& arch) {
  const std::optional<NetShape> shape = shapeOf(arch);
  AIACC_CHECK_INPUT(shape.has_value(), "unknown --arch '", arch,
                    "' (choose resnet18, resnet34, resnet50 or resnet101, optionally narrowed by -w8, -w16 or -w32)");
  return *shape;
}

// A block's strided 3x3 convolution. On a 1x1 input (layer4's first block at 16 px, the smallest
// --image-size) it runs in fp32 under CPU autocast: LibTorch's oneDNN bf16 convolution backward
// gets this case wrong (and 2x1, which aiacc's square images never give). The weight gradient of the taps that meet
// only padding, exactly 0 in fp32, comes back as garbage that depends on what the heap held, often inf or NaN, which
// the next forward turns into a NaN loss (0 x NaN at the padding). Seen with LibTorch 1.13 (oneDNN 2.6.3) and 2.11
// (oneDNN 3.10.2), AMX and AVX512-BF16 kernels alike; scripts/repro_onednn_bf16_conv.py shows it outside aiacc (issue
// 26). fp32 is right there in both, and costs nothing: the input is a few hundred values per image.
struct CpuAutocastOff {
  CpuAutocastOff() { compat::setAutocastEnabled(at::kCPU, false); }
  ~CpuAutocastOff() { compat::setAutocastEnabled(at::kCPU, true); }
  CpuAutocastOff(const CpuAutocastOff&) = delete;
  CpuAutocastOff& operator=(const CpuAutocastOff&) = delete;
};

torch::Tensor strided3x3(torch::nn::Conv2d& conv, const torch::Tensor& x) {
  if (conv->options.stride()->at(0) > 1 && x.size(2) == 1 && x.size(3) == 1 && x.is_cpu() &&
      compat::autocastEnabled(at::kCPU)) {
    CpuAutocastOff fp32;
    return conv(x.to(at::kFloat));
  }
  return conv(x);
}

}  // namespace

void requireResNetArch(const std::string& arch) { shapeFor(arch); }

BasicBlockImpl::BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride, bool ds) {
  conv1 = register_module("conv1", conv(inplanes, planes, 3, stride, 1));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv(planes, planes, 3, 1, 1));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
  if (ds) downsample = register_module("downsample", makeDownsample(inplanes, planes, stride));
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor out = F::relu(bn1(strided3x3(conv1, x)), F::ReLUFuncOptions().inplace(true));
  out = bn2(conv2(out));
  out += downsample ? downsample->forward(x) : x;
  return F::relu(out, F::ReLUFuncOptions().inplace(true));
}

BottleneckImpl::BottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride, bool ds) {
  conv1 = register_module("conv1", conv(inplanes, planes, 1, 1, 0));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv(planes, planes, 3, stride, 1));  // v1.5: stride here
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
  conv3 = register_module("conv3", conv(planes, planes * kExpansion, 1, 1, 0));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(planes * kExpansion));
  if (ds) downsample = register_module("downsample", makeDownsample(inplanes, planes * kExpansion, stride));
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  const auto relu = F::ReLUFuncOptions().inplace(true);
  torch::Tensor out = F::relu(bn1(conv1(x)), relu);
  out = F::relu(bn2(strided3x3(conv2, out)), relu);
  out = bn3(conv3(out));
  out += downsample ? downsample->forward(x) : x;
  return F::relu(out, relu);
}

template <typename Block>
torch::nn::Sequential ResNetImpl::makeLayer(int64_t planes, int64_t blocks, int64_t stride) {
  torch::nn::Sequential layer;
  const bool ds = stride != 1 || inplanes_ != planes * Block::Impl::kExpansion;
  layer->push_back(Block(inplanes_, planes, stride, ds));
  inplanes_ = planes * Block::Impl::kExpansion;
  for (int64_t i = 1; i < blocks; ++i) layer->push_back(Block(inplanes_, planes, 1, false));
  return layer;
}

ResNetImpl::ResNetImpl(const ResNetOptions& options) : options_(options) {
  const NetShape d = shapeFor(options.arch);
  AIACC_CHECK_INPUT(options.num_classes >= 1, "number of classes must be positive");
  inplanes_ = d.width;
  conv1 = register_module("conv1", conv(3, d.width, 7, 2, 3));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(d.width));
  const int64_t planes[4] = {d.width, 2 * d.width, 4 * d.width, 8 * d.width};
  const int64_t strides[4] = {1, 2, 2, 2};
  torch::nn::Sequential* layers[4] = {&layer1, &layer2, &layer3, &layer4};
  for (int i = 0; i < 4; ++i) {
    *layers[i] = d.bottleneck ? makeLayer<Bottleneck>(planes[i], d.blocks[i], strides[i])
                              : makeLayer<BasicBlock>(planes[i], d.blocks[i], strides[i]);
    register_module("layer" + std::to_string(i + 1), *layers[i]);
  }
  fc = register_module("fc", torch::nn::Linear(inplanes_, options.num_classes));

  // torchvision's initialization: Kaiming-normal (fan_out, relu) convolutions, BN gamma 1 and
  // beta 0; the Linear keeps its default (the same in LibTorch and PyTorch).
  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* c = m->as<torch::nn::Conv2dImpl>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = m->as<torch::nn::BatchNorm2dImpl>()) {
      torch::nn::init::ones_(bn->weight);
      torch::nn::init::zeros_(bn->bias);
    }
  }
  if (options.zero_init_residual) {
    for (auto& m : modules(false)) {
      if (auto* b = m->as<BasicBlockImpl>()) torch::nn::init::zeros_(b->lastBn()->weight);
      if (auto* b = m->as<BottleneckImpl>()) torch::nn::init::zeros_(b->lastBn()->weight);
    }
  }
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  x = F::relu(bn1(conv1(x)), F::ReLUFuncOptions().inplace(true));
  x = F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
  x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
  return fc(x);
}

int64_t parameterCount(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace aiacc::models
