#include "data/device_input.h"

#include "data/transforms.h"

namespace aiacc::data {
namespace {

// Per-channel scale and shift as [1, 3, 1, 1] on `device`: x * scale + shift, exactly the
// constants resizeNormalize uses.
std::pair<at::Tensor, at::Tensor> normalizeConstants(at::Device device) {
  thread_local at::Device cached_on = at::kCPU;
  thread_local at::Tensor scale, shift;
  if (!scale.defined() || cached_on != device) {
    float sc[3], sh[3];
    for (int c = 0; c < 3; ++c) {
      sc[c] = 1.0f / (255.0f * kStd[c]);
      sh[c] = -kMean[c] / kStd[c];
    }
    // clone(): from_blob borrows the stack arrays, and to() of a CPU tensor to the CPU is no copy.
    scale = at::from_blob(sc, {1, 3, 1, 1}, at::kFloat).clone().to(device);
    shift = at::from_blob(sh, {1, 3, 1, 1}, at::kFloat).clone().to(device);
    cached_on = device;
  }
  return {scale, shift};
}

}  // namespace

at::Tensor imagesOnDevice(const at::Tensor& images, at::Device device, bool channels_last) {
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  at::Tensor x = images.to(device, /*non_blocking=*/true);
  if (x.scalar_type() == at::kByte) {
    auto [scale, shift] = normalizeConstants(device);
    x = x.to(at::kFloat).mul_(scale).add_(shift);
  }
  return x.contiguous(format);
}

at::Tensor labelsOnDevice(const at::Tensor& labels, at::Device device) {
  return labels.to(device, /*non_blocking=*/true);
}

}  // namespace aiacc::data
