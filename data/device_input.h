// The last step of the input pipeline, on the training device: a loader batch is copied there
// (asynchronously from pinned memory) and, when the loader delivered bytes (LoaderOptions::bytes),
// converted to float and normalized there. On a GPU that moves a quarter of the bytes across
// PCIe and takes the normalization off the decode threads. The result is the same, value for
// value, as the loader's own float output (same constants, same two roundings).
#pragma once

#include <ATen/ATen.h>

namespace aiacc::data {

// images: a Batch's images (float normalized, or uint8 with channels-last strides). Returns
// [B, 3, S, S] float32 on `device`, channels-last strides when channels_last, else contiguous.
at::Tensor imagesOnDevice(const at::Tensor& images, at::Device device, bool channels_last);

// labels on `device` (asynchronous from pinned memory).
at::Tensor labelsOnDevice(const at::Tensor& labels, at::Device device);

}  // namespace aiacc::data
